"""Bounded load against one live server: 20 concurrent streaming clients on the tiny transformers
pair (one generation at a time), and 32 on the default pair's GGUF files with ``max_batch=4``; every
fifth client hangs up midway.

No request may be lost or mixed up: every completed answer equals what the same request gives alone
(greedy, from an in-process engine), every hung-up generation is cancelled, ``/health`` answers OK
throughout, and the batched server never holds more than ``max_batch`` slots of KV caches. p50/p95
latencies are printed (run with ``-s``), never asserted.
"""

import asyncio
import re
import statistics
import time

import pytest

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

from live_server import MODEL_NAME, live_server, load_engine, one_thread, tiny_pair  # noqa: E402, F401

from anyspec.engine import SamplingParams  # noqa: E402


def plan(clients):
    """(prompt or messages, max_tokens, hangs_up) per client; chat and plain completions alternate."""
    out = []
    for i in range(clients):
        text = f"Request {i}: the number {i * 7} is" + " and then" * (i % 4)
        prompt = [{"role": "user", "content": text}] if i % 2 else text
        hangs_up = i % 5 == 4
        out.append((prompt, 60 if hangs_up else 4 + i % 6, hangs_up))
    return out


async def client_run(client, prompt, max_tokens, hangs_up):
    t0 = time.perf_counter()
    kw = dict(model=MODEL_NAME, max_tokens=max_tokens, temperature=0, stream=True)
    if isinstance(prompt, list):
        stream = await client.chat.completions.create(messages=prompt, **kw)
    else:
        stream = await client.completions.create(prompt=prompt, **kw)
    text, first, finish, chunks = "", None, None, 0
    async for chunk in stream:
        chunks += 1
        choice = chunk.choices[0]
        piece = (choice.delta.content if isinstance(prompt, list) else choice.text) or ""
        if piece and first is None:
            first = time.perf_counter() - t0
        text += piece
        finish = choice.finish_reason or finish
        if hangs_up and chunks == 3:
            await stream.close()
            return {"hung_up": True}
    latency = time.perf_counter() - t0
    return {"hung_up": False, "text": text, "finish": finish, "latency": latency, "ttft": first}


async def watch_health(url, stop, seen):
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        while not stop.is_set():
            r = await http.get("/health")
            seen.append((r.status_code, r.json()))
            await asyncio.sleep(0.1)


async def load(url, requests):
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    stop, seen = asyncio.Event(), []
    watcher = asyncio.create_task(watch_health(url, stop, seen))
    results = await asyncio.gather(*(client_run(client, *r) for r in requests))
    stop.set()
    await watcher
    await client.close()
    return results, seen


def generations(url, outcome):
    match = re.search(rf'^anyspec_generations_total{{outcome="{outcome}"}} (\S+)$',
                      httpx.get(url + "/metrics").text, re.M)
    return int(float(match.group(1))) if match else 0


@pytest.fixture(scope="module")
def gguf_engine():
    from anyspec.backends.gguf import GGUFModel
    from anyspec.engine import Engine, SpeculativeConfig
    from anyspec.models import DEFAULT_DRAFT, DEFAULT_TARGET, gguf_path

    target = GGUFModel(gguf_path(DEFAULT_TARGET), name="target")
    draft = GGUFModel(gguf_path(DEFAULT_DRAFT), name="draft")
    return Engine(target, draft, SpeculativeConfig(num_speculative_tokens=5))


def test_concurrent_streams_with_hang_ups(tok_qwen2, tok_llama2, tmp_path_factory):
    folders = tiny_pair(tok_qwen2, tok_llama2, tmp_path_factory.mktemp("tiny"))
    check_load(load_engine(*folders), lambda: load_engine(*folders), clients=20, max_batch=4, batched=False)


@pytest.mark.slow
def test_32_clients_on_the_batched_server(gguf_engine):
    check_load(gguf_engine, lambda: gguf_engine, clients=32, max_batch=4, batched=True)


def check_load(engine, reference_engine, clients, max_batch, batched):
    requests = plan(clients)
    with live_server(engine, queue_size=clients + 4, max_batch=max_batch) as (url, app):
        scheduler = app.state.scheduler
        results, seen = asyncio.run(load(url, requests))
        deadline = time.monotonic() + 60
        while generations(url, "completed") + generations(url, "cancelled") < clients:
            assert time.monotonic() < deadline, "some request was never finished nor cancelled"
            time.sleep(0.05)
        after = httpx.get(url + "/health").json()
        completed, cancelled = generations(url, "completed"), generations(url, "cancelled")
        metrics = httpx.get(url + "/metrics").text
        slots = scheduler.slots

    hung_up = sum(r[2] for r in requests)
    assert completed + cancelled == clients
    assert cancelled == hung_up, "each hang-up should cancel its 60-token generation"
    assert len(seen) >= 5 and all(status == 200 and body["status"] == "ok" for status, body in seen)
    assert max(body["queue_depth"] for _, body in seen) > 1, "the load never queued requests"
    assert after == {"status": "ok", "queue_depth": 0, "running": 0}
    assert slots <= max_batch, "more KV cache slots than --max-batch"
    widest = max(body["running"] for _, body in seen)
    if batched:
        assert widest >= 2, "the batched server never ran two requests together"
        assert float(re.search(r"^anyspec_mean_batch_size (\S+)$", metrics, re.M).group(1)) > 1
        free = [seq for slot in scheduler.free for seq in slot]
        assert len(free) == 2 * slots and all(seq.cache.capacity <= 4096 for seq in free)
    else:
        assert widest <= 1 and slots == 1, "a model with one KV cache runs one request at a time"

    reference = reference_engine()
    texts = []
    for (prompt, max_tokens, hangs_up), result in zip(requests, results, strict=True):
        assert result["hung_up"] == hangs_up
        if hangs_up:
            continue
        alone = reference.generate(prompt, SamplingParams(temperature=0, max_new_tokens=max_tokens))
        assert result["text"] == alone.text, f"answer to {prompt!r} differs from the same request alone"
        assert result["finish"] == alone.finish_reason
        texts.append(alone.text)
    assert len(set(texts)) > len(texts) // 2, "too few distinct answers to notice a mix-up"

    latencies = sorted(r["latency"] for r in results if not r["hung_up"])
    ttfts = sorted(r["ttft"] for r in results if not r["hung_up"] and r["ttft"] is not None)
    q = lambda xs: statistics.quantiles(xs, n=20, method="inclusive")  # noqa: E731
    print(f"\nload: {clients} streaming clients ({hung_up} hang up), {len(latencies)} completed, "
          f"{widest} at most together; latency p50 {statistics.median(latencies):.2f} s, "
          f"p95 {q(latencies)[18]:.2f} s; time to first token p50 {statistics.median(ttfts):.2f} s, "
          f"p95 {q(ttfts)[18]:.2f} s")


def test_jobs_that_arrive_together_compute_a_shared_system_prompt_once(gguf_engine):
    """Three chats with one long system prompt reach the scheduler before its first pass: one
    prefills the system prompt, the other two wait a pass and copy it; every answer equals the chat
    alone, computed cold."""
    from anyspec.config import SpeculativeConfig
    from anyspec.engine import Engine
    from anyspec.engine.prefix import common_prefix
    from anyspec.engine.prompt import encode_prompt
    from anyspec.server.metrics import Metrics
    from anyspec.server.scheduler import Job, Scheduler

    system = ("You answer questions about programming for a team of engineers. Be exact, be brief, "
              "and say which trade-off matters most in the case at hand.")
    chats = [[{"role": "system", "content": system}, {"role": "user", "content": q}]
             for q in ("What is a deque?", "Why is a set faster than a list for lookups?", "What is a heap?")]
    params = SamplingParams(temperature=0, max_new_tokens=8)
    cold = Engine(gguf_engine.target, gguf_engine.draft, SpeculativeConfig(prefix_cache=False))
    alone = [cold.generate(chat, params) for chat in chats]
    tokenizer = gguf_engine.target.tokenizer
    ids = [encode_prompt(tokenizer, chat)[0] for chat in chats]
    shared = min(common_prefix(ids[0], other) for other in ids[1:])
    assert shared > 30

    for seq in gguf_engine.target.sequences:  # no sequence may hold the system prompt before the test
        seq.reset()
    loop = asyncio.new_event_loop()
    scheduler = Scheduler(gguf_engine, 8, generation_timeout=600, metrics=Metrics(), max_batch=3)
    jobs = [Job(chat, params, True, len(i), loop) for chat, i in zip(chats, ids, strict=True)]
    for job in jobs:
        scheduler.submit(job)
    scheduler.run(alive=lambda: bool(scheduler.pending or scheduler.running))
    loop.run_until_complete(asyncio.sleep(0))  # deliver the events the worker emitted
    outcomes = []
    for job in jobs:
        events = [job.events.get_nowait() for _ in range(job.events.qsize())]
        assert events[-1][0] == "done", events[-1]
        outcomes.append(events[-1][1])
    loop.close()
    assert [o.text for o in outcomes] == [a.text for a in alone]
    cached = [o.stats.prompt_cached for o in outcomes]
    assert cached[0] == 0 and all(c >= shared for c in cached[1:]), cached
