"""One worker thread runs the engine, one generation at a time; requests wait in a bounded FIFO queue.

The engine is batch size 1 and not thread-safe, so the worker owns it: a request handler (on the
event loop) submits a ``Job`` and reads ``("start" | "text" | "done" | "error", value)`` events from
the job's asyncio queue. Cancelling a job takes it out of the queue at once, or, once it runs,
closes the engine's generator before its next round.
"""

from __future__ import annotations

import asyncio
import collections
import threading
import time
from dataclasses import dataclass, field

from anyspec.config import SamplingParams
from anyspec.engine import Engine, Stats
from anyspec.server.metrics import Metrics


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
                                             job.speculative and engine.draft is not None, timed_out=True))
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
                                 stats.prompt_tokens, stats, engine.draft is not None))
