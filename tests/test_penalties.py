"""OpenAI's presence and frequency penalties and logit bias, and vLLM's ``min_tokens`` and
``ignore_eos``: each verify row is shaped by the tokens generated before it, so a penalized answer is
the target alone's with the same settings, on the real small pair (Qwen2.5-Coder-0.5B target,
SmolLM2-135M draft, GGUF), and the target alone follows OpenAI's rule."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import replace

import pytest
import torch
from test_long_context import pair  # noqa: F401  (the module's models)

from anyspec.algorithms.sampling import penalized
from anyspec.engine import Engine, SamplingParams, SpeculativeConfig
from anyspec.engine.penalties import paths
from anyspec.engine.prompt import encode_prompt, end_ids
from anyspec.engine.proposers import Proposal
from anyspec.errors import ConfigError

pytestmark = pytest.mark.slow

PROMPTS = ["List the days of the week, one per line, then again in reverse.",
           "Write a Python function that returns the n-th Fibonacci number, with a docstring."]


def test_penalized_adds_the_bias_then_takes_each_rows_counts():
    out = penalized(torch.zeros(2, 5), [{1: 2}, {1: 3, 4: 1}], presence=0.5, frequency=0.25, bias={2: 3.0})
    assert out.tolist() == [[0.0, -1.0, 3.0, 0.0, 0.0], [0.0, -1.25, 3.0, 0.0, -0.75]]


def test_the_repetition_penalty_divides_positive_logits_and_multiplies_the_others():
    logits = torch.tensor([[2.0, -1.0, 3.0, 0.5], [2.0, -1.0, 3.0, 0.5]])
    out = penalized(logits, [{}, {3: 1}], presence=0.5, frequency=0.0, bias={},
                    repeated=[torch.tensor([0, 1]), torch.tensor([1, 3])], repetition=2.0)
    assert out.tolist() == [[1.0, -2.0, 3.0, 0.5], [2.0, -2.0, 3.0, -0.25]]


def test_each_verify_row_counts_the_proposed_tokens_on_its_own_path():
    assert paths(Proposal([5, 6])) == [[], [5], [5, 6]]
    # the chain 5, 6; a branch 7 beside 6 and a branch 8 beside 5
    assert paths(Proposal([5, 6], trie=([5, 6, 7, 8], [-1, 0, 0, -1]))) == [[], [5], [5, 6], [5, 7], [8]]


def settings(target) -> list[SamplingParams]:
    """Greedy and sampled, each penalty alone and with a bias that bans the greedy answer's first
    word's token."""
    newline = target.tokenizer.encode("\n")[0]
    return [SamplingParams(max_new_tokens=40, frequency_penalty=1.5),
            SamplingParams(max_new_tokens=40, presence_penalty=2.0, logit_bias={newline: -100.0}),
            SamplingParams(temperature=0.8, seed=3, max_new_tokens=40, frequency_penalty=1.0,
                           presence_penalty=-0.5, logit_bias={newline: 5.0}),
            SamplingParams(max_new_tokens=40, repetition_penalty=1.3),
            SamplingParams(temperature=0.8, seed=4, max_new_tokens=40, repetition_penalty=1.2,
                           presence_penalty=0.5)]


@pytest.mark.parametrize("config", [dict(algorithm="slem"), dict(algorithm="tli", tree=2),
                                    dict(algorithm="slem", ngram=2, batched=True)])
def test_a_penalized_answer_is_the_target_alones_with_any_draft(pair, config):  # noqa: F811
    target, draft = pair
    batched = config.pop("batched", False)
    alone, engine = Engine(target, None), Engine(target, draft, SpeculativeConfig(**config))
    requests = [(prompt, params) for prompt in PROMPTS for params in settings(target)]
    want = [alone.generate(*request).token_ids for request in requests]
    got = engine.generate_batch(requests, max_batch=3) if batched else [engine.generate(*r) for r in requests]
    assert [r.token_ids for r in got] == want
    assert sum(r.stats.accepted for r in got) > 0
    plain = {p: alone.generate(p, SamplingParams(max_new_tokens=40)).token_ids for p in PROMPTS}
    kinds = len(settings(target))
    changed = {i % kinds for i, (prompt, _) in enumerate(requests) if want[i] != plain[prompt]}
    assert changed == set(range(kinds))  # each setting changes an answer


def test_the_target_alone_follows_openais_rule(pair):  # noqa: F811
    """Against a plain loop: one forward a token, its logits penalized by hand as OpenAI writes the
    rule (logit - count * frequency - presence where count > 0, the bias added), then the argmax."""
    target = pair[0]
    params = SamplingParams(max_new_tokens=30, frequency_penalty=0.75, presence_penalty=0.5,
                            logit_bias={target.tokenizer.encode(" Monday")[0]: -2.0})
    ids = encode_prompt(target.tokenizer, PROMPTS[0])[0]
    target.reset()
    row, written = target.extend(ids, last=1)[-1], []
    while len(written) < params.max_new_tokens:
        row = row.float().clone()
        for token, bias in params.logit_bias.items():
            row[token] += bias
        for token, n in Counter(written).items():
            row[token] -= n * params.frequency_penalty + params.presence_penalty
        written.append(int(row.argmax()))
        if written[-1] in end_ids(target):
            break
        row = target.extend(written[-1:], last=1)[-1]
    target.reset()
    assert Engine(target, None).generate(PROMPTS[0], params).token_ids == written


def test_the_target_alone_follows_vllms_repetition_rule(pair):  # noqa: F811
    """Against a plain loop: each token of the prompt or written so far has its logit divided by the
    penalty where positive and multiplied where not, then the argmax."""
    target = pair[0]
    params = SamplingParams(max_new_tokens=30, repetition_penalty=1.5)
    ids = encode_prompt(target.tokenizer, PROMPTS[0])[0]
    target.reset()
    row, written = target.extend(ids, last=1)[-1], []
    while len(written) < params.max_new_tokens:
        row = row.float().clone()
        for token in set(ids + written):
            row[token] = row[token] / 1.5 if row[token] > 0 else row[token] * 1.5
        written.append(int(row.argmax()))
        if written[-1] in end_ids(target):
            written.pop()
            break
        row = target.extend([written[-1]], last=1)[-1]
    target.reset()
    assert Engine(target, None).generate(PROMPTS[0], params).token_ids == written
    assert Engine(target, None).generate(PROMPTS[0], SamplingParams(max_new_tokens=30)).token_ids != written


def test_a_bias_beyond_the_vocabulary_is_refused_before_any_work(pair):  # noqa: F811
    target = pair[0]
    with pytest.raises(ConfigError, match="logit_bias names token"):
        Engine(target, None).generate("hi", SamplingParams(logit_bias={target.vocab_size: 1.0}))
    with pytest.raises(ConfigError, match="presence_penalty must be from -2 to 2"):
        SamplingParams(presence_penalty=2.5)


@pytest.mark.parametrize("config", [dict(algorithm="slem"), dict(algorithm="tli", tree=2, ngram=2)])
def test_min_tokens_and_ignore_eos_hold_the_end_back_with_any_draft(pair, config):  # noqa: F811
    """A question answered in a word: its answer ends in a few tokens; with ``min_tokens`` 12 it runs
    on to 12 at least, with ``ignore_eos`` to ``max_new_tokens``; greedy and sampled, the target
    alone's answers with the draft too."""
    target, draft = pair
    alone, engine = Engine(target, None), Engine(target, draft, SpeculativeConfig(**config))
    question = [{"role": "user", "content": "Is Paris in France? Reply with one word."}]
    for sampled in (dict(), dict(temperature=0.8, seed=5)):
        short = alone.generate(question, SamplingParams(max_new_tokens=30, **sampled))
        assert short.finish_reason == "stop" and len(short.token_ids) < 12
        for held in (dict(min_tokens=12), dict(ignore_eos=True)):
            params = SamplingParams(max_new_tokens=30, **held, **sampled)
            want = alone.generate(question, params)
            assert engine.generate(question, params).token_ids == want.token_ids
            assert want.token_ids[:len(short.token_ids)] == short.token_ids
            assert len(want.token_ids) >= 12
            if "ignore_eos" in held:
                assert len(want.token_ids) == 30 and want.finish_reason == "length"


def test_stop_strings_wait_for_min_tokens():
    from anyspec.engine.output import Output

    pieces = [b"a", b"b", b"c"]
    for least, text in ((0, ""), (3, "baa")):
        out = Output(pieces, {9}, SamplingParams(max_new_tokens=10, min_tokens=least, stop=["b"]))
        out.commit([1, 0, 0, 1, 2])
        assert (out.text, out.finish) == (text, "stop")


def test_a_stop_token_ends_the_answer_and_is_kept_in_it():
    from anyspec.engine.output import Output

    out = Output([b"a", b"b", b"c"], {9}, SamplingParams(max_new_tokens=10, stop_token_ids=[1]))
    assert out.commit([0, 2, 1, 0, 2]) == [0, 2, 1] and (out.text, out.finish) == ("acb", "stop")


def test_include_stop_str_in_output_keeps_the_stop_string():
    from anyspec.engine.output import Output

    for include, text in ((False, "a"), (True, "acb")):
        out = Output([b"a", b"b", b"c"], {9}, SamplingParams(max_new_tokens=10, stop=["cb", "b"],
                                                             include_stop_str_in_output=include))
        out.commit([0, 2, 1, 0])
        assert (out.text, out.finish) == (text, "stop")


def test_an_unfinished_character_flushed_at_the_end_can_end_a_stop_string():
    import threading

    from anyspec.engine.output import Output

    pieces = [b"a", "é".encode()[:1], b"b"]  # token 1 is the first byte of a two-byte character
    for fields in (dict(max_new_tokens=2), dict(max_new_tokens=9, stop_token_ids=[1])):
        out = Output(pieces, {9}, SamplingParams(stop=["a\ufffd"], **fields))
        out.commit([0, 1, 2])
        assert (out.text, out.finish, out.stopped_by) == ("", "stop", "a\ufffd")
    out = Output(pieces, {9}, SamplingParams(max_new_tokens=2, stop=["\ufffdb"]))
    out.commit([0, 1])
    assert (out.text, out.finish, out.ready()) == ("a\ufffd", "length", "a\ufffd")
    out = Output(pieces, {9}, SamplingParams(max_new_tokens=9, stop=["\ufffd"]))
    out.commit([0, 1])
    stop = threading.Event()
    stop.set()
    assert out.ended(stop) and (out.text, out.finish, out.ready()) == ("a", "stop", "a")


def test_allowed_token_ids_leave_every_other_token_at_minus_infinity():
    from anyspec.engine.penalties import Penalties

    penalties = Penalties.start(SamplingParams(allowed_token_ids=[4, 1], logit_bias={1: 2.0}), 6, {5})
    logits = penalties.rows(Proposal([]))(torch.arange(6.0)[None])
    assert logits.tolist() == [[-math.inf, 3.0, -math.inf, -math.inf, 4.0, -math.inf]]


def test_stop_tokens_wait_for_min_tokens_in_the_logits_and_eos_for_ignore_eos():
    from anyspec.engine.penalties import Penalties

    def masked(**fields):
        params = SamplingParams(max_new_tokens=10, stop_token_ids=[3], **fields)
        penalties = Penalties.start(params, 6, {5})
        penalties.commit([0])  # one token written: the rows are generated positions 1, 2, 3
        logits = penalties.rows(Proposal([1, 2]))(torch.zeros(3, 6))
        return [[j for j in range(6) if row[j] == -math.inf] for row in logits.tolist()]

    assert masked(min_tokens=3) == [[3, 5], [3, 5], []]
    assert masked(ignore_eos=True) == [[5], [5], [5]]
    assert masked(ignore_eos=True, min_tokens=2) == [[3, 5], [5], [5]]


@pytest.mark.parametrize("fields", [dict(min_tokens=3), dict(ignore_eos=True),
                                    dict(min_tokens=1, stop_token_ids=[3], allowed_token_ids=[3, 5])])
def test_allowed_token_ids_held_back_alone_are_refused_before_any_work(fields):
    """Only end (or, before min_tokens, stop) tokens allowed, and those held back: no token could be
    chosen; the generation is refused, not given a token outside the allowed ones."""
    from anyspec.engine.penalties import Penalties

    params = SamplingParams(**{"max_new_tokens": 10, "allowed_token_ids": [5]} | fields)
    with pytest.raises(ConfigError) as err:
        Penalties.start(params, 6, {5})
    assert err.value.field == "allowed_token_ids"
    Penalties.start(replace(params, allowed_token_ids=[*params.allowed_token_ids, 4]), 6, {5})


@pytest.mark.parametrize(("fields", "names"), [(dict(min_tokens=-1), "min_tokens"),
                                               (dict(min_tokens=9, max_new_tokens=8), "min_tokens"),
                                               (dict(ignore_eos=1), "ignore_eos"),
                                               (dict(allowed_token_ids=[]), "allowed_token_ids"),
                                               (dict(include_stop_str_in_output=None),
                                                "include_stop_str_in_output"),
                                               (dict(ignore_eos=True, grammar=object()), "ignore_eos"),
                                               (dict(allowed_token_ids=[1], grammar=object()),
                                                "allowed_token_ids")])
def test_bad_min_tokens_and_ignore_eos_name_their_field(fields, names):
    with pytest.raises(ConfigError) as err:
        SamplingParams(**fields)
    assert err.value.field == names
