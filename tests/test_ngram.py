"""Prompt lookup (algorithms/ngram.py): what it proposes, that verifying it is lossless greedy and
sampled, and why each round ended (proposers.round_end)."""

import random

import pytest
import torch
from test_engine import PROMPTS, greedy, llama_draft, qwen_target  # noqa: F401  (fixtures)
from test_sampling import VT, chi_square_pvalue, gumbel_draws, tables
from tiny_models import one_thread  # noqa: F401  (autouse fixture)

from anyspec.algorithms import ngram, tli
from anyspec.algorithms.adaptive_k import PassCosts
from anyspec.algorithms.ngram import MAX_N
from anyspec.algorithms.sampling import logits_to_probs
from anyspec.engine import Engine, SamplingParams, SpeculativeConfig
from anyspec.engine.prompt import encode_prompt
from anyspec.engine.proposers import Proposal, round_end
from anyspec.errors import ConfigError


def test_lookup_takes_the_latest_occurrence_of_the_longest_suffix():
    #          0  1  2  3  4  5  6  7  8  9
    history = [5, 6, 7, 8, 1, 6, 7, 9, 6, 7]
    assert ngram.lookup(history, 3, min_n=2) == [9, 6, 7]  # "6 7" last seen at 5, then 9
    assert ngram.lookup(history + [9], 2, min_n=2) == [6, 7]  # "7 9" at 6; "6 7 9" at 5 is longer
    # "2 3 1 2" occurred at 1 (then 4): it beats the later "1 2" at 6 (then 3)
    assert ngram.lookup([1, 2, 3, 1, 2, 4, 1, 2, 3, 1, 2], 1, min_n=2) == [4]
    assert ngram.lookup(history, 3, min_n=3) == []  # "8 6 7"... no suffix of 3 occurred before
    assert ngram.lookup([4, 4], 5, min_n=1) == [4] * 5  # past the end, the copy repeats itself
    assert ngram.lookup([1, 2, 3, 1, 2], 5, min_n=2) == [3, 1, 2, 3, 1]
    assert ngram.lookup([1, 2, 3], 4, min_n=1) == [] and ngram.lookup(history, 0) == []


def test_round_end_names_the_cause():
    tb = [b"", b"a", b"ab", b"abc", b"x", b" the", b" th"]
    drafted = Proposal([3, 4], drafted=2, end="k")
    assert round_end(drafted, 2, 1, tb) == "k"
    assert round_end(drafted, 0, 4, tb) == "rejected"  # "x" where "abc" was proposed
    assert round_end(drafted, 0, 2, tb) == "boundary"  # "ab": the same text, cut shorter
    assert round_end(Proposal([6], drafted=1), 0, 5, tb) == "boundary"  # " the" grows " th"
    assert round_end(Proposal([6, 4], drafted=2, end="confidence"), 2, 4, tb) == "confidence"
    assert round_end(Proposal([]), 0, 1, tb) == "none"
    assert round_end(Proposal([], drafted=1, end="eos"), 0, 1, tb) == "eos"
    assert round_end(Proposal([], drafted=3, end="k"), 0, 1, tb) == "boundary"  # no round trip


def test_ngram_must_be_a_small_integer():
    for bad in (-1, 5, 1.5, True):
        with pytest.raises(ConfigError, match="ngram must be an integer from 0"):
            SpeculativeConfig(ngram=bad)


def test_sampling_ngram_proposals_draws_from_the_targets_distribution():
    """Rounds that propose the context's continuation (a table model's previous token decides the
    next one's logits), verified as exact match: the first three tokens' joint frequencies match."""
    target_tab, _ = tables(seed=3)
    for prev, nxt in ((1, 2), (2, 3), (3, 1)):  # the prompt's cycle is likely, not certain
        target_tab[prev, nxt] += 2.0
    prompt = [1, 2, 3, 1, 2, 3, 1, 2]
    p = lambda prev: logits_to_probs(target_tab[prev], 1.0)  # noqa: E731
    counts, accepted, n = torch.zeros(VT ** 3), 0, 20_000
    for seed in range(n):
        history = list(prompt)
        while len(history) < len(prompt) + 3:
            proposed = ngram.lookup(history, 3, min_n=1)
            probs = p(torch.tensor(history[-1:] + proposed))
            at = len(history) - len(prompt)  # the generated position of the first row
            choices = gumbel_draws(probs, list(range(at, at + len(probs))), seed)
            got, token = tli.verify_exact(choices, proposed)
            accepted += got
            history += proposed[:got] + [token]
        a, b, c = history[len(prompt):len(prompt) + 3]
        counts[(a * VT + b) * VT + c] += 1
    first = p(torch.tensor(2))
    joint = torch.stack([first[a] * p(torch.tensor(a))[b] * p(torch.tensor(b))
                         for a in range(VT) for b in range(VT)]).reshape(-1)
    assert accepted > n // 2  # the proposals were used, not only rejected
    assert chi_square_pvalue(counts, joint) > 1e-3


@pytest.mark.parametrize("draft", [False, True])
def test_greedy_with_ngram_proposals_equals_the_target_alone(qwen_target, llama_draft, draft):  # noqa: F811
    baseline = Engine(qwen_target, None)
    engine = Engine(qwen_target, llama_draft if draft else None, SpeculativeConfig(ngram=1))
    proposed = 0
    for prompt in PROMPTS[:4]:
        want = baseline.generate(prompt, greedy(24))
        got = engine.generate(prompt, greedy(24))
        assert got.token_ids == want.token_ids, prompt
        s = got.stats
        proposed += s.ngram_proposed
        assert sum(s.ended_by.values()) == s.rounds and s.ngram_accepted <= s.ngram_proposed
        assert s.algorithm == ("slem" if draft else "ngram")
    assert proposed > 0 or draft  # beside a draft (and no tree), only while the text copies


def test_while_the_text_copies_the_continuation_is_proposed_alone(qwen_target, llama_draft, monkeypatch):  # noqa: F811
    """A lookup that finds the target's own next tokens (known from a run of the target alone, so
    they depend only on the position): once it has agreed with what rounds committed (two tokens
    at least: one may be chance), it is proposed without the draft, up to more tokens than k, and
    all of it is accepted."""
    prompt = PROMPTS[1]
    want = Engine(qwen_target, None).generate(prompt, greedy(40)).token_ids
    n_prompt = len(encode_prompt(qwen_target.tokenizer, prompt)[0])
    monkeypatch.setattr(ngram.Index, "match",
                        lambda index, limit, context=None: (2, want[len(index.ids) - n_prompt:][:limit]))
    # passes cost the same whatever their rows, as the tiny models' nearly do: a slow pass measured
    # by chance then cannot make a long continuation look dear and cut it
    monkeypatch.setattr(PassCosts, "__call__", lambda costs, rows: min(costs.mean.values()))
    got = Engine(qwen_target, llama_draft, SpeculativeConfig(ngram=2, num_speculative_tokens=3)).generate(
        prompt, greedy(40))
    s = got.stats
    assert got.token_ids == want
    assert s.ngram_accepted == s.ngram_proposed > 30  # nearly all of it copied
    assert s.rounds < 40 / 4  # rounds of more than k + 1 tokens
    # the last round may have nothing to propose: one token left, the target's own
    draft_rounds = s.rounds - sum(s.ended_by.get(cause, 0) for cause in ("ngram:k", "ngram:none", "none"))
    assert 1 <= draft_rounds <= 2 and s.drafted <= 3 * draft_rounds, s.ended_by


def test_the_index_finds_what_a_scan_finds_as_the_context_grows():
    def scan(ids, limit, min_n):
        for n in range(min(MAX_N, len(ids) - 1), min_n - 1, -1):
            ends = [e for e in range(n, len(ids)) if ids[e - n:e] == ids[len(ids) - n:]]
            if ends:
                period = len(ids) - ends[-1]
                return [ids[ends[-1] + i % period] for i in range(limit)]
        return []

    rng = random.Random(0)
    for trial in range(200):
        min_n, index, ids = rng.randint(1, 3), None, []
        index = ngram.Index(min_n)
        for _ in range(rng.randint(1, 6)):
            piece = [rng.randint(0, 4) for _ in range(rng.randint(1, 12))]
            ids += piece
            index.extend(piece)
            assert index.find(7) == scan(ids, 7, min_n), (trial, ids)


def test_sampled_engine_rounds_with_context_proposals_draw_from_the_target(qwen_target, monkeypatch):  # noqa: F811
    """The engine's own path (one-hot q, crop, commit) for a proposal from the context: here the
    lookup proposes the target's two most likely tokens after the prompt, a guess that depends only
    on the context; the first two sampled tokens' joint frequencies match the target's."""
    prompt, top_k = "My favourite colour is", 3
    ids, _, _ = encode_prompt(qwen_target.tokenizer, prompt)
    qwen_target.reset()
    first = logits_to_probs(qwen_target.extend(ids, last=1)[-1], 1.0, top_k)
    guess = [int(first.argmax())]
    joint = {}
    for a in torch.nonzero(first).flatten().tolist():
        qwen_target.crop(len(ids))
        second = logits_to_probs(qwen_target.extend([a])[-1], 1.0, top_k)
        if a == guess[0]:
            guess.append(int(second.argmax()))
        for b in torch.nonzero(second).flatten().tolist():
            joint[(a, b)] = first[a].item() * second[b].item()
    qwen_target.reset()
    monkeypatch.setattr(ngram.Index, "match",
                        lambda index, limit, context=None: (2, guess[:limit]) if index.ids == ids
                        else (0, []))
    engine = Engine(qwen_target, None, SpeculativeConfig(ngram=2))
    cells = list(joint)
    counts, accepted = torch.zeros(len(cells)), 0
    for seed in range(600):
        r = engine.generate(prompt, SamplingParams(temperature=1.0, top_k=top_k, max_new_tokens=2, seed=seed))
        counts[cells.index(tuple(r.token_ids[:2]))] += 1
        accepted += r.stats.ngram_accepted
    assert accepted > 100
    assert chi_square_pvalue(counts, torch.tensor([joint[c] for c in cells])) > 1e-3


def test_by_default_lookup_runs_beside_a_draft_on_long_prompts_only(qwen_target, llama_draft,  # noqa: F811
                                                                    monkeypatch):
    """The default (``ngram=None``): a prompt of ``AUTO_NGRAM_PROMPT`` tokens or more, beside a
    draft, gets prompt lookup; a short prompt, or the target alone, does not; the answers stay the
    target alone's. The lookup finds the target's own next tokens, as above."""
    from anyspec.config import AUTO_NGRAM_PROMPT
    from anyspec.engine import lookup

    assert SpeculativeConfig().ngram is None
    long_prompt = " ".join(f"item {i % 9} costs {i % 7} coins;" for i in range(60))
    assert len(encode_prompt(qwen_target.tokenizer, long_prompt)[0]) >= AUTO_NGRAM_PROMPT
    baseline, default = Engine(qwen_target, None), Engine(qwen_target, llama_draft)
    for prompt, looks_up in ((long_prompt, True), (PROMPTS[0], False)):
        want = baseline.generate(prompt, greedy(24))
        n_prompt = len(encode_prompt(qwen_target.tokenizer, prompt)[0])
        monkeypatch.setattr(ngram.Index, "match", lambda index, limit, context=None, w=want.token_ids,
                            n=n_prompt: (2, w[len(index.ids) - n:][:limit]))
        got = default.generate(prompt, greedy(24))
        assert got.token_ids == want.token_ids
        assert (got.stats.ngram_proposed > 0) == looks_up, prompt[:40]
        assert want.stats.ngram_proposed == 0  # no draft: the target alone
    costs = PassCosts()
    assert lookup.start(None, [1] * AUTO_NGRAM_PROMPT, costs, 5, costs).index.min_n == 2
    assert lookup.start(None, [1] * (AUTO_NGRAM_PROMPT - 1), costs, 5, costs) is None
    assert lookup.start(None, [1] * AUTO_NGRAM_PROMPT, costs, 5, None) is None
    assert lookup.start(0, [1] * AUTO_NGRAM_PROMPT, costs, 5, costs) is None
    assert lookup.start(3, [1], costs, 5, None).index.min_n == 3  # asked for: on, draft or not


def test_a_prediction_is_matched_against_the_context_as_a_scan_finds():
    """``Index.match`` with another context: the longest suffix of that context found in the
    prediction's text, and what followed its latest occurrence there, never repeated past its end."""
    def scan(text, context, limit, min_n):
        for n in range(min(MAX_N, len(context)), min_n - 1, -1):
            ends = [e for e in range(n, len(text)) if text[e - n:e] == context[len(context) - n:]]
            if ends:
                return n, text[ends[-1]:ends[-1] + limit]
        return 0, []

    rng = random.Random(1)
    for trial in range(300):
        min_n = rng.randint(1, 3)
        text = [rng.randint(0, 4) for _ in range(rng.randint(1, 30))]
        index = ngram.Index(min_n)
        index.extend(text)
        context = [rng.randint(0, 4) for _ in range(rng.randint(1, 10))]
        assert index.match(6, context) == scan(text, context, 6, min_n), (trial, text, context)
        assert index.ids == text  # matching another context leaves the text as it was


@pytest.mark.parametrize("draft", [False, True])
def test_a_prediction_speeds_the_answer_and_never_changes_it(qwen_target, llama_draft, draft):  # noqa: F811
    """A prediction that is the target's own answer is copied at a run of tokens a round, with the
    draft or without (the tiny model's text encodes back to other tokens in places, where the copy
    breaks off for a round or two); a wrong one changes nothing either. Greedy and seeded sampled
    answers are the target alone's; without a prediction, and with lookup turned off, nothing is
    proposed from it."""
    prompt = PROMPTS[1]
    alone = Engine(qwen_target, None)
    want = alone.generate(prompt, greedy(40))
    engine = Engine(qwen_target, llama_draft if draft else None)
    got = engine.generate(prompt, greedy(40, prediction=want.text))
    s = got.stats
    assert got.token_ids == want.token_ids
    # beside a draft, which of the two proposes a round follows the measured costs, so fewer are sure
    assert s.prediction_tokens > 30 and s.ngram_accepted > 10
    assert s.prediction_accepted > (10 if draft else 20)
    predicted = qwen_target.tokenizer.encode(want.text, add_special_tokens=False)
    assert s.prediction_matched == ngram.matched(predicted, want.token_ids) > 30  # however it was proposed
    assert s.rounds < 40 / 2 and s.algorithm == ("slem" if draft else "ngram")
    wrong = engine.generate(prompt, greedy(40, prediction="Lorem ipsum dolor sit amet, " * 5))
    assert wrong.token_ids == want.token_ids and wrong.stats.prediction_accepted < 5
    plain = engine.generate(prompt, greedy(40))
    assert plain.stats.prediction_tokens == plain.stats.prediction_accepted == 0
    assert plain.stats.ngram_proposed == 0 or draft  # a short prompt: no lookup (beside a draft, by chance)
    off = Engine(qwen_target, llama_draft if draft else None, SpeculativeConfig(ngram=0))
    unused = off.generate(prompt, greedy(40, prediction=want.text))
    assert unused.token_ids == want.token_ids and unused.stats.ngram_proposed == 0
    assert unused.stats.prediction_matched == s.prediction_matched  # the answer holds it all the same
    for seed in (3, 4):
        sampled = SamplingParams(temperature=1.0, max_new_tokens=24, seed=seed)
        own = alone.generate(prompt, sampled)
        again = engine.generate(prompt, SamplingParams(temperature=1.0, max_new_tokens=24, seed=seed,
                                                       prediction=own.text))
        assert again.token_ids == own.token_ids and again.stats.prediction_accepted > 10


def test_the_tokens_of_a_prediction_an_answer_holds_are_counted_in_order():
    assert ngram.matched([1, 2, 3, 4], [1, 2, 3, 4]) == 4
    assert ngram.matched([9, 1, 2, 3, 4, 9], [1, 2, 3, 4]) == 4  # the answer repeats a stretch of it
    assert ngram.matched([1, 2, 3, 4, 5, 6], [1, 2, 7, 7, 5, 6]) == 4  # an edit between two stretches
    assert ngram.matched([1, 2, 3, 4, 5, 6], [4, 5, 6, 1, 2, 3]) == 3  # in order: one of the two halves
    assert ngram.matched([1, 2, 3], [7, 8, 9]) == ngram.matched([1, 2], []) == 0
    text = list(range(1000)) * 30  # a long prediction's common tokens: still every match found
    assert ngram.matched(text, text[5000:6000]) == 1000
    code = [t for i in range(300) for t in (0, 1000 + i, 5000 + i, 0, 9000 + i)]  # 0: a newline, 40%
    edited = code[100:400] + [7, 7] + code[400:700]
    assert ngram.matched(code, edited) == 600  # the newlines within the copies counted too


def test_a_prediction_must_be_text_or_token_ids():
    for bad in (["a"], [], [3, -1], [True], 7):
        with pytest.raises(ConfigError, match="prediction must be a string"):
            SamplingParams(prediction=bad)
    with pytest.raises(ConfigError, match="the prediction is not valid UTF-8"):
        SamplingParams(prediction="caf\udce9")
    with pytest.raises(ConfigError, match="the prediction is empty; give the text"):
        SamplingParams(prediction="")


def test_a_prediction_given_as_token_ids_is_the_same_as_its_text(qwen_target):  # noqa: F811
    """Token ids (what the server encodes with the prompt, off the generations' thread) propose as
    the text they encode does; an id beyond the vocabulary is refused before the prompt is read."""
    prompt = PROMPTS[1]
    engine = Engine(qwen_target, None)
    want = engine.generate(prompt, greedy(40))
    ids = qwen_target.tokenizer.encode(want.text, add_special_tokens=False)
    by_text = engine.generate(prompt, greedy(40, prediction=want.text))
    by_ids = engine.generate(prompt, greedy(40, prediction=ids))
    assert by_ids.token_ids == by_text.token_ids == want.token_ids
    assert by_ids.stats.prediction_tokens == by_text.stats.prediction_tokens == len(ids)
    # how much of it was proposed follows measured costs (a continuation is cut to what pays), so
    # the count that must agree is what the answer holds of it
    assert by_ids.stats.prediction_matched == by_text.stats.prediction_matched > 30
    assert by_ids.stats.prediction_accepted > 20 and by_text.stats.prediction_accepted > 20
    calls = []
    extend = qwen_target.extend
    qwen_target.extend = lambda *a, **kw: calls.append(a) or extend(*a, **kw)
    try:
        with pytest.raises(ConfigError, match=f"prediction names token {qwen_target.vocab_size}, beyond"):
            engine.generate(prompt, greedy(8, prediction=[5, qwen_target.vocab_size]))
    finally:
        del qwen_target.extend
    assert calls == []


def test_a_prediction_is_looked_up_as_far_as_the_context_holds(qwen_target, monkeypatch):  # noqa: F811
    """No answer takes more tokens than the context holds, so no more of a prediction is indexed
    (a megabyte of it would be millions of n-grams); all of it is counted."""
    from anyspec.engine import lookup

    given = []
    start = lookup.start
    monkeypatch.setattr(lookup, "start", lambda *a: given.append(a[-1]) or start(*a))
    long = "alpha beta gamma delta " * 400
    result = Engine(qwen_target, None).generate(PROMPTS[0], greedy(4, prediction=long))
    assert len(given[0]) == qwen_target.context_length
    assert result.stats.prediction_tokens == len(qwen_target.tokenizer.encode(long, add_special_tokens=False))
