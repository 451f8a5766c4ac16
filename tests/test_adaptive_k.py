"""Adaptive k (algorithms/adaptive_k.py): the choice follows measured acceptance and costs."""

from __future__ import annotations

import pytest

from anyspec.algorithms.adaptive_k import Acceptance, BatchSchedule, PassCosts, batch_ks, expected_tokens


def test_expected_tokens():
    assert expected_tokens(0.5, 0) == 1.0
    assert expected_tokens(0.5, 2) == pytest.approx(1.75)
    assert expected_tokens(0.0, 4) == 1.0
    assert expected_tokens(1.0, 4) == 5.0


def alone(k_max: int, adaptive: bool = True, explore_every: int = 8) -> BatchSchedule:
    """The schedule of a generation in a batch of its own."""
    peers = []
    peers.append(BatchSchedule(k_max, lambda: peers, PassCosts(), PassCosts(), adaptive=adaptive,
                               explore_every=explore_every))
    return peers[0]


def play(ctl: BatchSchedule, k: int, accepted: int, draft: float, verify: float) -> None:
    """A round as its batch records it: k draft passes of one row, one verify pass of k + 1 rows."""
    for _ in range(k):
        ctl.draft.record(1, draft)
    ctl.target.record(k + 1, verify)
    ctl.update(k, accepted)


def feed(ctl: BatchSchedule, rounds: int, accept_rate: float, single: float, per_token: float, draft: float):
    """Simulate rounds: verify(n) = single + per_token * (n - 1); acceptance exactly accept_rate of k."""
    for _ in range(rounds):
        k = ctl.choose()
        accepted = round(accept_rate * k)
        play(ctl, k, accepted, draft, single + per_token * k)


def test_measures_a_full_round_then_the_target_alone():
    ctl = alone(4)
    assert ctl.choose() == 4
    ctl.draft.record(12, 0.2)  # the first draft pass also reads the prompt: a cost of its own row count
    for _ in range(3):
        ctl.draft.record(1, 0.05)
    ctl.target.record(5, 0.5)
    ctl.update(4, 2)
    assert ctl.choose() == 0
    play(ctl, 0, 0, 0.0, 0.35)
    assert ctl.target.mean == {5: 0.5, 1: 0.35} and ctl.draft.mean == {12: 0.2, 1: pytest.approx(0.05)}


def test_cheap_draft_flat_verify_and_high_acceptance_drafts_k_max():
    ctl = alone(4)
    feed(ctl, 30, accept_rate=1.0, single=0.30, per_token=0.02, draft=0.01)
    assert ctl.acceptance.rate > 0.9
    assert ctl.choose() == 4


def test_costly_verify_and_low_acceptance_falls_back_to_the_target_alone_but_explores():
    ctl = alone(4, explore_every=5)
    feed(ctl, 12, accept_rate=0.0, single=0.30, per_token=0.25, draft=0.05)
    assert ctl.acceptance.rate < 0.2
    choices = []
    for _ in range(10):
        k = ctl.choose()
        choices.append(k)
        play(ctl, k, 0, 0.05, 0.30 + 0.25 * k)
    assert choices.count(0) >= 7
    assert 1 in choices  # one exploring round in every explore_every


def test_recovers_when_acceptance_rises_again():
    ctl = alone(4, explore_every=3)
    feed(ctl, 15, accept_rate=0.0, single=0.30, per_token=0.10, draft=0.03)
    assert ctl.choose() in (0, 1)
    feed(ctl, 40, accept_rate=1.0, single=0.30, per_token=0.10, draft=0.03)
    assert ctl.choose() >= 3


def test_unmeasured_verify_sizes_interpolate():
    costs = costs_of([(1, 0.2), (5, 0.6)])
    assert costs(3) == pytest.approx(0.4)
    assert costs(7) == pytest.approx(0.8)
    assert costs_of([(5, 0.6)])(2) == 0.6  # one size measured: flat


def test_one_generation_alone_gets_the_best_k_in_batch_ks():
    """The k of a generation alone is batch_ks's for one: the k with the most tokens per second."""
    ctl = alone(4)
    for rows, seconds in [(1, 0.30), (5, 0.34)]:
        ctl.target.record(rows, seconds)
    ctl.draft.record(1, 0.02)
    for accepted, rejected in [(1, 1), (9, 1), (1, 9), (3, 2)]:
        ctl.acceptance = Acceptance(accepted, rejected)
        a = ctl.acceptance.rate
        rates = [expected_tokens(a, k) / (k * 0.02 + ctl.target(k + 1)) for k in range(5)]
        assert ctl.choose() == rates.index(max(rates))


def test_a_fixed_k_backs_off_when_the_draft_gets_nothing_accepted():
    """Without adaptive k a generation drafts k_max, but a draft that gets nothing accepted (text it
    cannot predict) falls below FLOOR within a few rounds: then k = 0, one token every
    ``explore_every`` rounds, and k_max again once its tokens are accepted."""
    from anyspec.algorithms.adaptive_k import FLOOR

    ctl = alone(4, adaptive=False, explore_every=4)
    choices = []
    for _ in range(30):
        k = ctl.choose()
        choices.append(k)
        ctl.update(k, 0)
    assert choices[:5] == [4] * 5 and ctl.acceptance.rate < FLOOR
    assert choices[-12:] == [0, 0, 0, 1] * 3
    for _ in range(6):
        ctl.update(1, 1)
    assert ctl.choose() == 4


def test_acceptance_decays_and_counts_one_rejection_a_round():
    seen = Acceptance()
    assert seen.rate == 0.5
    seen.count(3, 4)
    assert (seen.accepted, seen.rejected) == (pytest.approx(3.9), pytest.approx(1.9))
    seen.count(4, 4)  # all accepted: no rejection
    assert (seen.accepted, seen.rejected) == (pytest.approx(7.51), pytest.approx(1.71))


@pytest.mark.parametrize("algorithm", ["tli", "slem"])
def test_engine_with_adaptive_k_is_still_lossless(tok_qwen2, tok_llama2, algorithm):
    from test_engine import PROMPTS, tiny

    from anyspec.engine import Engine, SamplingParams, SpeculativeConfig

    target, draft = tiny("qwen2", tok_qwen2, seed=0), tiny("llama", tok_llama2, seed=1)
    config = SpeculativeConfig(num_speculative_tokens=4, draft_sample_method="greedy", algorithm=algorithm,
                               adaptive_k=True)
    spec, alone = Engine(target, draft, config), Engine(target, None)
    params = SamplingParams(temperature=0.0, max_new_tokens=40)
    rounds = drafted = 0
    for prompt in PROMPTS[:4]:
        result = spec.generate(prompt, params)
        assert result.token_ids == alone.generate(prompt, params).token_ids
        assert sum(result.stats.accepted_hist) == result.stats.rounds
        rounds, drafted = rounds + result.stats.rounds, drafted + result.stats.drafted
    # random weights accept almost nothing: the schedule must have stopped drafting k=4 every round
    assert drafted < 4 * rounds


@pytest.mark.parametrize("algorithm", ["tli", "slem"])
def test_a_draft_that_gets_nothing_accepted_backs_off_to_the_target_alone(tok_qwen2, tok_llama2, algorithm):
    """A fixed k of 4 with no confidence stop, and a draft of random weights whose tokens the target
    almost never accepts: after a few rounds the schedule stops drafting but for its exploring
    rounds, so the generation drafts fewer tokens than it has rounds; the answers stay the target's."""
    from test_engine import PROMPTS, tiny

    from anyspec.engine import Engine, SamplingParams, SpeculativeConfig

    target, draft = tiny("qwen2", tok_qwen2, seed=0), tiny("llama", tok_llama2, seed=1)
    config = SpeculativeConfig(num_speculative_tokens=4, draft_sample_method="greedy", algorithm=algorithm,
                               draft_confidence=0.0)
    spec, alone = Engine(target, draft, config), Engine(target, None)
    params = SamplingParams(temperature=0.0, max_new_tokens=48)
    rounds = drafted = accepted = 0
    for prompt in PROMPTS[:3]:
        result = spec.generate(prompt, params)
        assert result.token_ids == alone.generate(prompt, params).token_ids
        rounds, drafted = rounds + result.stats.rounds, drafted + result.stats.drafted
        accepted += result.stats.accepted
    assert accepted < 0.1 * drafted and drafted < rounds, (accepted, drafted, rounds)


def test_confidence_is_the_drafts_probability_of_its_token():
    import torch

    from anyspec.algorithms.adaptive_k import confidence

    logits = torch.tensor([2.0, 1.0, 0.0, -1.0])
    probs = torch.softmax(logits, -1)
    assert confidence(logits, 1, None) == pytest.approx(float(probs[1]))
    mask = torch.tensor([False, True, True, False])  # TLI: only the intersection counts
    inside = torch.softmax(logits[1:3], -1)
    assert confidence(logits, 1, None, mask) == pytest.approx(float(inside[0]))
    q = torch.tensor([0.1, 0.2, 0.3, 0.4])  # a sampled draft: the q it drew from
    assert confidence(logits, 3, q) == pytest.approx(0.4)


@pytest.mark.parametrize("bad", [1.0, -0.1, True, "0.5"])
def test_draft_confidence_must_be_a_probability(bad):
    from anyspec.engine import SpeculativeConfig
    from anyspec.errors import ConfigError

    with pytest.raises(ConfigError, match="draft_confidence"):
        SpeculativeConfig(draft_confidence=bad)


@pytest.mark.parametrize("algorithm", ["tli", "slem"])
def test_engine_with_a_confidence_stop_is_still_lossless_and_drafts_less(tok_qwen2, tok_llama2, algorithm):
    from test_engine import PROMPTS, tiny

    from anyspec.engine import Engine, SamplingParams, SpeculativeConfig

    target, draft = tiny("qwen2", tok_qwen2, seed=0), tiny("llama", tok_llama2, seed=1)
    alone = Engine(target, None)
    params = SamplingParams(temperature=0.0, max_new_tokens=30)
    drafted = {}
    for threshold in (0.0, 0.999):
        config = SpeculativeConfig(num_speculative_tokens=4, draft_sample_method="greedy",
                                   algorithm=algorithm, draft_confidence=threshold)
        spec = Engine(target, draft, config)
        drafted[threshold] = 0
        for prompt in PROMPTS[:3]:
            result = spec.generate(prompt, params)
            assert result.token_ids == alone.generate(prompt, params).token_ids
            drafted[threshold] += result.stats.drafted
    # a random draft is never that sure of itself: every round stops after its first token
    assert drafted[0.999] < drafted[0.0]


def costs_of(points):
    from anyspec.algorithms.adaptive_k import PassCosts

    costs = PassCosts()
    for rows, seconds in points:
        costs.record(rows, seconds)
    return costs


# A 2-core CPU's shape: a pass costs one read of the weights until about 6 rows, then compute per row.
TARGET = [(1, 0.035), (4, 0.036), (6, 0.038), (8, 0.047), (16, 0.092), (24, 0.139)]
DRAFT = [(1, 0.0045), (4, 0.0055), (8, 0.0075)]


def test_pass_costs_interpolate_and_extend_linearly():
    costs = costs_of(TARGET)
    assert costs(4) == 0.036
    assert abs(costs(12) - (0.047 + 0.092) / 2) < 1e-12
    assert abs(costs(32) - (0.139 + 8 * (0.139 - 0.092) / 8)) < 1e-12
    assert not costs_of([(3, 0.1)]).known() and costs_of(TARGET).known()


def test_round_seconds_counts_each_draft_pass_and_one_verify():
    from anyspec.algorithms.adaptive_k import round_seconds

    target, draft = costs_of(TARGET), costs_of(DRAFT)
    assert round_seconds([0, 0, 0, 0], target, draft) == target(4)
    # passes of 2, 2 and 1 drafting generations, then 3 + 3 + 4 + 1 rows
    assert abs(round_seconds([2, 3, 0, 2], target, draft) - (2 * draft(3) + draft(1) + target(11))) < 1e-12


def test_batch_draft_tokens_go_where_they_are_accepted_and_pay():
    from anyspec.algorithms.adaptive_k import batch_ks, expected_tokens, round_seconds

    target, draft = costs_of(TARGET), costs_of(DRAFT)
    ks = batch_ks(5, [0.85, 0.85, 0.4, 0.4], target, draft)
    assert ks[0] == ks[1] >= 1 and ks[2] == ks[3] == 0, ks
    assert batch_ks(5, [0.5] * 8, target, draft) == [0] * 8  # eight rows already cost compute
    assert batch_ks(5, [0.8], target, draft)[0] >= 3  # alone, rows up to the knee are almost free

    def rate(acc, ks):
        tokens = sum(expected_tokens(a, k) for a, k in zip(acc, ks, strict=True))
        return tokens / round_seconds(ks, target, draft)

    for acc in ([0.9, 0.6, 0.3], [0.7] * 4, [0.95, 0.95]):
        best = rate(acc, batch_ks(5, acc, target, draft))
        assert all(best >= rate(acc, [k] * len(acc)) - 1e-12 for k in range(6))


def test_each_generation_of_a_batch_gets_its_own_share():
    """Five generations alike in every count: batch_ks gives draft tokens to three of them, and each
    schedule takes the share at its own place in the batch, not that of the first one equal to it."""
    from anyspec.algorithms.adaptive_k import BatchSchedule

    target, draft = costs_of(TARGET), costs_of(DRAFT)
    peers = []
    peers += [BatchSchedule(5, lambda: peers, target, draft, Acceptance(8.0, 2.0)) for _ in range(5)]
    assert [s.choose() for s in peers] == batch_ks(5, [0.8] * 5, target, draft) == [0, 0, 1, 1, 1]
    assert BatchSchedule(5, lambda: peers[:1], target, draft).choose() == 5  # alone: k_max


def test_the_default_confidence_stop_follows_the_kernels_level(tok_qwen2):
    """None resolves per target: 0.7 where anyspec's kernels run below AVX-512 (a verified row costs
    more there), 0.5 at the AVX-512 level and for a target off the kernels; a given value is kept."""
    from types import SimpleNamespace

    from test_engine import tiny

    from anyspec.backends.linear import rowwise_available, rowwise_kernel
    from anyspec.config import DRAFT_CONFIDENCE, DRAFT_CONFIDENCE_AVX2
    from anyspec.engine import Engine, SpeculativeConfig
    from anyspec.engine.proposers import tuned_confidence

    assert SpeculativeConfig().draft_confidence is None
    assert tuned_confidence(SimpleNamespace(row_invariant=False, kernel_level=None)) == DRAFT_CONFIDENCE
    target = tiny("qwen2", tok_qwen2, seed=0)
    assert Engine(target, None, SpeculativeConfig(draft_confidence=0.25)).config.draft_confidence == 0.25
    if not rowwise_available():
        pytest.skip("anyspec's kernel could not be built here")
    lib = rowwise_kernel()
    level = lib.isa()
    try:
        want = {0: DRAFT_CONFIDENCE_AVX2, 1: DRAFT_CONFIDENCE_AVX2, 2: DRAFT_CONFIDENCE, 3: DRAFT_CONFIDENCE}
        for lvl in range(lib.best_isa() + 1):
            lib.set_isa(lvl)
            assert tuned_confidence(SimpleNamespace(row_invariant=True, kernel_level=lib.isa())) == want[lvl]
        lib.set_isa(1)
        resolved = Engine(target, None).config.draft_confidence
        assert resolved == (DRAFT_CONFIDENCE_AVX2 if target.row_invariant else DRAFT_CONFIDENCE)
    finally:
        lib.set_isa(level)


def test_branches_default_on_where_the_target_takes_a_tree_and_rows_are_cheap(tok_qwen2):
    """tree=None resolves by the target (``proposers.tuned_tree``): TREE_BRANCHES on a tree-taking
    target at the kernels' AVX-512 level, none at AVX2 or below or on a target without tree
    attention; asking for branches there is a one-line error."""
    from types import SimpleNamespace

    from test_engine import tiny

    from anyspec.backends.linear import rowwise_available, rowwise_kernel
    from anyspec.config import TREE_BRANCHES
    from anyspec.engine import Engine, SpeculativeConfig
    from anyspec.engine.proposers import tuned_tree
    from anyspec.errors import ConfigError

    target = tiny("qwen2", tok_qwen2, seed=0)  # transformers: no tree attention
    assert Engine(target, None).config.tree == 0
    with pytest.raises(ConfigError, match="tree=2 needs a target whose forward takes a tree"):
        Engine(target, None, SpeculativeConfig(tree=2))
    with pytest.raises(ConfigError, match="tree must be an integer from 0"):
        SpeculativeConfig(tree=-1)
    not_on_kernels = SimpleNamespace(row_invariant=False, tree_attention=True, kernel_level=None)
    assert tuned_tree(not_on_kernels) == TREE_BRANCHES
    if not rowwise_available():
        pytest.skip("anyspec's kernel could not be built here")
    lib = rowwise_kernel()
    level = lib.isa()
    try:
        for lvl in range(lib.best_isa() + 1):
            lib.set_isa(lvl)
            kernels = SimpleNamespace(row_invariant=True, kernel_level=lib.isa())
            assert tuned_tree(SimpleNamespace(**vars(kernels), tree_attention=True)) == (
                TREE_BRANCHES if lvl >= 2 else 0)
            assert tuned_tree(SimpleNamespace(**vars(kernels), tree_attention=False)) == 0
    finally:
        lib.set_isa(level)
