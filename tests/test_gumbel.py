"""Sampling with noise fixed by the seed and the position (``algorithms/gumbel.py``): each committed
token is an exact sample of the target's distribution, and a seeded answer does not depend on the
draft. Table models (``test_slem.TableModel``): eight real tokens whose exact distributions are known,
the same tokens at every position, so that noise shared between positions would show."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from test_sampling import chi_square_pvalue
from test_slem import DRAFT_AS_TARGET, DRAFT_TOKENS, TARGET_TOKENS, TableModel
from tiny_models import one_thread  # noqa: F401  (autouse fixture)

from anyspec.algorithms import gumbel, tli
from anyspec.algorithms.sampling import logits_to_probs
from anyspec.engine import Engine, SamplingParams, SpeculativeConfig

SETTINGS = {"T=0.7, top-p 0.9": dict(temperature=0.7, top_p=0.9), "T=1.0, top-p 0.9": dict(temperature=1.0,
                                                                                             top_p=0.9)}


def pair(tok_llama2, tok_smollm2):
    """A target and a draft that imitates it (plus noise), so that rounds often accept tokens."""
    target = TableModel(tok_llama2, TARGET_TOKENS, seed=0)
    draft = TableModel(tok_smollm2, DRAFT_TOKENS, seed=1)
    context = torch.tensor(DRAFT_AS_TARGET + [len(TARGET_TOKENS)])
    imitation = target.table[context][:, context][:, :, DRAFT_AS_TARGET]
    draft.table = imitation + 0.5 * torch.randn(imitation.shape, generator=torch.Generator().manual_seed(1))
    return target, draft


def two_tokens(engine: Engine, target: TableModel, runs: int, settings: dict) -> tuple[torch.Tensor, int]:
    """Counts of the first two committed tokens over ``runs`` seeds, and the rounds that accepted."""
    s = len(TARGET_TOKENS)
    counts, accepted = torch.zeros(s * s), 0
    for seed in range(runs):
        got = engine.generate("def f(x):", SamplingParams(max_new_tokens=2, seed=seed, **settings))
        a, b = (target.bucket[t] for t in got.token_ids[:2])
        counts[a * s + b] += 1
        accepted += got.stats.accepted > 0
    return counts, accepted


def exact_joint(target: TableModel, settings: dict) -> torch.Tensor:
    p = lambda prev, last: logits_to_probs(target.row(prev, last), **settings)  # noqa: E731
    prompt = target.tokenizer.encode("def f(x):")
    first = p(prompt[-2], prompt[-1])
    return torch.stack([first[a] * p(prompt[-1], t) for a, t in enumerate(target.support)]).reshape(-1)


def noise(seed: int, position: int, size: int, stream: int = 0) -> np.ndarray:
    """Entries 0 .. size - 1 of a position's noise, each computed as the docstring defines it."""
    return np.array([gumbel.value(int(k)) for k in gumbel.bits(gumbel.key(seed, position, stream),
                                                                np.arange(size))])


def first_largest(row: np.ndarray, values: np.ndarray) -> int:
    """A choice by its definition: the first largest float64 ``row + noise`` (0 when nothing is finite)."""
    return int(np.argmax(row.astype(np.float64) + values))


def kernel_choose():
    from anyspec.backends.linear import rowwise_problem
    from anyspec.engine.sampler import chooser

    if rowwise_problem():
        pytest.skip(rowwise_problem())
    return chooser()


CHOOSERS = {"numpy": lambda: gumbel.choose, "kernel": kernel_choose}


def test_the_noise_is_standard_gumbel_and_independent_across_positions_and_seeds():
    g = np.concatenate([noise(seed, 0, 50_000) for seed in range(4)])
    assert abs(g.mean() - 0.5772) < 0.01 and abs(g.var() - math.pi ** 2 / 6) < 0.03
    u = np.exp(-np.exp(-g))  # back to uniform: each tenth of (0, 1) holds a tenth
    assert np.abs(np.histogram(u, 10, (0, 1))[0] / len(u) - 0.1).max() < 0.005
    a, b, c = noise(7, 0, 100_000), noise(7, 1, 100_000), noise(8, 0, 100_000)
    for x, y in ((a, b), (a, c)):
        assert abs(np.corrcoef(np.stack([x, y]))[0, 1]) < 0.015
    assert np.array_equal(noise(7, 1, 10), b[:10]), "an entry does not depend on the size asked for"
    assert g.max() <= gumbel.CEILING


def rows_of_every_kind(vocab: int, seed: int) -> torch.Tensor:
    """Logits / T as sampling leaves them: flat, peaked, wide, few finite, one finite (the last), none."""
    g = torch.Generator().manual_seed(seed)
    rows = [torch.zeros(vocab), torch.randn(vocab, generator=g) * 0.01]
    rows += [torch.randn(vocab, generator=g) * scale for scale in (1.0, 4.0, 30.0, 300.0)]
    few = torch.full((vocab,), -math.inf)
    n = min(40, vocab // 2)
    few[torch.randperm(vocab, generator=g)[:n]] = torch.randn(n, generator=g)
    last, none = torch.full((vocab,), -math.inf), torch.full((vocab,), -math.inf)
    last[-1] = 2.0
    return torch.stack([*rows, few, last, none])


@pytest.mark.parametrize("how", list(CHOOSERS))
def test_a_choice_is_the_first_largest_logit_plus_its_noise(how):
    """Computing the logarithms of the entries whose bound reaches the best alone, as both ways do,
    picks what every entry's noise picks: the vocabulary of the target and of smaller models."""
    choose = CHOOSERS[how]()
    for vocab, seed in ((151_936, 0), (4_096, 1), (7, 2)):
        rows = rows_of_every_kind(vocab, seed)
        want = [first_largest(row.numpy(), noise(seed, p, vocab)) for p, row in enumerate(rows)]
        assert choose(rows, [gumbel.key(seed, p) for p in range(len(rows))]) == want
        assert want[-2] == vocab - 1 and want[-1] == 0


def test_the_kernel_chooses_the_same_at_every_instruction_set_level():
    """AVX-512 hashes and bounds 8 entries at a time (with DQ and CD), the other levels one by one."""
    from anyspec.backends.linear import rowwise_kernel

    choose, kernel = kernel_choose(), rowwise_kernel()
    rows = rows_of_every_kind(151_936, 4)
    want = [first_largest(row.numpy(), noise(4, p, 151_936)) for p, row in enumerate(rows)]
    before = kernel.isa()
    try:
        for level in range(kernel.cpu_isa() + 1):
            kernel.set_isa(level)
            assert choose(rows, [gumbel.key(4, p) for p in range(len(rows))]) == want, level
    finally:
        kernel.set_isa(before)


@pytest.mark.parametrize("how", list(CHOOSERS))
def test_the_drafts_choice_reads_its_twins_target_noise(how):
    """A draft token with a target twin takes the twin's entry of the target's noise; the others the
    draft's own stream. Two tokens with one twin and equal logits tie exactly: the first is chosen."""
    choose = CHOOSERS[how]()
    rng = np.random.default_rng(1)
    twins = np.full(5_000, -1, np.int64)
    shared = rng.choice(5_000, 3_000, replace=False)
    twins[shared] = rng.choice(20_000, 3_000, replace=False)
    rows = rows_of_every_kind(5_000, 3)
    for p, row in enumerate(rows):
        coupled = noise(9, p, 5_000, stream=1)
        coupled[shared] = noise(9, p, 20_000)[twins[shared]]
        got = choose(row[None], [gumbel.key(9, p, 1)], twins, [gumbel.key(9, p)])
        assert got == [first_largest(row.numpy(), coupled)]
    twins[[10, 20]] = 7
    tie = torch.full((1, 5_000), -math.inf)
    tie[0, [10, 20]] = 1.0
    assert choose(tie, [1], twins, [2]) == [10]


def test_a_bound_below_the_noise_is_caught(monkeypatch):
    """Negative control: with each bound 0.7 below what it bounds, entries that could win are never
    computed, and some choices differ from the definition's."""
    bound = gumbel.bound
    monkeypatch.setattr(gumbel, "bound", lambda k: bound(k) - 0.7)
    rows = rows_of_every_kind(4_096, 1)
    want = [first_largest(row.numpy(), noise(1, p, 4_096)) for p, row in enumerate(rows)]
    assert gumbel.choose(rows, [gumbel.key(1, p) for p in range(len(rows))]) != want


@pytest.mark.parametrize("algorithm", ["none", "tli", "slem"])
@pytest.mark.parametrize("name", list(SETTINGS))
def test_committed_tokens_are_the_targets_distribution(tok_llama2, tok_smollm2, algorithm, name):
    target, draft = pair(tok_llama2, tok_smollm2)
    engine = Engine(target, None if algorithm == "none" else draft,
                    SpeculativeConfig(algorithm="auto" if algorithm == "none" else algorithm,
                                      num_speculative_tokens=3, draft_confidence=0.0))
    counts, accepted = two_tokens(engine, target, 1500, SETTINGS[name])
    assert chi_square_pvalue(counts, exact_joint(target, SETTINGS[name])) > 1e-3
    assert algorithm == "none" or accepted > 300, "the draft should agree with the target often"


def test_noise_reused_across_positions_is_caught(tok_llama2, tok_smollm2, monkeypatch):
    """Negative control: the same run with each position's noise the first position's."""
    key = gumbel.key
    monkeypatch.setattr(gumbel, "key", lambda seed, position, stream=0: key(seed, 0, stream))
    target, draft = pair(tok_llama2, tok_smollm2)
    engine = Engine(target, draft, SpeculativeConfig(algorithm="slem", num_speculative_tokens=3))
    counts, _ = two_tokens(engine, target, 1500, SETTINGS["T=1.0, top-p 0.9"])
    assert chi_square_pvalue(counts, exact_joint(target, SETTINGS["T=1.0, top-p 0.9"])) < 1e-6


def test_a_verifier_that_lets_the_drafts_choice_through_is_caught(tok_llama2, tok_smollm2, monkeypatch):
    """Negative control: a verify that keeps the first proposed token whatever the target chose."""
    exact = tli.verify_exact

    def leaky(choice, proposed):
        n, token = exact(choice, proposed)
        return (1, choice[1] if len(choice) > 1 else token) if proposed and n == 0 else (n, token)

    monkeypatch.setattr(tli, "verify_exact", leaky)
    target, draft = pair(tok_llama2, tok_smollm2)
    draft.table = torch.randn(draft.table.shape, generator=torch.Generator().manual_seed(5))  # disagrees
    engine = Engine(target, draft, SpeculativeConfig(algorithm="slem", num_speculative_tokens=3))
    plain = dict(temperature=1.0)  # no token at probability 0, which chi_square_pvalue refuses outright
    counts, _ = two_tokens(engine, target, 1500, plain)
    assert chi_square_pvalue(counts, exact_joint(target, plain)) < 1e-6


@pytest.mark.parametrize("k", [1, 5, 8])
@pytest.mark.parametrize("algorithm", ["tli", "slem"])
def test_a_seeded_answer_is_the_target_alones_whatever_the_draft(tok_llama2, tok_smollm2, algorithm, k):
    target, draft = pair(tok_llama2, tok_smollm2)
    alone = Engine(target, None)
    spec = Engine(target, draft, SpeculativeConfig(algorithm=algorithm, num_speculative_tokens=k))
    other = Engine(target, TableModel(tok_smollm2, DRAFT_TOKENS, seed=9),  # a draft that disagrees
                   SpeculativeConfig(algorithm=algorithm, num_speculative_tokens=k))
    for seed in range(12):
        params = SamplingParams(temperature=1.0, top_p=0.9, max_new_tokens=12, seed=seed)
        want = alone.generate("def f(x):", params)
        assert want.stats.seed == seed
        for engine in (spec, other):
            got = engine.generate("def f(x):", params)
            assert got.token_ids == want.token_ids and got.stats.seed == seed


def test_a_request_without_a_seed_reports_the_one_that_reproduces_it(tok_llama2, tok_smollm2):
    target, draft = pair(tok_llama2, tok_smollm2)
    engine = Engine(target, draft, SpeculativeConfig(num_speculative_tokens=3))
    first = engine.generate("def f(x):", SamplingParams(temperature=1.0, max_new_tokens=12))
    again = Engine(target, None).generate("def f(x):", SamplingParams(temperature=1.0, max_new_tokens=12,
                                                                      seed=first.stats.seed))
    assert first.stats.seed is not None and again.token_ids == first.token_ids
    assert Engine(target, None).generate("def f(x):", SamplingParams(max_new_tokens=2)).stats.seed is None
