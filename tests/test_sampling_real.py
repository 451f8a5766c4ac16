"""Sampled answers on the real small pair (Qwen2.5-Coder-0.5B target, SmolLM2-135M draft, GGUF on
anyspec's kernels): for a seed, the same tokens as the target alone whatever the draft, algorithm, k,
branches or batch, through the engine and the server; and the committed tokens drawn from the
target's own distribution (chi-square)."""

from __future__ import annotations

import json

import pytest
import torch
from live_server import live_server
from test_long_context import pair  # noqa: F401  (the module's models)
from test_sampling import chi_square_pvalue

from anyspec.algorithms import gumbel, tli, tree
from anyspec.algorithms.sampling import logits_to_probs
from anyspec.bench.prompts import PROMPTS_DIR
from anyspec.engine import Engine, SamplingParams, SpeculativeConfig
from anyspec.engine.prompt import encode_prompt, end_ids

pytestmark = pytest.mark.slow

SEEDS = (0, 1, 2)
CONFIGS = [  # (config, in a batch of 4 with the other requests, or each alone)
    (dict(algorithm="slem", num_speculative_tokens=5, tree=2), True),
    (dict(algorithm="tli", num_speculative_tokens=1, tree=0), True),
    (dict(algorithm="slem", num_speculative_tokens=8, tree=0), False),
    (dict(algorithm="tli", num_speculative_tokens=8, tree=2), False),
]


def prompts() -> list[list[dict]]:
    """The bench's code and prose prompts (12)."""
    out = []
    for name in ("code", "prose"):
        lines = (PROMPTS_DIR / f"{name}.jsonl").read_text().splitlines()
        out += [json.loads(line)["messages"] for line in lines if line.strip()]
    return out


def requests() -> list[tuple[list[dict], SamplingParams]]:
    """Each prompt at each seed; at the second seed with min-p too, at the third with typical-p and
    top-nσ."""
    return [(messages, SamplingParams(temperature=0.8, top_p=0.95, min_p=0.05 if seed == SEEDS[1] else 0.0,
                                      typical_p=0.9 if seed == SEEDS[2] else 1.0,
                                      top_n_sigma=2.0 if seed == SEEDS[2] else 0.0,
                                      max_new_tokens=20, seed=seed))
            for messages in prompts()[:10] for seed in SEEDS]


@pytest.fixture(scope="module")
def reference(pair):  # noqa: F811
    alone = Engine(pair[0], None)
    return [alone.generate(*request).token_ids for request in requests()]


@pytest.mark.parametrize(("config", "batched"), CONFIGS)
def test_a_seeded_answer_is_the_target_alones_on_the_real_pair(pair, reference, config, batched):  # noqa: F811
    target, draft = pair
    engine = Engine(target, draft, SpeculativeConfig(**config))
    if batched:
        results = engine.generate_batch(requests(), max_batch=4)
    else:
        results = [engine.generate(*request) for request in requests()]
    assert [r.token_ids for r in results] == reference
    drafted, accepted = sum(r.stats.drafted for r in results), sum(r.stats.accepted for r in results)
    assert drafted > 0
    # a batch of 4 speculates in few rounds here (its schedule weighs the rows' measured costs): 22 and
    # 29 draft tokens in two builds, 7 accepted each; the rate is judged where there are enough of them
    if drafted >= 100:
        assert accepted > 0.3 * drafted


def test_the_server_answers_a_seed_alike_with_and_without_speculation(pair, reference):  # noqa: F811
    """Through the ``openai`` client: ``"speculative": false`` (the target alone) against the default."""
    import openai

    target, draft = pair
    engine = Engine(target, draft, SpeculativeConfig(tree=2))
    asked = requests()[::5]
    with live_server(engine, max_batch=4) as (url, _):
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)

        def ask(messages, params, **extra):
            return client.chat.completions.create(
                model="tiny-qwen2", messages=messages, max_tokens=params.max_new_tokens,
                temperature=params.temperature, top_p=params.top_p, seed=params.seed,
                extra_body=extra | {"min_p": params.min_p, "typical_p": params.typical_p,
                                    "top_n_sigma": params.top_n_sigma})

        for messages, params in asked:
            spec, alone = ask(messages, params), ask(messages, params, speculative=False)
            assert spec.choices[0].message.content == alone.choices[0].message.content
            assert spec.model_extra["anyspec"]["seed"] == params.seed
            assert spec.model_extra["anyspec"]["speculative"]
            assert not alone.model_extra["anyspec"]["speculative"]
        messages, params = asked[0]
        spec, alone = (client.chat.completions.create(
            model="tiny-qwen2", messages=messages, max_tokens=12, temperature=1.0, seed=5, logprobs=True,
            top_logprobs=3, extra_body=extra) for extra in ({}, {"speculative": False}))
        assert spec.choices[0].logprobs.content == alone.choices[0].logprobs.content
        assert len(spec.choices[0].logprobs.content) == spec.usage.completion_tokens
        unseeded = ask(asked[0][0], SamplingParams(temperature=1.0, max_new_tokens=12))
        seed = unseeded.model_extra["anyspec"]["seed"]
        again = ask(asked[0][0], SamplingParams(temperature=1.0, max_new_tokens=12, seed=seed),
                    speculative=False)
    assert again.choices[0].message.content == unseeded.choices[0].message.content


BITS = "A random bit string: 0110100111010001011010"  # raw text: the next tokens are "0" and "1"


def first_two_pvalue(target, draft, temperature: float, seeds: range) -> float:
    """The chi-square p-value of the first two committed tokens after ``BITS`` (SLEM with branches,
    top-p 0.9) over ``seeds`` against the target's own joint distribution of them; 0 when a pair
    the target gives probability 0 is committed. The same two tokens are likely at both positions,
    so noise shared between positions would show. An end token ends the answer early, so pairs cut
    there count as one cell per first token."""
    settings = dict(temperature=temperature, top_p=0.9)
    ids, ends = encode_prompt(target.tokenizer, BITS)[0], end_ids(target)
    target.reset()
    first = logits_to_probs(target.extend(ids, last=1)[-1], **settings)
    joint: dict[tuple, float] = {}
    for a in torch.nonzero(first).flatten().tolist():
        if a in ends:
            joint[()] = joint.get((), 0.0) + float(first[a])
            continue
        target.crop(len(ids))
        second = logits_to_probs(target.extend([a])[-1], **settings)
        for b in torch.nonzero(second).flatten().tolist():
            cell = (a,) if b in ends else (a, b)
            joint[cell] = joint.get(cell, 0.0) + float(first[a]) * float(second[b])
    target.reset()
    engine = Engine(target, draft, SpeculativeConfig(tree=2))
    cells, counts = list(joint), torch.zeros(len(joint))
    for seed in seeds:
        got = tuple(engine.generate(BITS, SamplingParams(max_new_tokens=2, seed=seed, **settings)).token_ids)
        if got not in joint:
            return 0.0
        counts[cells.index(got)] += 1
    return chi_square_pvalue(counts, torch.tensor([joint[c] for c in cells]))


@pytest.mark.parametrize("temperature", [0.7, 1.0])
def test_the_real_pair_samples_the_targets_distribution(pair, temperature):  # noqa: F811
    assert first_two_pvalue(*pair, temperature, range(1000, 2000)) > 1e-3


def test_the_real_pair_check_catches_noise_reused_across_positions(pair, monkeypatch):  # noqa: F811
    """Negative control: every position reads position 0's noise (the target's and the draft's)."""
    key = gumbel.key
    monkeypatch.setattr(gumbel, "key", lambda seed, position, stream=0: key(seed, 0, stream))
    assert first_two_pvalue(*pair, 1.0, range(1000, 1300)) < 1e-3


def test_the_real_pair_check_catches_a_verify_that_lets_the_drafts_token_through(pair, monkeypatch):  # noqa: F811
    """Negative control: the draft's first proposed token is accepted whatever the target chose, so
    the draft's own distribution leaks into the committed tokens."""
    monkeypatch.setattr(tli, "verify_exact", lambda choice, ids: (1, choice[1]) if ids else (0, choice[0]))
    monkeypatch.setattr(tree, "verify_exact", lambda choice, tokens, parents: (
        ([0], choice[1]) if tokens else ([], choice[0])))
    assert first_two_pvalue(*pair, 1.0, range(1000, 1300)) < 1e-3


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_logprobs_are_the_targets_own_with_or_without_the_draft(pair, temperature):  # noqa: F811
    """Each token's logprob and its 3 likeliest, from the target's logits row that chose it: the same
    numbers with the draft (branches on) and alone, and as a plain forward of the whole answer gives."""
    target, draft = pair
    messages = prompts()[0]
    params = SamplingParams(temperature=temperature, max_new_tokens=24, seed=3, logprobs=3)
    spec = Engine(target, draft, SpeculativeConfig(tree=2)).generate(messages, params)
    alone = Engine(target, None).generate(messages, params)
    assert spec.token_ids == alone.token_ids and spec.logprobs == alone.logprobs
    assert [entry.token for entry in spec.logprobs] == spec.token_ids
    ids = encode_prompt(target.tokenizer, messages)[0]
    target.reset()
    rows = torch.log_softmax(target.extend(ids + spec.token_ids[:-1], last=len(spec.token_ids)), dim=-1)
    target.reset()
    for entry, row in zip(spec.logprobs, rows, strict=True):
        assert entry.logprob == float(row[entry.token])
        assert [i for i, _ in entry.top] == row.topk(3).indices.tolist()
        assert [lp for _, lp in entry.top] == row.topk(3).values.tolist()


def test_prompt_logprobs_are_a_plain_forwards_and_change_no_answer(pair):  # noqa: F811
    """Each prompt token's logprob after the ones before it (the first: None), across two prefill
    chunks: the numbers a plain forward of the whole prompt gives, the same with the draft and
    alone, when the slot already holds the prompt, and the answer the same as without them."""
    target, draft = pair
    text = " ".join(m["content"] for messages in prompts() for m in messages) * 2
    ids = target.tokenizer.encode(text)[:300]
    assert len(ids) > 256  # two chunks (batch.PREFILL_CHUNK)
    prompt = target.tokenizer.decode(ids)
    assert target.tokenizer.encode(prompt) == ids
    params = SamplingParams(max_new_tokens=8, prompt_logprobs=2)
    engine = Engine(target, draft, SpeculativeConfig(tree=2))
    plain = engine.generate(prompt, SamplingParams(max_new_tokens=8))
    spec = engine.generate(prompt, params)  # the slot holds the prompt from the answer before
    alone = Engine(target, None).generate(prompt, params)
    assert spec.token_ids == alone.token_ids == plain.token_ids and plain.prompt_logprobs is None
    assert spec.prompt_logprobs == alone.prompt_logprobs and spec.stats.prompt_cached == 0
    target.reset()
    rows = torch.log_softmax(target.extend(ids[:-1]), dim=-1)
    target.reset()
    first, *rest = spec.prompt_logprobs
    assert first is None and [e.token for e in rest] == ids[1:]
    for entry, row in zip(rest, rows, strict=True):
        assert entry.logprob == float(row[entry.token])
        assert entry.top == list(zip(row.topk(2).indices.tolist(), row.topk(2).values.tolist(), strict=True))


def test_a_suffix_asks_the_target_to_fill_in_the_middle(pair):  # noqa: F811
    """``suffix`` (completions): the prompt is the target's fill-in-the-middle prompt, and the answer
    is the engine's for it, with the draft and alone."""
    from anyspec.engine.prompt import fill_in_the_middle

    openai = pytest.importorskip("openai")
    target, draft = pair
    prefix, suffix = "def mean(xs):\n    ", "\n    return total / len(xs)\n"
    text = fill_in_the_middle(target.tokenizer, prefix, suffix)
    assert text == f"<|fim_prefix|>{prefix}<|fim_suffix|>{suffix}<|fim_middle|>"
    ids = target.tokenizer.encode(text)
    assert [target.tokenizer.convert_ids_to_tokens(i) for i in (ids[0], ids[-1])] == ["<|fim_prefix|>",
                                                                                      "<|fim_middle|>"]
    want = Engine(target, None).generate(text, SamplingParams(max_new_tokens=16)).text
    with live_server(Engine(target, draft), max_batch=2) as (url, _):
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
        for speculative in (True, False):
            out = client.completions.create(model="tiny-qwen2", prompt=prefix, suffix=suffix, max_tokens=16,
                                            temperature=0, extra_body={"speculative": speculative})
            assert out.choices[0].text == want and out.usage.prompt_tokens == len(ids)
    assert "total" in want  # the middle defines what the suffix uses


def test_the_draft_reads_the_text_before_the_hole_alone(pair):  # noqa: F811
    """The draft knows nothing of the target's FIM tokens: it reads the prefix, and the middle goes on
    from there; other prompts it reads whole."""
    from anyspec.engine.prompt import encode_prompt, fill_in_the_middle, infill_prefix

    target, draft = pair
    reader = Engine(target, draft).reader
    prefix, suffix = "def mean(xs):\n    ", "\n    return total / len(xs)\n"
    text = fill_in_the_middle(target.tokenizer, prefix, suffix)
    ctx = reader.start(text, text, target.tokenizer.encode(text))
    assert ctx.ids == encode_prompt(draft.tokenizer, prefix)[0] and infill_prefix(text) == prefix
    plain = prefix + "total = sum(xs)"
    assert reader.start(plain, plain, []).ids == encode_prompt(draft.tokenizer, plain)[0]
