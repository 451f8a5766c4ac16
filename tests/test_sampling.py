"""Sampling's building blocks: the chi-square check the distribution tests share, the engine's
draws as table tests make them, top-k / top-p, argmax and top ids, and the draft's choice confined to
the intersection.

Tiny fixed "models" (logit tables indexed by the previous token) over a draft vocabulary that
differs from the target's: target tokens 2 and 4 lie outside the intersection, draft token 5 too,
and draft tokens 1 and 7 stand for the same target token (as "▁" and <0x20> do in SentencePiece).
"""

import math
from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from anyspec.algorithms import gumbel, tli
from anyspec.algorithms.sampling import argmax, filtered_logits, logits_to_probs, top_ids
from anyspec.config import SamplingParams
from anyspec.engine.sampler import Sampler

VT, VD = 8, 8
DRAFT_TO_TARGET = torch.tensor([3, 0, 5, 1, 7, -1, 6, 0])  # draft 5 outside; 1 and 7 share target 0


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


def gumbel_draws(probs: torch.Tensor, positions: list[int], seed: int) -> list[int]:
    """Each row's token as the engine chooses it: Gumbel-max over ``log probs [R, V]``, row r with the
    noise of ``(seed, positions[r])``."""
    return gumbel.choose(torch.log(probs), [gumbel.key(seed, i) for i in positions])


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny tensors: thread hand-offs cost more than the work (10x on a busy 2-core machine)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_verify_greedy_counts_the_matching_prefix():
    logits = torch.full((4, 5), -1.0)
    for row, best in enumerate([2, 4, 1, 0]):
        logits[row, best] = 1.0
    assert tli.verify_greedy(logits, [2, 4, 3]) == (2, 1)
    assert tli.verify_greedy(logits, [2, 4, 1]) == (3, 0)
    assert tli.verify_greedy(logits, [0, 4, 1]) == (0, 2)
    assert tli.verify_greedy(logits[:1], []) == (0, 2)


def test_the_drafts_coupled_choice_stays_inside_the_intersection():
    """TLI's draft picks among the shared tokens only, with its distribution zero outside them; the
    same logits unconfined pick the draft's favourite, which has no target twin."""
    mask = DRAFT_TO_TARGET >= 0
    inter_d, inter_t = tli.intersection_ids(DRAFT_TO_TARGET, mask)
    bridge = SimpleNamespace(draft_to_target=DRAFT_TO_TARGET, inter_draft_ids=inter_d,
                             inter_target_ids=inter_t)
    sampler = Sampler(SamplingParams(temperature=1.0), 0, bridge)
    logits = torch.zeros(VD)
    logits[5] = 5.0  # the draft's favourite
    chosen = [sampler.draft_choice(logits, position, mask) for position in range(50)]
    assert all(d != 5 and q[5] == 0 and math.isclose(float(q.sum()), 1.0, rel_tol=1e-5) for d, q in chosen)
    assert sum(sampler.draft_choice(logits, position)[0] == 5 for position in range(50)) > 25


def test_top_p_keeps_the_smallest_nucleus():
    probs = logits_to_probs(torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05])), 1.0, 0, 0.8)
    assert torch.allclose(probs, torch.tensor([0.5, 0.3, 0.0, 0.0]) / 0.8)
    probs = logits_to_probs(torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05])), 1.0, 2, 1.0)
    assert torch.allclose(probs, torch.tensor([0.5, 0.3, 0.0, 0.0]) / 0.8)


def test_top_p_keeps_every_token_as_probable_as_the_last_in_its_nucleus():
    probs = logits_to_probs(torch.log(torch.tensor([0.4, 0.3, 0.3])), 1.0, 0, 0.5)
    assert torch.allclose(probs, torch.tensor([0.4, 0.3, 0.3]))  # 0.4 + 0.3 reach 0.5; the tied 0.3 too


def test_min_p_keeps_the_tokens_near_the_likeliest_of_what_is_left():
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    assert torch.allclose(logits_to_probs(logits, min_p=0.2), torch.tensor([0.5, 0.3, 0.15, 0.0]) / 0.95)
    assert torch.allclose(logits_to_probs(logits, min_p=0.7), torch.tensor([1.0, 0.0, 0.0, 0.0]))
    after_top_k = logits_to_probs(logits, top_k=3, min_p=0.3)  # 0.15 is 0.3 of 0.5: it stays
    assert torch.allclose(after_top_k, torch.tensor([0.5, 0.3, 0.15, 0.0]) / 0.95)


def test_a_row_with_every_token_out_stays_so_beside_the_others():
    logits = torch.full((2, 10), -math.inf)
    logits[1, 3], logits[1, 5] = 1.0, 2.0
    for top_p, min_p, kept in ((0.9, 0.0, [3, 5]), (1.0, 0.5, [5]), (0.5, 0.5, [5])):
        out = filtered_logits(logits, 1.0, 0, top_p, min_p)
        assert torch.isinf(out[0]).all() and torch.isfinite(out[1]).nonzero().flatten().tolist() == kept


def nucleus_by_sorting(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """``filtered_logits`` at temperature 1, written plainly: each row sorted whole."""
    probs, rows = torch.softmax(logits, dim=-1), []
    for row, p in zip(logits, probs, strict=True):
        ordered = torch.sort(p, descending=True).values.double()
        kept = int(((torch.cumsum(ordered, 0) - ordered) < top_p).sum())
        rows.append(row.masked_fill(p < ordered[kept - 1].float(), -math.inf))
    return torch.stack(rows)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0.05, 12.0), min_size=1, max_size=4), st.sampled_from([0.3, 0.9, 0.95, 0.999]),
       st.integers(0, 2**31))
def test_top_p_over_the_largest_probabilities_is_the_whole_rows_sort_and_each_rows_own(scales, top_p, seed):
    """Rows whose nuclei hold from one token to most of the vocabulary, so that the search for the
    nucleus among the largest probabilities grows to the whole row: each row as a full sort gives
    it, and the same alone as beside the others."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(len(scales), 5000, generator=g) * torch.tensor(scales)[:, None]
    logits[:, :3] += 6.0
    together = filtered_logits(logits, 1.0, 0, top_p)
    assert torch.equal(together, nucleus_by_sorting(logits, top_p))
    assert torch.equal(together, torch.cat([filtered_logits(row[None], 1.0, 0, top_p) for row in logits]))


def test_typical_p_keeps_the_tokens_nearest_the_entropy():
    """p = 1/2, 1/4, 1/8, 1/8: H = 1.75 bits, so token 1 (2 bits) is nearest, then token 0 (1 bit),
    then tokens 2 and 3 (3 bits each, together)."""
    logits = torch.log(torch.tensor([0.5, 0.25, 0.125, 0.125]))
    for mass, kept in ((0.2, [1]), (0.5, [0, 1]), (0.8, [0, 1, 2, 3])):
        out = filtered_logits(logits, typical_p=mass)
        assert torch.isfinite(out).nonzero().flatten().tolist() == kept, mass
    after_top_k = filtered_logits(logits, top_k=2, typical_p=0.5)  # 2/3 and 1/3 left: 2/3 is nearer
    assert torch.isfinite(after_top_k).tolist() == [True, False, False, False]


def test_top_n_sigma_keeps_the_logits_within_n_deviations_of_the_largest():
    logits = torch.tensor([3.0, 2.0, 1.0, 0.0, -math.inf])  # the finite four: mean 1.5, deviation 1.118
    for n, kept in ((1.0, [0, 1]), (2.0, [0, 1, 2]), (3.0, [0, 1, 2, 3]), (0.0, [0, 1, 2, 3])):
        assert torch.isfinite(filtered_logits(logits, top_n_sigma=n)).nonzero().flatten().tolist() == kept
    assert torch.equal(filtered_logits(logits / 0.5, top_n_sigma=1.0).isfinite(),  # scale-free
                       filtered_logits(logits, temperature=0.5, top_n_sigma=1.0).isfinite())


def typical_by_sorting(logits: torch.Tensor, mass: float) -> torch.Tensor:
    """The typical-p filter written plainly: each row's finite entries sorted whole by distance."""
    rows = []
    for row in logits.double():
        finite = torch.isfinite(row)
        p = torch.softmax(row, dim=-1)
        surprisal = -torch.log(p[finite])
        distance = (surprisal - (p[finite] * surprisal).sum()).abs()
        order = torch.sort(distance, stable=True).indices
        reached = torch.cumsum(p[finite][order], 0)
        last = order[min(int((reached < mass).sum()), len(order) - 1)]
        keep = torch.zeros_like(finite)
        keep[finite] = distance <= distance[last]
        rows.append(keep)
    return torch.stack(rows)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(0.05, 8.0), min_size=1, max_size=4), st.sampled_from([0.2, 0.5, 0.9, 0.95]),
       st.integers(0, 2**31), st.booleans())
def test_typical_p_by_buckets_is_the_whole_rows_sort_and_each_rows_own(scales, mass, seed, holes):
    """Flat to peaked rows, some with entries already out: the bucketed search keeps what a full
    sort keeps, and a row alone is filtered as beside the others."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(len(scales), 5000, generator=g) * torch.tensor(scales)[:, None]
    if holes:
        logits[:, ::3] = -math.inf
    together = filtered_logits(logits, typical_p=mass)
    assert torch.equal(torch.isfinite(together), typical_by_sorting(logits, mass))
    assert torch.equal(together, torch.cat([filtered_logits(row[None], typical_p=mass) for row in logits]))
    sigma = filtered_logits(logits, top_n_sigma=1.5)
    assert torch.equal(sigma, torch.cat([filtered_logits(row[None], top_n_sigma=1.5) for row in logits]))


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
