"""One worker thread runs the engine, one generation at a time; requests wait in a bounded FIFO queue.

The engine is batch size 1 and not thread-safe, so the worker owns it: a request handler (on the
event loop) submits a ``Job`` and reads ``("start" | "text" | "done" | "error", value)`` events from
the job's asyncio queue. Cancelling a job takes it out of the queue at once, or, once it runs,
closes the engine's generator before its next round. Counters for ``/metrics`` live here too.
"""

from __future__ import annotations

import asyncio
import collections
import threading
import time
from dataclasses import dataclass, field

from anyspec.engine import Engine, SamplingParams, Stats


class QueueFull(Exception):
    pass


@dataclass
class Outcome:
    text: str
    finish_reason: str
    completion_tokens: int
    prompt_tokens: int
    stats: Stats | None  # None when the generation was cut by the time limit
    speculative: bool
    timed_out: bool = False


@dataclass
class Job:
    prompt: str | list[dict]
    params: SamplingParams
    speculative: bool
    prompt_tokens: int
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    cancelled: threading.Event = field(default_factory=threading.Event)
    enqueued_at: float = field(default_factory=time.monotonic)
    polled: float = 0.0  # when the server last checked the client's connection

    def emit(self, kind: str, value=None) -> None:
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, (kind, value))
        except RuntimeError:  # the event loop is gone (server shutting down)
            self.cancelled.set()


@dataclass
class Metrics:
    requests: collections.Counter = field(default_factory=collections.Counter)  # (path, status)
    generations: collections.Counter = field(default_factory=collections.Counter)  # outcome
    tokens: int = 0
    gen_seconds: float = 0.0
    drafted: int = 0
    accepted: int = 0
    rounds: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add_generation(self, outcome: str, tokens: int, seconds: float, stats: Stats | None) -> None:
        with self.lock:
            self.generations[outcome] += 1
            self.tokens += tokens
            self.gen_seconds += seconds
            if stats is not None and stats.drafted:
                self.drafted += stats.drafted
                self.accepted += stats.accepted
                self.rounds += stats.rounds

    def add_request(self, path: str, status: int) -> None:
        with self.lock:
            self.requests[(path, status)] += 1

    def mean_generation_seconds(self) -> float:
        done = sum(self.generations.values())
        return self.gen_seconds / done if done else 1.0

    def render(self, queue_depth: int, running: bool) -> str:
        """Prometheus text exposition format (version 0.0.4)."""
        with self.lock:
            lines = ["# HELP anyspec_requests_total HTTP requests answered, by path and status.",
                     "# TYPE anyspec_requests_total counter"]
            lines += [f'anyspec_requests_total{{path="{p}",status="{s}"}} {n}'
                      for (p, s), n in sorted(self.requests.items())]
            lines += ["# HELP anyspec_generations_total Generations by outcome "
                      "(completed, cancelled by a disconnect, timed_out, error).",
                      "# TYPE anyspec_generations_total counter"]
            lines += [f'anyspec_generations_total{{outcome="{o}"}} {n}'
                      for o, n in sorted(self.generations.items())]
            gauges = [
                ("generated_tokens_total", "counter", "Tokens generated (target vocabulary).", self.tokens),
                ("generation_seconds_total", "counter", "Wall time spent generating.", self.gen_seconds),
                ("draft_tokens_total", "counter", "Draft tokens proposed.", self.drafted),
                ("accepted_tokens_total", "counter", "Draft tokens accepted by the target.", self.accepted),
                ("acceptance_rate", "gauge", "Accepted / proposed draft tokens, since start.",
                 self.accepted / self.drafted if self.drafted else 0.0),
                ("mean_accepted_length", "gauge", "Draft tokens accepted per speculative round, since start.",
                 self.accepted / self.rounds if self.rounds else 0.0),
                ("tokens_per_second", "gauge", "Generated tokens / generation wall time, since start.",
                 self.tokens / self.gen_seconds if self.gen_seconds else 0.0),
                ("queue_depth", "gauge", "Requests waiting for the worker.", queue_depth),
                ("running", "gauge", "Generations running now (0 or 1).", int(running)),
            ]
        for name, kind, text, value in gauges:
            lines += [f"# HELP anyspec_{name} {text}", f"# TYPE anyspec_{name} {kind}",
                      f"anyspec_{name} {value}"]
        return "\n".join(lines) + "\n"


class Scheduler:
    def __init__(self, engine: Engine, target_only: Engine | None, max_queue: int, generation_timeout: float,
                 metrics: Metrics):
        self.engines = {True: engine, False: target_only or engine}
        self.max_queue = max_queue
        self.generation_timeout = generation_timeout
        self.metrics = metrics
        self.pending: collections.deque[Job] = collections.deque()
        self.running: Job | None = None
        self.cond = threading.Condition()
        self.stopping = False
        self.thread = threading.Thread(target=self._loop, name="anyspec-worker", daemon=True)

    @property
    def depth(self) -> int:
        return len(self.pending)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        with self.cond:
            self.stopping = True
            for job in [*self.pending, self.running]:
                if job is not None:
                    job.cancelled.set()
            self.cond.notify_all()
        self.thread.join(timeout=30)

    def submit(self, job: Job) -> None:
        with self.cond:
            if len(self.pending) >= self.max_queue:
                raise QueueFull
            self.pending.append(job)
            self.cond.notify()

    def cancel(self, job: Job) -> None:
        job.cancelled.set()
        with self.cond:
            if job in self.pending:
                self.pending.remove(job)
                self.metrics.add_generation("cancelled", 0, 0.0, None)

    def _loop(self) -> None:
        while True:
            with self.cond:
                while not self.pending and not self.stopping:
                    self.cond.wait()
                if self.stopping:
                    return
                job = self.running = self.pending.popleft()
            try:
                self._run(job)
            except Exception as exc:  # reported to the request; the worker keeps serving
                self.metrics.add_generation("error", 0, 0.0, None)
                job.emit("error", exc)
            finally:
                with self.cond:
                    self.running = None

    def _run(self, job: Job) -> None:
        engine = self.engines[job.speculative]
        job.emit("start")
        t0 = time.monotonic()
        stream = engine.stream(job.prompt, job.params)
        pieces: list[str] = []
        try:
            while True:
                if job.cancelled.is_set():
                    self.metrics.add_generation("cancelled", 0, time.monotonic() - t0, None)
                    return
                if time.monotonic() - t0 > self.generation_timeout:
                    text = "".join(pieces)
                    n = len(engine.target.tokenizer.encode(text, add_special_tokens=False)) if text else 0
                    self.metrics.add_generation("timed_out", n, time.monotonic() - t0, None)
                    job.emit("done", Outcome(text, "length", n, job.prompt_tokens, None,
                                             job.speculative and engine.proposer is not None, timed_out=True))
                    return
                try:
                    piece = next(stream)
                except StopIteration as stop:
                    result = stop.value
                    break
                pieces.append(piece)
                job.emit("text", piece)
        finally:
            stream.close()
        stats = result.stats
        self.metrics.add_generation("completed", len(result.token_ids), stats.total_seconds, stats)
        job.emit("done", Outcome(result.text, result.finish_reason, len(result.token_ids),
                                 stats.prompt_tokens, stats, engine.proposer is not None))
