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


def test_the_noise_is_standard_gumbel_and_independent_across_positions_and_seeds():
    g = torch.cat([gumbel.noise(seed, 0, 50_000) for seed in range(4)])
    assert abs(float(g.mean()) - 0.5772) < 0.01 and abs(float(g.var()) - math.pi ** 2 / 6) < 0.03
    u = torch.exp(-torch.exp(-g))  # back to uniform: each tenth of (0, 1) holds a tenth
    assert float((torch.histc(u.float(), 10, 0, 1) / len(u) - 0.1).abs().max()) < 0.005
    a, b, c = gumbel.noise(7, 0, 100_000), gumbel.noise(7, 1, 100_000), gumbel.noise(8, 0, 100_000)
    for x, y in ((a, b), (a, c)):
        assert abs(float(torch.corrcoef(torch.stack([x, y]))[0, 1])) < 0.015
    assert torch.equal(gumbel.noise(7, 1, 10), b[:10]), "an entry does not depend on the size asked for"


@pytest.mark.parametrize("stream", [0, 1])
def test_the_noise_of_some_entries_is_those_entries_of_the_whole(stream):
    whole = gumbel.noise(11, 5, 151_936, stream)
    rng = np.random.default_rng(0)
    for size in (1, 7, 300, 9_000):
        ids = np.sort(rng.choice(151_936, size, replace=False))
        assert torch.equal(gumbel.noise(11, 5, 151_936, stream, ids=ids), whole[ids])


def test_a_row_with_few_tokens_left_draws_noise_for_those_alone_and_chooses_the_same():
    """Top-k, top-p, min-p or a grammar leave few entries finite: ``choose`` then asks for their
    noise alone, and picks what the whole row's noise picks; rows with many finite, or none, take
    the whole noise as before."""
    vocab, rng = 4_096, torch.Generator().manual_seed(3)
    rows = torch.full((5, vocab), -math.inf)
    rows[0, torch.randperm(vocab, generator=rng)[:40]] = torch.randn(40, generator=rng)  # few: alone
    rows[1, :3] = torch.tensor([0.5, 0.5, 0.5])  # a tie, at the first entries
    rows[2] = torch.randn(vocab, generator=rng)  # all finite: the whole noise
    rows[3, -1] = 2.0  # one token, the last
    # row 4: nothing finite (every token out) stays with the whole noise: token 0
    asked = []

    def noise_of(position):
        def draw(ids):
            asked.append(None if ids is None else len(ids))
            return gumbel.noise(1, position, vocab, ids=ids)
        return draw

    whole = [int(np.argmax(row.double().numpy() + gumbel.noise(1, p, vocab).numpy()))
             for p, row in enumerate(rows)]
    assert gumbel.choose(rows, [noise_of(p) for p in range(5)]) == whole
    assert asked == [40, 3, None, 1, None] and whole[3] == vocab - 1 and whole[4] == 0


def test_the_drafts_noise_of_some_entries_is_its_coupled_noise_there():
    from types import SimpleNamespace

    from anyspec.engine.sampler import Sampler

    rng = np.random.default_rng(1)
    inter_draft = np.sort(rng.choice(5_000, 3_000, replace=False))
    inter_target = rng.choice(20_000, 3_000, replace=False)
    bridge = SimpleNamespace(draft_to_target=np.zeros(5_000), inter_draft_ids=torch.from_numpy(inter_draft),
                             inter_target_ids=torch.from_numpy(inter_target))
    sampler = Sampler(SamplingParams(temperature=1.0), 9, 20_000, bridge)
    ids = np.sort(rng.choice(5_000, 200, replace=False))
    assert np.isin(ids, inter_draft).any() and not np.isin(ids, inter_draft).all()
    coupled = gumbel.noise(9, 4, 5_000, stream=1)  # the draft's own stream, its twins' target noise
    coupled[inter_draft] = gumbel.noise(9, 4, 20_000)[inter_target]
    assert torch.equal(sampler._coupled(4), coupled)
    assert torch.equal(sampler._draft_noise(4, ids), coupled[ids])


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
