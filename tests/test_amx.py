"""The AMX level of the quantized products (csrc/x16_amx.h), on any CPU through the plain C++
stand-in for the tile instructions (csrc/tiles.h), and on the CPU's own tiles where it has them.

The tiles sum the integers of each block in another order than the vector levels, which changes
nothing since integers are exact; the float steps after the sums run in the vector levels' order,
so every output must be the same bits, at any number of rows and on either side of the row count
from which a pass takes the tiles.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_gguf import TYPES, kernel, random_blocks, smollm2, stored  # noqa: F401 (smollm2: a fixture)

from anyspec.backends.linear import rowwise_possible

pytestmark = pytest.mark.skipif(not rowwise_possible(), reason="x86 without AVX2, or ANYSPEC_KERNELS=0")


@pytest.fixture(params=["stand-in", "cpu"])
def lib(request):
    """The kernel with level 3 on the stand-in, or on the CPU's tiles where it has them; its level,
    stand-in and threshold restored after."""
    lib = kernel()
    if request.param == "cpu" and not lib.amx_hw_usable():
        pytest.skip("this CPU or OS gives no AMX tiles (amx_int8)")
    level, rows = lib.isa(), lib.amx_rows()
    lib.set_amx_standin(request.param == "stand-in")
    try:
        yield lib
    finally:
        lib.set_amx_standin(False)
        lib.set_amx_rows(rows)
        lib.set_isa(level)


def tile_product_reference(a, b, c, rows, depth, cols, a_signed):
    """C += A . B in wrapping int32, as the SDM defines tdpbssd (a_signed) and tdpbusd."""
    A = (a.view(np.int8) if a_signed else a)[:rows, :depth].astype(np.int64)
    B = b.view(np.int8)[:depth // 4, :4 * cols].reshape(depth // 4, cols, 4).transpose(0, 2, 1)
    out = c.astype(np.int64)
    out[:rows, :cols] += A @ B.reshape(depth, cols).astype(np.int64)
    return ((out + 2**31) % 2**32 - 2**31).astype(np.int32)


@pytest.mark.parametrize("hw", [False, True], ids=["stand-in", "cpu"])
def test_a_tile_product_is_the_instructions_arithmetic(hw):
    """Rows and bytes outside the configured shape are neither read nor written; bytes of A are
    unsigned for tdpbusd; sums wrap at 32 bits."""
    lib = kernel()
    if hw and not lib.amx_hw_usable():
        pytest.skip("this CPU or OS gives no AMX tiles (amx_int8)")
    rng = np.random.default_rng(0)
    shapes = ((16, 64, 16, True), (16, 64, 16, False), (7, 32, 16, True), (3, 12, 5, False), (1, 4, 1, True))
    for rows, depth, cols, a_signed in shapes:
        a = rng.integers(0, 256, (16, 64), dtype=np.uint8)
        b = rng.integers(0, 256, (16, 64), dtype=np.uint8)
        c = rng.integers(-2**31, 2**31, (16, 16), dtype=np.int64).astype(np.int32)
        c[0, 0], c[0, 1] = 2**31 - 1, -2**31  # past the int32 range both ways
        a[0, :4], b[:4, 0], b[:4, 4] = 255, 127, 128
        got = lib.tile_product(*map(torch.from_numpy, (a, b, c)), rows, depth, cols, a_signed, hw)
        want = tile_product_reference(a, b, c, rows, depth, cols, a_signed)
        np.testing.assert_array_equal(got.numpy(), want)


def products(lib, kind, level, x, rows, n, k, seed=11):
    raw = random_blocks(kind, n, k, seed=seed)
    data, code = stored(kind, raw, k)
    bias = torch.randn(n, generator=torch.Generator().manual_seed(seed))
    lib.set_isa(level)
    assert lib.isa() == level
    return [lib.typed_linear(x[:m], data, code, k, None, bias)[:, :n] for m in rows] + [
        lib.typed_linear(x[:rows[-1]], data, code, k, None, None)[:, :n]]


def activations(rows: int, k: int) -> torch.Tensor:
    """Rows of different sizes, so that their scales differ by orders of magnitude."""
    x = torch.randn(rows, k, generator=torch.Generator().manual_seed(12))
    return x * torch.logspace(-2, 2, rows).unsqueeze(1)


@pytest.mark.parametrize("kind", TYPES, ids=lambda t: t.name)
def test_the_tiles_give_the_bits_of_the_vector_level(kind, lib):
    """Every row count on the tiles (threshold 1): 150 outputs are 10 groups, the last padded, split
    over the threads, so each thread loads its own tile configuration."""
    k, n, rows = 512, 150, (1, 7, 16, 33, 64)
    x = activations(64, k)
    vector = products(lib, kind, lib.cpu_isa(), x, rows, n, k)
    lib.set_amx_rows(1)
    tiles = products(lib, kind, 3, x, rows, n, k)
    for m, want, got in zip(rows + (64,), vector, tiles, strict=True):
        assert torch.equal(got, want), f"{m} rows"
    for m, got in zip(rows, tiles[:-1], strict=True):
        assert torch.equal(got, vector[-2][:m])  # and each row the bits it has among 64


@pytest.mark.parametrize("kind", TYPES, ids=lambda t: t.name)
def test_a_pass_across_the_threshold_changes_no_bits(kind, lib):
    """With the tiles from 8 rows, 7 rows take the vector level and 8 or 9 the tiles: the rows they
    share are the same bits."""
    k, n = 256, 40
    lib.set_amx_rows(8)
    x = activations(9, k)
    below, at, above, _ = products(lib, kind, 3, x, (7, 8, 9), n, k)
    assert torch.equal(at[:7], below) and torch.equal(above[:8], at)


@pytest.mark.slow
def test_a_forward_across_the_threshold_gives_each_row_the_bits_it_has_alone(smollm2, lib):  # noqa: F811
    """SmolLM2-135M, every product on the tiles from 4 rows: 6 new rows of one pass take
    the tiles, and each of them is the bits of that row computed alone at the vector level."""
    ids = smollm2.tokenizer.encode("def fibonacci(n):\n    if n < 2:\n        return n\n    return fib")
    lib.set_amx_rows(4)
    try:
        lib.set_isa(3)
        smollm2.reset()
        smollm2.extend(ids[:-6])
        together = smollm2.extend(ids[-6:])
        lib.set_isa(lib.cpu_isa())
        smollm2.crop(len(ids) - 6)
        alone = torch.cat([smollm2.extend([i]) for i in ids[-6:]])
    finally:
        smollm2.reset()
    assert torch.equal(together, alone)
