"""The OpenAI-compatible server over real HTTP on 127.0.0.1, driven by the official ``openai`` client.

Tiny random-weight models with real tokenizers (a Qwen2 target, a Llama/SentencePiece draft), loaded
from disk by path. Every greedy answer is compared with a second, in-process engine over the same
folders: the server must give exactly what the engine gives alone.
"""

import re
import time

import pytest

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

from live_server import CHAT, MODEL_NAME, greedy, live_server, load_engine, one_thread  # noqa: E402, F401
from test_linear import needs_rowwise  # noqa: E402

from anyspec.algorithms import ngram  # noqa: E402
from anyspec.engine import SamplingParams  # noqa: E402
from anyspec.engine.prompt import encode_prompt, end_ids  # noqa: E402


def metric(text: str, name: str) -> float:
    match = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
    assert match, f"{name} missing from /metrics"
    return float(match.group(1))


def test_models_and_health(server, client):
    assert [m.id for m in client.models.list().data] == [MODEL_NAME]
    assert 0 < time.time() - client.models.list().data[0].created < 3600  # when the server put it up
    assert client.models.retrieve(MODEL_NAME).id == MODEL_NAME
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4o")
    health = httpx.get(server + "/health")
    assert health.status_code == 200 and health.json()["status"] == "ok"


def test_completion_equals_engine_alone(client, reference):
    prompt = "def fibonacci(n):"
    out = client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=12, temperature=0)
    alone = reference.generate(prompt, greedy(12))
    assert out.choices[0].text == alone.text
    assert out.choices[0].finish_reason == alone.finish_reason
    assert out.usage.prompt_tokens == alone.stats.prompt_tokens
    assert out.usage.completion_tokens == len(alone.token_ids)
    assert out.usage.total_tokens == out.usage.prompt_tokens + out.usage.completion_tokens
    assert 0 <= out.usage.prompt_tokens_details.cached_tokens < out.usage.prompt_tokens
    stats = out.model_extra["anyspec"]
    assert stats["speculative"] is True and stats["drafted"] > 0 and 0 <= stats["acceptance_rate"] <= 1


def test_streamed_completion_equals_plain(client, reference):
    prompt = "The capital of France is"
    chunks = list(client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=10, temperature=0,
                                            stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    alone = reference.generate(prompt, greedy(10))
    assert text == alone.text
    assert len([c for c in chunks if c.choices and c.choices[0].text]) > 1, "expected several text chunks"
    finals = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finals == [alone.finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == len(alone.token_ids)


def test_chat_uses_the_chat_template(client, reference):
    out = client.chat.completions.create(model=MODEL_NAME, messages=CHAT, max_tokens=8, temperature=0)
    alone = reference.generate(CHAT, greedy(8))
    plain = reference.generate("Name a prime.", greedy(8))
    assert out.choices[0].message.role == "assistant"
    assert out.choices[0].message.content == alone.text
    assert out.usage.prompt_tokens == alone.stats.prompt_tokens > plain.stats.prompt_tokens


def test_streamed_chat(client, reference):
    chunks = list(client.chat.completions.create(model=MODEL_NAME, messages=CHAT, max_tokens=8,
                                                 temperature=0, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert text == reference.generate(CHAT, greedy(8)).text
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")
    assert all(c.usage is None for c in chunks), "usage is only sent when stream_options asks for it"


def test_speculation_off_per_request(client, reference):
    prompt = "import numpy as np\n"
    on = client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=10, temperature=0)
    off = client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=10, temperature=0,
                                    extra_body={"speculative": False})
    assert off.choices[0].text == on.choices[0].text == reference.generate(prompt, greedy(10)).text
    assert on.model_extra["anyspec"]["drafted"] > 0
    assert off.model_extra["anyspec"]["speculative"] is False and off.model_extra["anyspec"]["drafted"] == 0


def test_seeded_sampling_is_reproducible(client, reference):
    kw = dict(model=MODEL_NAME, prompt="Once upon a time", max_tokens=10, temperature=0.9, top_p=0.95)
    a = client.completions.create(seed=7, **kw).choices[0].text
    b = client.completions.create(seed=7, **kw).choices[0].text
    c = client.completions.create(seed=8, extra_body={"top_k": 50}, **kw).choices[0].text
    assert a == b == reference.generate("Once upon a time", SamplingParams(
        temperature=0.9, top_p=0.95, max_new_tokens=10, seed=7)).text
    assert c == reference.generate("Once upon a time", SamplingParams(
        temperature=0.9, top_p=0.95, top_k=50, max_new_tokens=10, seed=8)).text
    d = client.completions.create(seed=7, extra_body={"min_p": 0.5}, **kw).choices[0].text
    assert d != a and d == reference.generate("Once upon a time", SamplingParams(
        temperature=0.9, top_p=0.95, min_p=0.5, max_new_tokens=10, seed=7)).text


def test_n_choices_are_the_engines_answers_with_seed_plus_i(client, reference):
    """Choice i is the engine's answer with the request's seed + i: one sampled request with n = 3
    gives three answers, each the same with or without the others beside it."""
    prompt, kw = "Once upon a time", dict(temperature=1.0, max_tokens=10)
    out = client.completions.create(model=MODEL_NAME, prompt=prompt, n=3, seed=41, **kw)
    want = [reference.generate(prompt, SamplingParams(temperature=1.0, max_new_tokens=10, seed=41 + i))
            for i in range(3)]
    assert [c.index for c in out.choices] == [0, 1, 2]
    assert [c.text for c in out.choices] == [w.text for w in want]
    assert len({c.text for c in out.choices}) > 1, "the choices must not share their noise"
    assert [c.finish_reason for c in out.choices] == [w.finish_reason for w in want]
    assert out.usage.prompt_tokens == want[0].stats.prompt_tokens
    assert out.usage.completion_tokens == sum(len(w.token_ids) for w in want)
    stats = out.model_extra["anyspec"]
    assert [c["seed"] for c in stats["choices"]] == [41, 42, 43] and stats["speculative"] is True
    one = client.completions.create(model=MODEL_NAME, prompt=prompt, seed=42, **kw)
    assert one.choices[0].text == out.choices[1].text

    unseeded = client.completions.create(model=MODEL_NAME, prompt=prompt, n=2, **kw)
    seeds = [c["seed"] for c in unseeded.model_extra["anyspec"]["choices"]]
    assert seeds[0] != seeds[1]
    assert [c.text for c in unseeded.choices] == [reference.generate(prompt, SamplingParams(
        temperature=1.0, max_new_tokens=10, seed=s)).text for s in seeds]
    # a drawn seed is one a JavaScript client, reading numbers as doubles, sends back unchanged
    assert all(0 <= s < 2**53 for s in seeds)
    none = client.completions.create(model=MODEL_NAME, prompt=prompt, n=3, seed=-1, **kw)  # llama.cpp's
    drawn = [c["seed"] for c in none.model_extra["anyspec"]["choices"]]  # "a random seed", as if absent
    assert len(set(drawn)) == 3 and all(0 <= s < 2**53 for s in drawn)
    assert [c.text for c in none.choices] == [reference.generate(prompt, SamplingParams(
        temperature=1.0, max_new_tokens=10, seed=s)).text for s in drawn]
    top = client.completions.create(model=MODEL_NAME, prompt=prompt, n=2, seed=2**64 - 1, **kw)
    assert [c["seed"] for c in top.model_extra["anyspec"]["choices"]] == [2**64 - 1, 0]


def test_n_choices_streamed_are_the_whole_answers(client):
    kw = dict(model=MODEL_NAME, messages=CHAT, max_tokens=8, temperature=0.8, seed=5, n=3)
    whole = client.chat.completions.create(**kw)
    chunks = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw))
    texts, roles, finals = ["", "", ""], [0, 0, 0], [[], [], []]
    for c in chunks[:-1]:
        (choice,) = c.choices
        texts[choice.index] += choice.delta.content or ""
        roles[choice.index] += choice.delta.role == "assistant"
        if choice.finish_reason:
            finals[choice.index].append(choice.finish_reason)
    assert texts == [c.message.content for c in whole.choices]
    assert roles == [1, 1, 1] and finals == [[c.finish_reason] for c in whole.choices]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    greedy_two = client.chat.completions.create(**(kw | {"temperature": 0, "n": 2}))
    assert greedy_two.choices[0].message.content == greedy_two.choices[1].message.content


def test_several_prompts_and_token_id_prompts(client, reference):
    """An array of prompts gets n choices each, in order (prompt 1's after prompt 0's), each the
    engine's answer for its prompt and seed + i; a prompt of token ids is read as those ids."""
    prompts = ["def fibonacci(n):", "The capital of France is"]
    out = client.completions.create(model=MODEL_NAME, prompt=prompts, n=2, seed=3, temperature=0.9,
                                    max_tokens=8)
    want = [reference.generate(p, SamplingParams(temperature=0.9, max_new_tokens=8, seed=3 + i))
            for p in prompts for i in range(2)]
    assert [c.index for c in out.choices] == [0, 1, 2, 3]
    assert [c.text for c in out.choices] == [w.text for w in want]
    assert out.usage.prompt_tokens == want[0].stats.prompt_tokens + want[2].stats.prompt_tokens
    assert out.usage.completion_tokens == sum(len(w.token_ids) for w in want)

    tokenizer = reference.target.tokenizer
    ids = tokenizer.encode(prompts[0])
    by_ids = client.completions.create(model=MODEL_NAME, prompt=ids, max_tokens=8, temperature=0)
    assert by_ids.choices[0].text == reference.generate(prompts[0], greedy(8)).text
    odd = [t for piece in ("def", " fib", "on", "acci")
           for t in tokenizer.encode(piece, add_special_tokens=False)]
    odd += [tokenizer.convert_tokens_to_ids(c) for c in "(n):"]  # not how the text encodes
    assert odd != tokenizer.encode("def fibonacci(n):", add_special_tokens=False)
    both = client.completions.create(model=MODEL_NAME, prompt=[odd, odd], max_tokens=8, temperature=0)
    alone = client.completions.create(model=MODEL_NAME, prompt=odd, max_tokens=8, temperature=0,
                                      extra_body={"speculative": False})
    assert both.usage.prompt_tokens == 2 * len(odd) and alone.usage.prompt_tokens == len(odd)
    assert [c.text for c in both.choices] == [alone.choices[0].text] * 2


def test_echo_gives_the_prompt_and_its_logprobs(client, reference):
    """lm-eval's loglikelihood request (token-id prompts, ``echo``, ``logprobs`` 1, ``max_tokens`` 1):
    each choice's text and logprobs begin with its prompt's, the first token's logprob null and the
    others the engine's prompt logprobs; without logprobs, and streamed, the prompt comes first."""
    tokenizer = reference.target.tokenizer
    texts = ["def fibonacci(n):", "The capital of France is Paris"]
    ids = [tokenizer.encode(t) for t in texts]
    out = client.completions.create(model=MODEL_NAME, prompt=ids, echo=True, logprobs=1, max_tokens=1,
                                    temperature=0)
    for choice, prompt, text in zip(out.choices, ids, texts, strict=True):
        want = reference.generate(text, SamplingParams(max_new_tokens=1, logprobs=1, prompt_logprobs=1))
        lp = choice.logprobs
        assert choice.text == tokenizer.decode(prompt) + want.text
        assert len(lp.tokens) == len(lp.token_logprobs) == len(prompt) + 1
        assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
        assert lp.token_logprobs[1:-1] == [e.logprob for e in want.prompt_logprobs[1:]]
        assert lp.token_logprobs[-1] == want.logprobs[0].logprob
        assert [max(top.values()) for top in lp.top_logprobs[1:-1]] == [
            e.top[0][1] for e in want.prompt_logprobs[1:]]
        assert lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset)
    plain = client.completions.create(model=MODEL_NAME, prompt=texts[0], echo=True, max_tokens=6,
                                      temperature=0)
    assert plain.choices[0].text == texts[0] + reference.generate(texts[0], greedy(6)).text
    assert plain.choices[0].logprobs is None
    chunks = list(client.completions.create(model=MODEL_NAME, prompt=texts[0], echo=True, max_tokens=6,
                                            temperature=0, stream=True))
    assert chunks[0].choices[0].text == texts[0]
    assert "".join(c.choices[0].text for c in chunks) == plain.choices[0].text


def test_echo_with_max_tokens_0_scores_the_prompt_alone(client, reference):
    """OpenAI's legacy scoring request (``echo``, ``max_tokens`` 0, ``logprobs``): the prompt and its
    tokens' logprobs, nothing generated; without logprobs the prompt alone; without ``echo``, 0 is
    still refused."""
    text = "def fibonacci(n):"
    want = reference.generate(text, SamplingParams(max_new_tokens=1, prompt_logprobs=2))
    out = client.completions.create(model=MODEL_NAME, prompt=text, echo=True, logprobs=2, max_tokens=0)
    choice, lp = out.choices[0], out.choices[0].logprobs
    assert choice.text == text and choice.finish_reason == "length" and out.usage.completion_tokens == 0
    assert lp.token_logprobs == [None] + [e.logprob for e in want.prompt_logprobs[1:]]
    assert "".join(lp.tokens) == text and out.usage.prompt_tokens == len(lp.tokens)
    plain = client.completions.create(model=MODEL_NAME, prompt=text, echo=True, max_tokens=0)
    assert plain.choices[0].text == text and plain.choices[0].logprobs is None
    with pytest.raises(openai.BadRequestError, match="0 only with 'echo'"):
        client.completions.create(model=MODEL_NAME, prompt=text, max_tokens=0)


def _sse_data(response) -> list:
    """A streamed answer's ``data:`` payloads, JSON but the last (``[DONE]``)."""
    import json

    data = [line[len("data: "):] for line in response.text.splitlines() if line.startswith("data: ")]
    return [json.loads(d) for d in data[:-1]] + data[-1:]


def _echoed(url: str, stream: bool, **body) -> dict:
    """A completion that echoes its prompt and generates nothing, whole or streamed (then its choices'
    text and finish reasons put together, and the usage), within 30 s."""
    sent = {"model": MODEL_NAME, "echo": True, "max_tokens": 0, "stream": stream} | body
    if stream:
        sent["stream_options"] = {"include_usage": True}
    answer = httpx.post(url + "/v1/completions", json=sent, timeout=30)
    assert answer.status_code == 200, answer.text
    if not stream:
        return answer.json()
    chunks = _sse_data(answer)
    assert chunks[-1] == "[DONE]"
    choices: dict[int, dict] = {}
    for chunk in chunks[:-1]:
        for c in chunk["choices"]:
            got = choices.setdefault(c["index"], {"index": c["index"], "text": "", "finish_reason": None})
            got["text"] += c["text"]
            got["finish_reason"] = c["finish_reason"] or got["finish_reason"]
    return {"choices": [choices[i] for i in sorted(choices)], "usage": chunks[-2]["usage"]}


@needs_rowwise
def test_echo_with_max_tokens_0_answers_where_the_prompt_needs_no_forward(folders):
    """A prompt to score that leaves the target nothing to read answers all the same, whole or
    streamed: one the prefix cache holds whole (asked again, without logprobs), and one of a single
    token (whose logprob is None); with ``n`` and prompt arrays too. No slot stays taken."""
    with live_server(load_engine(*folders, dtype="int8"), queue_size=8) as (url, _):
        for stream in (False, True):
            prompt = "def add(a, b):" + " # streamed" * stream
            first, again = (_echoed(url, stream, prompt=prompt) for _ in range(2))
            for out in (first, again):
                (choice,) = out["choices"]
                assert choice["text"] == prompt and choice["finish_reason"] == "length"
            usage = again["usage"]
            assert usage["prompt_tokens_details"]["cached_tokens"] == usage["prompt_tokens"] - 1
            choices = _echoed(url, stream, prompt=["x", prompt], n=2)["choices"]
            assert [(c["index"], c["text"], c["finish_reason"]) for c in choices] == [
                (0, "x", "length"), (1, "x", "length"), (2, prompt, "length"), (3, prompt, "length")]
        (choice,) = _echoed(url, False, prompt="x", logprobs=1)["choices"]
        assert choice["text"] == "x" and choice["logprobs"]["token_logprobs"] == [None]
        choices = _echoed(url, False, prompt=["x", "y"], logprobs=1, n=2)["choices"]
        assert [c["logprobs"]["tokens"] for c in choices] == [["x"], ["x"], ["y"], ["y"]]
        assert httpx.get(url + "/health").json()["running"] == 0


@pytest.mark.parametrize("chat", [False, True])
def test_streamed_logprobs_are_the_whole_answers(client, chat):
    """Each chunk carries the logprobs of the tokens committed since the one before; put together
    they are the whole answer's, also where a stop string held tokens back and cut the answer."""
    tokens = client.completions.create(model=MODEL_NAME, prompt="SELECT * FROM", max_tokens=16,
                                       temperature=0, logprobs=0).choices[0].logprobs.tokens
    text = "".join(tokens)  # a one-character stop string that is a whole token: nothing is held back
    stop = next(t for i, t in enumerate(tokens)  # for it, and its token's entry comes with no text
                if i > 2 and len(t) == 1 and t.strip() and text.find(t) == len("".join(tokens[:i])))
    for extra in ({}, {"stop": [stop], "extra_body": {"speculative": False}}):  # a token a round
        if chat:
            kw = dict(model=MODEL_NAME, messages=CHAT, max_tokens=16, temperature=0.9, seed=2, logprobs=True,
                      top_logprobs=2, **extra)
            whole = client.chat.completions.create(**kw).choices[0].logprobs.content
            chunks = list(client.chat.completions.create(stream=True, **kw))
            streamed = [e for c in chunks if c.choices and c.choices[0].logprobs
                        for e in c.choices[0].logprobs.content]
            assert [e.model_dump() for e in streamed] == [e.model_dump() for e in whole]
        else:
            kw = dict(model=MODEL_NAME, prompt="SELECT * FROM", max_tokens=16, temperature=0, logprobs=2,
                      **extra)
            whole = client.completions.create(**kw).choices[0].logprobs
            chunks = list(client.completions.create(stream=True, **kw))
            parts = [c.choices[0].logprobs for c in chunks if c.choices[0].logprobs]
            assert [t for p in parts for t in p.tokens] == whole.tokens
            assert [x for p in parts for x in p.token_logprobs] == whole.token_logprobs
            assert [t for p in parts for t in p.top_logprobs] == whole.top_logprobs
            assert [t for p in parts for t in p.text_offset] == whole.text_offset
        assert len([c for c in chunks if c.choices and c.choices[0].logprobs]) > 1


def test_penalties_and_logit_bias_are_the_engines(client, reference):
    kw = dict(model=MODEL_NAME, prompt="Once upon a time", max_tokens=12, temperature=0)
    token = 1000
    forced = client.completions.create(logit_bias={str(token): 100}, **kw).choices[0].text
    assert forced == reference.target.tokenizer.decode([token] * 12)  # the bias is applied
    got = client.completions.create(frequency_penalty=1.5, presence_penalty=0.5,
                                    logit_bias={str(token): 10, "15": -100}, **kw).choices[0].text
    want = reference.generate("Once upon a time", SamplingParams(
        max_new_tokens=12, frequency_penalty=1.5, presence_penalty=0.5, logit_bias={token: 10.0, 15: -100.0}))
    assert got != forced and got == want.text
    # the repetition penalty divides the biased token's logit once it is written: others win
    biased = client.completions.create(logit_bias={str(token): 5}, **kw).choices[0].text
    kept = client.completions.create(logit_bias={str(token): 5}, extra_body={"repetition_penalty": 100},
                                     **kw).choices[0].text
    want = reference.generate("Once upon a time", SamplingParams(
        max_new_tokens=12, logit_bias={token: 5.0}, repetition_penalty=100))
    assert biased == forced and kept != forced and kept == want.text


def test_min_tokens_and_ignore_eos_hold_back_an_end_the_bias_forces(client, reference):
    """A bias that makes an end-of-sequence token the likeliest ends the answer at once; vLLM's
    ``min_tokens`` holds it back for that many tokens, ``ignore_eos`` up to ``max_tokens``."""
    eos = min(end_ids(reference.target))
    kw = dict(model=MODEL_NAME, prompt="Once upon a time", max_tokens=9, temperature=0,
              logit_bias={str(eos): 100})
    ended = client.completions.create(**kw)
    assert ended.usage.completion_tokens == 0 and ended.choices[0].finish_reason == "stop"
    held = client.completions.create(**kw, extra_body={"min_tokens": 4})
    assert held.usage.completion_tokens == 4 and held.choices[0].finish_reason == "stop"
    ignored = client.completions.create(**kw, extra_body={"ignore_eos": True})
    assert ignored.usage.completion_tokens == 9 and ignored.choices[0].finish_reason == "length"
    want = reference.generate("Once upon a time", SamplingParams(max_new_tokens=9, logit_bias={eos: 100.0},
                                                                 ignore_eos=True))
    assert ignored.choices[0].text == want.text


def test_stop_token_ids_end_the_answer_with_the_token_and_wait_for_min_tokens(client, reference):
    prompt = "SELECT * FROM"
    full = reference.generate(prompt, greedy(16))
    stop = full.token_ids[4]
    kw = dict(model=MODEL_NAME, prompt=prompt, max_tokens=16, temperature=0)
    ended = client.completions.create(**kw, extra_body={"stop_token_ids": [stop]})
    first = full.token_ids.index(stop) + 1
    assert ended.usage.completion_tokens == first and ended.choices[0].finish_reason == "stop"
    assert ended.choices[0].model_extra["stop_reason"] == stop
    assert ended.choices[0].text == reference.target.tokenizer.decode(full.token_ids[:first])
    held = client.completions.create(**kw, extra_body={"stop_token_ids": [stop], "min_tokens": first + 1})
    assert held.usage.completion_tokens > first


def test_allowed_token_ids_hold_every_token_of_the_answer(client, reference):
    prompt, allowed = "SELECT * FROM", [1000, 2000, 3000]
    out = client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=8, temperature=0,
                                    logprobs=0, extra_body={"allowed_token_ids": allowed})
    want = reference.generate(prompt, SamplingParams(max_new_tokens=8, allowed_token_ids=allowed))
    assert out.choices[0].text == want.text and set(want.token_ids) <= set(allowed)
    assert set(reference.generate(prompt, greedy(8)).token_ids) - set(allowed)


@pytest.mark.parametrize("as_list", [False, True])
def test_stop_strings(client, reference, as_list):
    prompt = "SELECT * FROM"
    full = reference.generate(prompt, greedy(16)).text
    stop = full[len(full) // 2: len(full) // 2 + 2]
    assert stop.strip(), f"pick a visible stop string from {full!r}"
    out = client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=16, temperature=0,
                                    stop=[stop, "never-seen"] if as_list else stop)
    assert out.choices[0].text == full[:full.index(stop)]
    assert out.choices[0].finish_reason == "stop" and out.choices[0].model_extra["stop_reason"] == stop
    streamed = list(client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=16, temperature=0,
                                              stop=stop, stream=True))
    assert streamed[-1].choices[0].model_extra["stop_reason"] == stop
    plain = client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=16, temperature=0)
    assert plain.choices[0].model_extra["stop_reason"] is None
    kept = client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=16, temperature=0, stop=stop,
                                     extra_body={"include_stop_str_in_output": True})
    assert kept.choices[0].text == full[:full.index(stop) + len(stop)]


def test_metrics(server, client):
    before = httpx.get(server + "/metrics").text
    client.completions.create(model=MODEL_NAME, prompt="count: 1, 2,", max_tokens=5, temperature=0)
    after = httpx.get(server + "/metrics")
    assert after.status_code == 200 and after.headers["content-type"].startswith("text/plain")
    key = 'anyspec_requests_total{path="/v1/completions",status="200"}'
    assert metric(after.text, key) == (metric(before, key) if key in before else 0) + 1
    tokens = "anyspec_generated_tokens_total"
    assert metric(after.text, tokens) >= metric(before, tokens) + 1
    assert metric(after.text, "anyspec_draft_tokens_total") > 0
    assert 0 <= metric(after.text, "anyspec_acceptance_rate") <= 1
    assert metric(after.text, "anyspec_mean_accepted_length") >= 0
    assert metric(after.text, "anyspec_tokens_per_second") > 0
    assert metric(after.text, "anyspec_queue_depth") == 0
    assert metric(after.text, "anyspec_model_passes_total") > metric(before, "anyspec_model_passes_total")
    assert metric(after.text, "anyspec_mean_batch_size") >= 1
    assert metric(after.text, "anyspec_request_acceptance_rate_count") >= 1
    assert 0 <= metric(after.text, "anyspec_request_acceptance_rate_sum") <= metric(
        after.text, "anyspec_request_acceptance_rate_count")
    buckets = [metric(after.text, f'anyspec_request_acceptance_rate_bucket{{le="{b}"}}')
               for b in ("0.1", "0.5", "1", "+Inf")]
    count = metric(after.text, "anyspec_request_acceptance_rate_count")
    assert buckets == sorted(buckets) and buckets[-1] == count
    for name in ("anyspec_requests_total", "anyspec_acceptance_rate", "anyspec_queue_depth",
                 "anyspec_request_acceptance_rate", "anyspec_batch_size"):
        assert f"# TYPE {name} " in after.text


@needs_rowwise
def test_prefix_cache_over_http_reuses_the_system_prompt_and_changes_no_answer(folders):
    """int8 models run the lean, row-invariant stack: a second chat reuses the first one's prefix."""
    cold = load_engine(*folders, dtype="int8", prefix_cache=False)
    chats = [CHAT, [CHAT[0], {"role": "user", "content": "Name an even number."}]]
    want = [cold.generate(chat, greedy(10)).text for chat in chats]
    with live_server(load_engine(*folders, dtype="int8"), queue_size=4) as (url, _):
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
        outs = [client.chat.completions.create(model=MODEL_NAME, messages=chat, max_tokens=10, temperature=0)
                for chat in chats]
        metrics = httpx.get(url + "/metrics").text
    assert [o.choices[0].message.content for o in outs] == want
    cached = [o.usage.prompt_tokens_details.cached_tokens for o in outs]
    assert cached[0] == 0 and 0 < cached[1] < outs[1].usage.prompt_tokens
    assert metric(metrics, "anyspec_prompt_tokens_total") == sum(o.usage.prompt_tokens for o in outs)
    assert metric(metrics, "anyspec_prompt_cached_tokens_total") == cached[1]
    assert metric(metrics, "anyspec_prefill_seconds_total") > 0


def test_a_request_renders_and_encodes_its_prompt_once(folders, reference):
    """The request's check encodes the chat prompt (on the app's own copy of the tokenizer); the
    worker reuses those ids for the prefix cache and the prefill instead of encoding it again."""
    engine = load_engine(*folders)
    with live_server(engine) as (url, _):
        tokenizer, rendered = engine.target.tokenizer, []
        original = tokenizer.apply_chat_template
        tokenizer.apply_chat_template = lambda *a, **kw: rendered.append(1) or original(*a, **kw)
        try:
            client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
            for _ in range(2):  # the second runs in the slot the first left: the prefix cache looks
                out = client.chat.completions.create(model=MODEL_NAME, messages=CHAT, max_tokens=6,
                                                     temperature=0)
        finally:
            del tokenizer.apply_chat_template
    assert rendered == []  # the worker's tokenizer never rendered the template
    alone = reference.generate(CHAT, greedy(6))
    assert out.choices[0].message.content == alone.text
    assert out.usage.prompt_tokens == alone.stats.prompt_tokens


def test_tokenize_gives_the_ids_a_request_holds_and_detokenize_their_text(server, client, reference):
    """vLLM's ``/tokenize`` and ``/detokenize``: a completion's prompt and a chat's messages become the
    ids the generation endpoints read (their ``usage.prompt_tokens``), and ids become text again."""
    tokenizer = reference.target.tokenizer
    prompt = "def add(a, b):\n    return"
    got = httpx.post(server + "/tokenize", json={"model": MODEL_NAME, "prompt": prompt}).json()
    assert got["tokens"] == encode_prompt(tokenizer, prompt)[0] and got["count"] == len(got["tokens"])
    assert got["max_model_len"] == reference.target.context_length
    used = client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=1, temperature=0).usage
    assert used.prompt_tokens == got["count"]
    chat = httpx.post(server + "/tokenize", json={"messages": CHAT}).json()
    assert chat["tokens"] == encode_prompt(tokenizer, CHAT)[0]
    asked = client.chat.completions.create(model=MODEL_NAME, messages=CHAT, max_tokens=1, temperature=0)
    assert asked.usage.prompt_tokens == chat["count"] > got["count"]
    text = httpx.post(server + "/detokenize", json={"tokens": got["tokens"]}).json()["prompt"]
    assert text == tokenizer.decode(got["tokens"]) and prompt in text
    assert "token_strs" not in got
    named = httpx.post(server + "/tokenize", json={"prompt": prompt, "return_token_strs": True}).json()
    assert named["token_strs"] == tokenizer.convert_ids_to_tokens(got["tokens"])
    assert "Ġreturn" in named["token_strs"]
    partial = [*CHAT, {"role": "assistant", "content": "Seven"}]
    going_on = httpx.post(server + "/tokenize", json={"messages": partial, "continue_final_message": True,
                                                      "add_generation_prompt": False}).json()
    assert going_on["tokens"] == encode_prompt(tokenizer, [*CHAT, partial[-1] | {"prefix": True}])[0]


def test_a_prediction_is_taken_where_the_answer_repeats_it_and_changes_nothing(client, reference):
    """OpenAI's Predicted Outputs (``prediction``): the answer is the engine's alone, streamed or
    not, on chat and completions; ``usage.completion_tokens_details`` counts the prediction's tokens
    the answer took (``accepted_prediction_tokens``) and the rest."""
    alone = reference.generate(CHAT, greedy(24))
    right = client.chat.completions.create(model=MODEL_NAME, messages=CHAT, max_tokens=24, temperature=0,
                                           prediction={"type": "content", "content": alone.text})
    details = right.usage.completion_tokens_details
    assert right.choices[0].message.content == alone.text
    predicted = reference.target.tokenizer.encode(alone.text, add_special_tokens=False)
    assert details.accepted_prediction_tokens == ngram.matched(predicted, alone.token_ids) > 8
    assert details.accepted_prediction_tokens + details.rejected_prediction_tokens == len(predicted)
    again = client.chat.completions.create(model=MODEL_NAME, messages=CHAT, max_tokens=24, temperature=0,
                                           prediction={"type": "content", "content": alone.text})
    assert again.usage.completion_tokens_details == details  # counted from the texts, not the rounds
    parts = [{"type": "text", "text": "Lorem ipsum "}, {"type": "text", "text": "dolor sit amet."}]
    chunks = list(client.chat.completions.create(
        model=MODEL_NAME, messages=CHAT, max_tokens=24, temperature=0, stream=True,
        stream_options={"include_usage": True}, prediction={"type": "content", "content": parts}))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == alone.text
    assert chunks[-1].usage.completion_tokens_details.accepted_prediction_tokens < 3
    prompt = "def fibonacci(n):"
    want = reference.generate(prompt, greedy(16)).text
    out = client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=16, temperature=0,
                                    extra_body={"prediction": {"type": "content", "content": want}})
    assert out.choices[0].text == want and out.usage.completion_tokens_details.accepted_prediction_tokens > 4
    plain = client.chat.completions.create(model=MODEL_NAME, messages=CHAT, max_tokens=4, temperature=0)
    assert plain.usage.completion_tokens_details is None  # no prediction: no count of one


@pytest.mark.parametrize(("prediction", "param"), [
    ("text", "prediction"), ({"type": "text", "content": "x"}, "prediction.type"),
    ({"type": "content", "content": 5}, "prediction.content"),
    ({"type": "content", "content": [{"type": "image_url"}]}, "prediction.content"),
    ({"type": "content", "content": "caf\udce9"}, "prediction.content")])
def test_a_bad_prediction_is_a_400_naming_it(server, prediction, param):
    import json

    body = json.dumps({"model": MODEL_NAME, "messages": CHAT, "max_tokens": 2, "prediction": prediction},
                      ensure_ascii=True)
    answer = httpx.post(server + "/v1/chat/completions", content=body,
                        headers={"content-type": "application/json"})
    assert answer.status_code == 400 and answer.json()["error"]["param"] == param, answer.text


def test_a_control_token_among_the_likeliest_is_shown_by_its_name(reference):
    """A special token has no text; among ``top_logprobs`` it reads as its name (as vLLM shows it),
    so that two of them do not collapse into one completions key ``""``."""
    from anyspec.algorithms.sampling import TokenLogprob
    from anyspec.server.answers import logprobs_json
    from anyspec.server.metrics import Metrics
    from anyspec.server.scheduler import Scheduler

    tok = reference.target.tokenizer
    ends = [tok.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>")]
    word = tok.encode(" yes", add_special_tokens=False)[0]
    entry = TokenLogprob(word, -0.1, [(word, -0.1), (ends[0], -2.5), (ends[1], -3.0)])
    spelled = Scheduler(reference, 4, 300.0, Metrics())._spelled([entry])
    assert spelled == [(b" yes", -0.1, [(b" yes", -0.1), (b"<|im_end|>", -2.5), (b"<|endoftext|>", -3.0)])]
    completions = logprobs_json(False, spelled)[0]
    assert completions["top_logprobs"] == [{" yes": -0.1, "<|im_end|>": -2.5, "<|endoftext|>": -3.0}]
    assert completions["text_offset"] == [0]


def test_a_prediction_changes_no_sampled_choice_logprob_or_schema_held_answer(client, reference):
    """Beside n > 1 with a seed, logprobs, a JSON schema and ``"speculative": false``, the answers
    with a prediction are those without one, token for token; usage sums the choices' counts. (The
    tiny transformers models' rows are not computed alike in passes of other sizes, so a logprob
    may differ in its last bits: they are compared to 1e-4.)"""
    kw = dict(model=MODEL_NAME, messages=CHAT, max_tokens=12, temperature=0.9, seed=5, n=2, logprobs=True,
              top_logprobs=2)
    plain = client.chat.completions.create(**kw)
    text = plain.choices[0].message.content
    for extra in ({}, {"speculative": False}):
        predicted = client.chat.completions.create(**kw, extra_body={
            "prediction": {"type": "content", "content": text}} | extra)
        for got, want in zip(predicted.choices, plain.choices, strict=True):
            assert got.message.content == want.message.content and got.finish_reason == want.finish_reason
            entries = [(e, w) for e, w in zip(got.logprobs.content, want.logprobs.content, strict=True)]
            assert all(e.token == w.token and e.logprob == pytest.approx(w.logprob, abs=1e-4)
                       and len(e.top_logprobs) == 2 for e, w in entries)
        details = predicted.usage.completion_tokens_details
        assert details.accepted_prediction_tokens + details.rejected_prediction_tokens == 2 * len(
            reference.target.tokenizer.encode(text, add_special_tokens=False))
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    held = dict(model=MODEL_NAME, messages=CHAT, max_tokens=16, temperature=0, response_format={
        "type": "json_schema", "json_schema": {"name": "x", "schema": schema}})
    want = client.chat.completions.create(**held).choices[0].message.content
    got = client.chat.completions.create(**held, extra_body={"prediction": {"type": "content",
                                                                            "content": '{"a": 12345}'}})
    assert got.choices[0].message.content == want
