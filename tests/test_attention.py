"""The kernel's attention: rows attended together are the bits of each row attended alone.

Query rows of one sequence are scored and summed together over the keys they share
(``attend_rows``, ``csrc/decoder.cpp``), in blocks whose edges fall anywhere: at a thread's
share of the tasks, at the end of the rows, and where the shared keys end (a multiple of 8 for
the scores, of 64 for the sums). Each row must still be what it is alone, at any length.
"""

from __future__ import annotations

import pytest
import torch
from test_gguf import kernel

SHAPES = [(12, 2, 128), (4, 4, 80), (6, 3, 13)]  # heads, key-value heads, head size


def rows_alone(lib, q, key, value, scaling):
    """Row m of M on the keys up to its own position, one call each."""
    M, L = q.shape[1], key.shape[1]
    return torch.cat([lib.attention(q[:, m:m + 1], key[:, :L - M + m + 1], value[:, :L - M + m + 1], scaling)
                      for m in range(M)])


@pytest.mark.parametrize("heads,kv_heads,d", SHAPES)
@pytest.mark.parametrize("rows,length", [(2, 2), (5, 70), (9, 129), (37, 300)])
def test_rows_together_are_the_bits_of_each_row_alone(heads, kv_heads, d, rows, length):
    lib = kernel()
    g = torch.Generator().manual_seed(rows * length + d)
    q = torch.randn(heads, rows, d, generator=g) * 2
    key = torch.randn(kv_heads, length, d, generator=g) * 2
    value = torch.randn(kv_heads, length, d, generator=g)
    together = lib.attention(q, key, value, d ** -0.5)
    assert torch.equal(together, rows_alone(lib, q, key, value, d ** -0.5))
    # and it is attention: softmax(q k / sqrt(d)) v over each row's keys, in float64
    group = heads // kv_heads
    k64, v64 = key.double().repeat_interleave(group, 0), value.double().repeat_interleave(group, 0)
    s = q.double() @ k64.transpose(1, 2) * d ** -0.5
    s = s.masked_fill(torch.ones(rows, length, dtype=torch.bool).triu(length - rows + 1), float("-inf"))
    want = (s.softmax(-1) @ v64).transpose(0, 1)
    torch.testing.assert_close(together.double(), want, rtol=1e-4, atol=1e-5)


def test_rows_of_one_thread_and_of_two_are_the_same_bits():
    lib = kernel()
    g = torch.Generator().manual_seed(3)
    q = torch.randn(12, 23, 64, generator=g)
    key, value = torch.randn(2, 200, 64, generator=g), torch.randn(2, 200, 64, generator=g)
    threads = torch.get_num_threads()
    try:
        runs = []
        for n in (1, 2):
            torch.set_num_threads(n)
            runs.append(lib.attention(q, key, value, 0.125))
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(runs[0], runs[1])
