"""The kernel's attention: rows attended together are the bits of each row attended alone, and an
fp16 KV cache is the fp32 arithmetic on its rounded keys and values.

Query rows of one sequence are scored and summed together over the keys they share
(``attend_rows``, ``csrc/decoder.cpp``), in blocks whose edges fall anywhere: at a thread's
share of the tasks, at the end of the rows, and where the shared keys end (a multiple of 8 for
the scores, of 64 for the sums). Each row must still be what it is alone, at any length.
"""

from __future__ import annotations

import pytest
import torch
from test_gguf import kernel, smollm2  # noqa: F401 (smollm2: a fixture)

from anyspec.config import SamplingParams, SpeculativeConfig

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


@pytest.mark.parametrize("heads,kv_heads,d", SHAPES)
def test_an_fp16_cache_is_the_fp32_arithmetic_on_its_rounded_values(heads, kv_heads, d):
    lib = kernel()
    g = torch.Generator().manual_seed(d)
    q = torch.randn(heads, 37, d, generator=g) * 2
    key, value = torch.randn(kv_heads, 300, d, generator=g) * 2, torch.randn(kv_heads, 300, d, generator=g)
    half = lib.attention(q, key.half(), value.half(), d ** -0.5)
    assert torch.equal(half, lib.attention(q, key.half().float(), value.half().float(), d ** -0.5))
    assert not torch.equal(half, lib.attention(q, key, value, d ** -0.5))  # they were rounded
    assert torch.equal(half, rows_alone(lib, q, key.half(), value.half(), d ** -0.5))


PROMPT = ("def merge_sorted(a, b):\n    out, i, j = [], 0, 0\n    while i < len(a) and j < len(b):\n"
          "        if a[i] <= b[j]:\n            out.append(a[i]); i += 1\n        else:\n"
          "            out.append(b[j]); j += 1\n    return out + a[i:] + b[j:]\n\n" * 4)


@pytest.mark.slow
def test_a_model_on_an_fp16_cache_keeps_its_rows_alone_and_the_target_alone(smollm2):  # noqa: F811
    """SmolLM2 on an fp16 cache: the first layer's keys and values are its fp32 cache's, rounded as
    torch rounds them; rows together are the bits of rows alone; its logits stay near the fp32
    cache's; and speculating on it (prompt lookup) gives the greedy answer of the target alone on it."""
    from anyspec.engine import Engine

    ids = smollm2.tokenizer.encode(PROMPT)
    assert len(ids) > 150
    smollm2.reset()
    fp32 = smollm2.extend(ids)
    first = smollm2.own.cache.keys[0][:, :len(ids)].clone(), smollm2.own.cache.values[0][:, :len(ids)].clone()
    try:
        smollm2.use_kv_dtype(torch.float16)
        together = smollm2.extend(ids)
        cache = smollm2.own.cache
        assert cache.keys[0].dtype == cache.values[-1].dtype == torch.float16
        assert torch.equal(cache.keys[0][:, :len(ids)], first[0].half())
        assert torch.equal(cache.values[0][:, :len(ids)], first[1].half())
        smollm2.crop(len(ids) - 7)
        alone = torch.cat([smollm2.extend([i]) for i in ids[-7:]])
        assert torch.equal(together[-7:], alone)
        assert not torch.equal(together, fp32)
        assert (together - fp32).abs().max() < 0.05 * fp32.abs().max()
        # where the best token differs, the fp32 cache's two best were a near-tie
        top = fp32.topk(2, -1).values
        parted = together.argmax(-1) != fp32.argmax(-1)
        print(f"best tokens parted at {int(parted.sum())} of {len(ids)} positions, fp32 margins "
              f"{(top[parted, 0] - top[parted, 1]).tolist()}")
        assert parted.sum() <= 2 and (top[parted, 0] - top[parted, 1] < 0.3).all()
        params = SamplingParams(max_new_tokens=40, temperature=0.0)
        alone = Engine(smollm2, None).generate(PROMPT, params).token_ids
        looked_up = Engine(smollm2, None, SpeculativeConfig(ngram=2)).generate(PROMPT, params)
        assert looked_up.stats.ngram_accepted > 10 and looked_up.token_ids == alone
    finally:
        smollm2.use_kv_dtype(torch.float32)
