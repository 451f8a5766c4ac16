"""Queueing, cancellation and timeouts of the one-generation-at-a-time server, over real HTTP.

A "long" request asks for 240 greedy tokens, several seconds on the tiny models; tests that hold the
worker with one close it themselves, so no test waits for one to finish.
"""

import re
import threading
import time

import pytest

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

from live_server import MODEL_NAME, live_server, load_engine, one_thread  # noqa: E402, F401

from anyspec.engine import SamplingParams  # noqa: E402

LONG = 240
TARGET_PASS = 0.01


@pytest.fixture(scope="module")
def engine(folders):
    """Shared by the servers below, one at a time: each stops its worker before the next starts.
    Each target pass takes at least TARGET_PASS seconds, so that a long request holds the worker for
    seconds however few passes it needs (the tiny draft gets nothing accepted, and its schedule then
    backs off to the target alone)."""
    engine = load_engine(*folders)
    extend = engine.target.extend

    def paced(*args, **kwargs):
        time.sleep(TARGET_PASS)
        return extend(*args, **kwargs)

    engine.target.extend = paced
    return engine


def client(url):
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)


def start_long_stream(url, prompt="A long story:"):
    """A streamed 240-token request, returned once its first chunk arrived (so it holds the worker)."""
    stream = client(url).completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=LONG, temperature=0,
                                            stream=True)
    chunks = iter(stream)
    next(chunks)
    return stream, chunks


def health(url):
    r = httpx.get(url + "/health")
    assert r.status_code == 200 and r.json()["status"] == "ok"
    return r.json()


def wait_until(check, timeout=30.0):
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.05)


def generations(url, outcome):
    match = re.search(rf'^anyspec_generations_total{{outcome="{outcome}"}} (\S+)$',
                      httpx.get(url + "/metrics").text, re.M)
    return float(match.group(1)) if match else 0.0


def in_thread(fn):
    box = {}
    thread = threading.Thread(target=lambda: box.update(result=fn()), daemon=True)
    thread.start()
    return thread, box


def test_full_queue_answers_429_with_retry_after(engine, reference):
    with live_server(engine, queue_size=1) as (url, _):
        stream, _ = start_long_stream(url)
        waiter, box = in_thread(lambda: client(url).completions.create(
            model=MODEL_NAME, prompt="queued", max_tokens=4, temperature=0))
        wait_until(lambda: health(url)["queue_depth"] == 1)
        r = httpx.post(url + "/v1/completions", json={"model": MODEL_NAME, "prompt": "one too many"})
        assert r.status_code == 429
        assert int(r.headers["retry-after"]) >= 1
        assert r.json()["error"]["type"] == "rate_limit_error" and r.json()["error"]["code"] == "queue_full"
        stream.close()
        waiter.join(timeout=60)
        assert box["result"].choices[0].text == reference.generate(
            "queued", SamplingParams(temperature=0, max_new_tokens=4)).text
        metrics = httpx.get(url + "/metrics").text
        assert 'anyspec_requests_total{path="/v1/completions",status="429"} 1.0' in metrics


def test_waiting_client_that_disconnects_frees_its_slot(engine):
    with live_server(engine, queue_size=1) as (url, _):
        stream, chunks = start_long_stream(url)
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(url + "/v1/completions", json={"model": MODEL_NAME, "prompt": "gives up"}, timeout=1.0)
        wait_until(lambda: health(url)["queue_depth"] == 0)
        assert health(url)["running"], "the long generation is still running"
        next(chunks)
        waiter, box = in_thread(lambda: httpx.post(url + "/v1/completions", timeout=60, json={
            "model": MODEL_NAME, "prompt": "next", "max_tokens": 3}))
        wait_until(lambda: health(url)["queue_depth"] == 1)
        stream.close()
        waiter.join(timeout=60)
        assert box["result"].status_code == 200
        wait_until(lambda: generations(url, "cancelled") == 2)  # the one that gave up, then the long one


def test_streaming_disconnect_cancels_the_generation(engine):
    with live_server(engine) as (url, _):
        stream, chunks = start_long_stream(url)
        next(chunks)
        stream.close()
        wait_until(lambda: generations(url, "cancelled") == 1)
        assert generations(url, "completed") == 0
        assert not health(url)["running"]
        r = client(url).completions.create(model=MODEL_NAME, prompt="after", max_tokens=2, temperature=0)
        assert r.choices[0].finish_reason in ("stop", "length")


def requests_counted(url, status):
    match = re.search(rf'^anyspec_requests_total{{path="/v1/completions",status="{status}"}} (\S+)$',
                      httpx.get(url + "/metrics").text, re.M)
    return float(match.group(1)) if match else 0.0


def test_a_stream_whose_client_leaves_is_counted_499_not_200(engine):
    """The stream's 200 was sent with its first chunk, but the answer never ended: /metrics counts it
    as nginx logs it, 499; a stream read to its end is a 200."""
    with live_server(engine) as (url, _):
        stream, chunks = start_long_stream(url)
        next(chunks)
        stream.close()
        wait_until(lambda: requests_counted(url, 499) == 1)
        assert requests_counted(url, 200) == 0
        whole = client(url).completions.create(model=MODEL_NAME, prompt="after", max_tokens=3, temperature=0,
                                               stream=True)
        assert [c.choices[0].finish_reason for c in whole][-1] in ("stop", "length")
        wait_until(lambda: requests_counted(url, 200) == 1)
        assert requests_counted(url, 499) == 1


def test_the_apps_shutdown_closes_its_engine(folders):
    """The app's lifespan ends its worker, then drops the slots' caches and closes the engine, so that
    the models go with nothing else holding them; with ``close_engine`` off the engine stays open."""
    import gc
    import weakref

    from starlette.testclient import TestClient

    from anyspec.server.app import Settings, create_app

    for close in (True, False):
        engine = load_engine(*folders)
        models = [weakref.ref(m) for m in (engine.target, engine.draft)]
        app = create_app(engine, Settings(model_name=MODEL_NAME, close_engine=close))
        with TestClient(app) as http:
            assert http.post("/v1/completions", json={"prompt": "hi", "max_tokens": 3}).status_code == 200
        assert not app.state.scheduler.thread.is_alive()
        gc.collect()
        assert engine.closed is close and [m() is None for m in models] == [close, close]
    assert len(engine.generate("hi", SamplingParams(max_new_tokens=2)).token_ids) == 2


def test_non_streaming_disconnect_cancels_the_generation(engine):
    with live_server(engine) as (url, _):
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(url + "/v1/completions", timeout=1.0, json={
                "model": MODEL_NAME, "prompt": "never read", "max_tokens": LONG, "temperature": 0})
        wait_until(lambda: generations(url, "cancelled") == 1)
        assert generations(url, "completed") == 0


@pytest.mark.parametrize("stream", [False, True])
def test_generation_timeout_cuts_the_answer(engine, reference, stream):
    prompt = "Count to a thousand:"
    with live_server(engine, generation_timeout=0.3) as (url, _):
        out = client(url).completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=LONG, temperature=0,
                                             stream=stream)
        if stream:
            chunks = list(out)
            text = "".join(c.choices[0].text for c in chunks)
            last = chunks[-1]
        else:
            text, last = out.choices[0].text, out
            assert 0 < out.usage.completion_tokens < 60
        assert last.choices[0].finish_reason == "length"
        stats = last.model_extra["anyspec"]
        assert stats["timed_out"] is True and stats["rounds"] >= 1  # the engine's own statistics
        assert generations(url, "timed_out") == 1
    full = reference.generate(prompt, SamplingParams(temperature=0, max_new_tokens=60)).text
    assert text and full.startswith(text) and len(text) < len(full)


def test_the_generation_timeout_counts_from_the_end_of_the_prefill():
    """As llama-server's t_max_predict_ms counts from the first generated token: a long prompt's
    prefill is not cut, so its answer is not an empty one."""
    import asyncio
    from types import SimpleNamespace

    from anyspec.server.metrics import Metrics
    from anyspec.server.scheduler import Job, Running, Scheduler

    scheduler = Scheduler(SimpleNamespace(batchable=True, draft=None), max_queue=2, generation_timeout=0.05,
                          metrics=Metrics(), max_batch=4)
    loop = asyncio.new_event_loop()
    job = Job("hi", SamplingParams(), True, 1, loop)
    job.ids = [1, 2, 3, 4]  # the prompt's target ids
    sequence = SimpleNamespace(cached_ids=[7, 8, 1])  # an earlier job's tokens, in a reused slot
    run = scheduler.running[job] = Running(False, sequence)
    run.started -= 10  # its prefill has taken ten seconds so far
    scheduler._retire_cancelled()
    assert run.generating is None and not run.timed_out.is_set()
    sequence.cached_ids = [1, 2, 3]  # the prompt read, but for the last token the first verify reads
    scheduler._retire_cancelled()
    assert run.generating is not None and not run.timed_out.is_set()
    run.generating -= 1  # a second of generating, beyond the 0.05 s
    scheduler._retire_cancelled()
    assert run.timed_out.is_set()
    loop.close()


def test_queue_wait_timeout_answers_503(engine):
    with live_server(engine, queue_size=2, queue_timeout=0.5) as (url, _):
        stream, _ = start_long_stream(url)
        t0 = time.monotonic()
        r = httpx.post(url + "/v1/completions", json={"model": MODEL_NAME, "prompt": "waits"}, timeout=30)
        assert time.monotonic() - t0 >= 0.5
        assert r.status_code == 503 and "retry-after" in r.headers
        assert r.json()["error"]["code"] == "queue_timeout" and r.json()["error"]["type"] == "server_error"
        assert health(url)["queue_depth"] == 0
        counted = httpx.get(url + "/metrics").text
        assert 'anyspec_generations_total{outcome="queue_timeout"} 1.0' in counted, counted
        assert 'outcome="cancelled"' not in counted
        stream.close()


def test_a_request_cancelled_during_a_long_prefill_stops_after_that_chunk(engine, monkeypatch):
    """The prompt is prefilled 16 tokens a pass; the client goes away during the first pass, and the
    worker retires the job before the second: one chunk of the ~150-token prompt is computed."""
    import asyncio

    from anyspec.engine import batch
    from anyspec.server.metrics import Metrics
    from anyspec.server.scheduler import Job, Scheduler

    monkeypatch.setattr(batch, "PREFILL_CHUNK", 16)
    target = engine.target
    prompt = "one two three four five six seven eight nine ten " * 15
    n = len(target.tokenizer.encode(prompt))
    job = Job(prompt, SamplingParams(temperature=0, max_new_tokens=4), True, n, asyncio.new_event_loop())
    rows, original = [], target.extend

    def extend(ids, last=None):
        rows.append(len(ids))
        job.cancelled.set()  # the disconnect, noticed by the server while this pass runs
        return original(ids, last)

    monkeypatch.setattr(target, "extend", extend)
    scheduler = Scheduler(engine, 4, 300.0, Metrics())
    scheduler.submit(job)
    scheduler.start()
    try:
        wait_until(lambda: rows and not scheduler.running)
    finally:
        scheduler.stop()
    assert n > 100 and rows == [16]
    assert scheduler.metrics.generations["cancelled"] == 1 and scheduler.metrics.tokens == 0


def test_a_generation_cancelled_midway_counts_the_tokens_it_committed(engine, monkeypatch):
    """The client leaves after the second piece of its answer: the tokens committed by then count in
    ``anyspec_generated_tokens_total`` (a disconnect is work done, as a completed answer is)."""
    import asyncio

    from anyspec.server.metrics import Metrics
    from anyspec.server.scheduler import Job, Scheduler

    params = SamplingParams(temperature=0, max_new_tokens=12, ignore_eos=True)
    prompt = "count: one two three"
    whole = engine.generate(prompt, params).token_ids
    job = Job(prompt, params, True, len(engine.target.tokenizer.encode(prompt)), asyncio.new_event_loop())
    scheduler = Scheduler(engine, 4, 300.0, Metrics())
    pieces, on_text = [], scheduler._on_text

    def heard(job, piece):
        pieces.append(str(piece))
        if len(pieces) == 2:
            job.cancelled.set()
        on_text(job, piece)

    scheduler.driver.batch.on_text = heard
    scheduler.submit(job)
    scheduler.start()
    try:
        wait_until(lambda: scheduler.metrics.generations["cancelled"])
    finally:
        scheduler.stop()
    said = [m for m in range(len(whole) + 1) if engine.target.tokenizer.decode(whole[:m]) == "".join(pieces)]
    assert len(pieces) == 2 and 2 <= scheduler.metrics.tokens < len(whole), (pieces, scheduler.metrics.tokens)
    assert scheduler.metrics.tokens in said, (pieces, scheduler.metrics.tokens, said)


def test_a_burst_takes_the_free_slots_before_queue_places():
    """Requests that arrive together at an idle batched server: as many as there are free slots start
    at the next pass and do not count as waiting; ``queue_size`` more may wait, and only beyond both
    is the answer 429."""
    import asyncio
    from types import SimpleNamespace

    from anyspec.server.metrics import Metrics
    from anyspec.server.scheduler import Job, QueueFull, Scheduler

    scheduler = Scheduler(SimpleNamespace(batchable=True, draft=None), max_queue=2, generation_timeout=60,
                          metrics=Metrics(), max_batch=4)
    loop = asyncio.new_event_loop()
    jobs = [Job("hi", SamplingParams(), True, 1, loop) for _ in range(7)]
    for i, job in enumerate(jobs[:6]):
        scheduler.submit(job)
        assert scheduler.depth == max(0, i - 3)
    with pytest.raises(QueueFull):
        scheduler.submit(jobs[6])
    scheduler.running[scheduler.pending.popleft()] = None  # one runs, one is taken from the queue and
    scheduler.joining = {scheduler.pending.popleft()}  # not yet running: two slots stay open for the four
    assert scheduler.depth == 2  # still queued
    with pytest.raises(QueueFull):
        scheduler.submit(jobs[6])
    loop.close()


def test_a_job_entering_the_batch_holds_one_slot():
    """The worker takes a job from ``joining`` into ``running`` in one step under the lock, so a
    request arriving meanwhile never sees its slot counted twice (a 429 with a queue place free)."""
    import asyncio
    from types import SimpleNamespace

    from anyspec.server.metrics import Metrics
    from anyspec.server.scheduler import Job, QueueFull, Scheduler

    engine = SimpleNamespace(batchable=True, draft=None, steps=lambda *args, **kw: iter(()))
    scheduler = Scheduler(engine, max_queue=1, generation_timeout=60, metrics=Metrics(), max_batch=2)
    loop = asyncio.new_event_loop()
    jobs = [Job("hi", SamplingParams(), True, 1, loop) for _ in range(4)]
    scheduler.joining = {jobs[0]}
    scheduler._start(jobs[0], (SimpleNamespace(cached_ids=[]), None))
    assert list(scheduler.running) == [jobs[0]] and not scheduler.joining
    scheduler.submit(jobs[1])  # the second slot
    scheduler.submit(jobs[2])  # the one queue place
    assert scheduler.depth == 1
    with pytest.raises(QueueFull):
        scheduler.submit(jobs[3])
    loop.close()
