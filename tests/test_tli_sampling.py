"""TLI speculative sampling draws exactly from the target's distribution (chi-square tests).

Tiny fixed "models" (logit tables indexed by the previous token) over a draft vocabulary that
differs from the target's: target tokens 2 and 4 lie outside the intersection, draft token 5 too,
and draft tokens 1 and 7 stand for the same target token (as "▁" and <0x20> do in SentencePiece).
"""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from anyspec.algorithms import tli
from anyspec.algorithms.adaptive_k import confidence
from anyspec.algorithms.sampling import argmax, logits_to_probs, top_ids

VT, VD = 8, 8
DRAFT_TO_TARGET = torch.tensor([3, 0, 5, 1, 7, -1, 6, 0])  # draft 5 outside; 1 and 7 share target 0
N = 20_000


def chi_square_pvalue(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """P(X >= stat) for Pearson's chi-square, cells with expected < 5 pooled into one."""
    expected = probs * counts.sum()
    big = expected >= 5
    obs = torch.cat([counts[big].double(), counts[~big].double().sum().reshape(1)])
    exp = torch.cat([expected[big].double(), expected[~big].double().sum().reshape(1)])
    if exp[-1] == 0:
        assert obs[-1] == 0, "a token with probability 0 was sampled"
        obs, exp = obs[:-1], exp[:-1]
    stat = float(((obs - exp) ** 2 / exp).sum())
    dof = len(obs) - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64),
                                         torch.tensor(stat / 2, dtype=torch.float64)))


def tables(seed=0):
    g = torch.Generator().manual_seed(seed)
    target = torch.randn(VT, VT, generator=g) * 1.5
    target[:, 2] += 1.0  # a target-only token with real mass
    draft = torch.randn(VT, VD, generator=g) * 1.5
    return target, draft


def sample_tokens(target_tab, draft_tab, k, settings, generator, n_tokens=2, wrong_residual=False,
                  early_stops=None):
    """Run TLI rounds from context [0] until ``n_tokens`` are committed; return them (target ids).

    ``settings["stop_below"]`` ends a round's draft after a token the draft gives less probability
    (the engine's ``draft_confidence``); ``early_stops`` (a list) then collects one entry per stop.
    """
    mask = DRAFT_TO_TARGET >= 0
    inter_d, inter_t = tli.intersection_ids(DRAFT_TO_TARGET, mask)
    out, last = [], 0
    while len(out) < n_tokens:
        proposed, qs, prev = [], [], last
        for i in range(k):
            d, q = tli.propose(draft_tab[prev], mask, settings["temperature"], settings["top_k"],
                               settings["top_p"], generator)
            sure = confidence(draft_tab[prev], d, q, mask)
            if q is None or settings.get("greedy_draft"):
                q = torch.zeros(VD)
                q[d] = 1.0
            prev = int(DRAFT_TO_TARGET[d])
            proposed.append(prev)
            qs.append(tli.to_target_space(q, inter_d, inter_t, VT))
            if i + 1 < k and sure < settings.get("stop_below", 0.0):
                if early_stops is not None:
                    early_stops.append(i + 1)
                break
        ctx = [last] + proposed
        p = tli.target_probs(target_tab[torch.tensor(ctx)], settings["temperature"], settings["top_k"],
                             settings["top_p"])
        q = torch.stack(qs)
        if wrong_residual:
            q = torch.zeros_like(q) + 1e-9  # the classic bug: resample from p, ignoring q'
        n, nxt = tli.verify_sample(p, q, proposed, generator)
        out += (proposed[:n] + [nxt])
        last = out[-1]
    return out[:n_tokens]


def exact_joint(target_tab, settings):
    p = lambda prev: logits_to_probs(target_tab[prev], settings["temperature"], settings["top_k"],  # noqa: E731
                                     settings["top_p"])
    first = p(0)
    return torch.stack([first[a] * p(a) for a in range(VT)]).reshape(-1)


SETTINGS = {
    "plain": dict(temperature=1.0, top_k=0, top_p=1.0),
    "temp-topk-topp": dict(temperature=0.7, top_k=5, top_p=0.9),
    "greedy-draft": dict(temperature=1.3, top_k=0, top_p=1.0, greedy_draft=True),
    "confidence-stop": dict(temperature=1.0, top_k=0, top_p=1.0, stop_below=0.35),
}


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny tensors: thread hand-offs cost more than the work (10x on a busy 2-core machine)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize("name", ["plain", "confidence-stop"])
def test_joint_distribution_of_two_tokens_matches_target(name):
    settings = SETTINGS[name]
    target_tab, draft_tab = tables()
    generator = torch.Generator().manual_seed(1234)
    counts = torch.zeros(VT * VT)
    stops = []
    for i in range(N):
        a, b = sample_tokens(target_tab, draft_tab, k=1 + i % 4, settings=settings, generator=generator,
                             early_stops=stops)
        counts[a * VT + b] += 1
    if "stop_below" in settings:  # the stop really cut drafts short, at several lengths
        assert len(stops) > N // 10 and len(set(stops)) >= 2
    joint = exact_joint(target_tab, settings)
    assert chi_square_pvalue(counts, joint) > 1e-3
    marginal = joint.reshape(VT, VT).sum(1)
    outside = [2, 4]  # target-only tokens are produced (by the residual), at their target rate
    assert counts.reshape(VT, VT)[outside].sum() > 0.8 * N * float(marginal[outside].sum())


@pytest.mark.parametrize("name", ["temp-topk-topp", "greedy-draft"])
def test_first_token_distribution_matches_target(name):
    settings = SETTINGS[name]
    target_tab, draft_tab = tables(seed=5)
    generator = torch.Generator().manual_seed(7)
    counts = torch.zeros(VT)
    for i in range(N):
        (a,) = sample_tokens(target_tab, draft_tab, k=1 + i % 4, settings=settings, generator=generator,
                             n_tokens=1)
        counts[a] += 1
    marginal = exact_joint(target_tab, settings).reshape(VT, VT).sum(1)
    assert chi_square_pvalue(counts, marginal) > 1e-3


def test_chi_square_catches_a_wrong_residual():
    """Negative control: resampling from p instead of norm(max(0, p - q')) is biased and detected."""
    target_tab, draft_tab = tables()
    generator = torch.Generator().manual_seed(99)
    counts = torch.zeros(VT)
    for _ in range(N // 4):
        (a,) = sample_tokens(target_tab, draft_tab, k=2, settings=SETTINGS["plain"], generator=generator,
                             n_tokens=1, wrong_residual=True)
        counts[a] += 1
    marginal = exact_joint(target_tab, SETTINGS["plain"]).reshape(VT, VT).sum(1)
    assert chi_square_pvalue(counts, marginal) < 1e-6


def test_verify_greedy_counts_the_matching_prefix():
    logits = torch.full((4, 5), -1.0)
    for row, best in enumerate([2, 4, 1, 0]):
        logits[row, best] = 1.0
    assert tli.verify_greedy(logits, [2, 4, 3]) == (2, 1)
    assert tli.verify_greedy(logits, [2, 4, 1]) == (3, 0)
    assert tli.verify_greedy(logits, [0, 4, 1]) == (0, 2)
    assert tli.verify_greedy(logits[:1], []) == (0, 2)


def test_propose_stays_inside_the_intersection():
    logits = torch.zeros(VD)
    logits[5] = 100.0  # the draft's favourite has no target twin
    mask = DRAFT_TO_TARGET >= 0
    assert tli.propose(logits, mask, 0.0)[0] != 5
    generator = torch.Generator().manual_seed(0)
    for _ in range(50):
        d, q = tli.propose(logits, mask, 1.0, generator=generator)
        assert d != 5 and q[5] == 0 and math.isclose(float(q.sum()), 1.0, rel_tol=1e-5)


def test_top_p_keeps_the_smallest_nucleus():
    probs = logits_to_probs(torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05])), 1.0, 0, 0.8)
    assert torch.allclose(probs, torch.tensor([0.5, 0.3, 0.0, 0.0]) / 0.8)
    probs = logits_to_probs(torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05])), 1.0, 2, 1.0)
    assert torch.allclose(probs, torch.tensor([0.5, 0.3, 0.0, 0.0]) / 0.8)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from([-math.inf, -2.0, 0.0, 0.5, 3.0, math.inf, math.nan]), min_size=1,
                max_size=40), st.integers(1, 3))
def test_argmax_is_torch_argmax_with_ties_infinities_and_nans(values, rows):
    logits = torch.tensor(values).repeat(rows, 1)
    logits[-1] = logits[-1].flip(0)
    assert argmax(logits) == torch.argmax(logits, dim=-1).tolist()
    assert argmax(logits.to(torch.bfloat16)) == torch.argmax(logits.to(torch.bfloat16), dim=-1).tolist()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from([0.0, 0.1, 0.25, 0.5]), min_size=1, max_size=30), st.integers(1, 6))
def test_top_ids_are_the_largest_first_and_the_lowest_index_among_equals(values, n):
    probs = torch.tensor(values)
    want = sorted(range(len(values)), key=lambda i: (-values[i], i))[:n]
    assert top_ids(probs, n) == want
