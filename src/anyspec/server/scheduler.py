"""One worker thread runs the engine over a batch of generations; requests wait in a bounded FIFO queue.

The engine is not thread-safe, so the worker owns it: a request handler (on the event loop) submits
a ``Job`` and reads ``("start" | "logprobs" | "text" | "done" | "error", value)`` events from the
job's asyncio queue. Up to ``max_batch`` jobs run together (``engine.batch.Driver``): each pass of
the worker runs one model over the forwards of every job that waits on it, and jobs join and leave
between passes (continuous batching). Each running job owns a slot: a sequence of the target and
one of the draft, each with its own KV cache, kept for the next job in that slot (its prompt prefix
may be reused), so memory stays bounded by ``max_batch`` times the context. A job whose prompt
begins with what another job is about to prefill (a shared system prompt) joins one pass later and
copies those keys and values (``prefix.reuse_prefix``). A job that finds no free slot waits in the queue.
Cancelling a job takes it out of the queue at once, or, once it runs, ends it before the worker's
next pass. A job that fails leaves no slot behind: its sequences are dropped, since whatever their
caches hold may be half written, and the next job gets a fresh slot. Models that hold one cache
only run one job at a time.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import logging
import threading
import time
from dataclasses import dataclass, field

from anyspec.config import MAX_BATCH, SamplingParams
from anyspec.engine import Engine, Stats
from anyspec.engine.batch import Driver, Steps
from anyspec.engine.model import MultiSequence
from anyspec.engine.output import Piece
from anyspec.engine.prefix import common_prefix, longest_prefix
from anyspec.engine.prompt import encode_prompt
from anyspec.errors import ConfigError
from anyspec.server.metrics import Metrics


class QueueFull(Exception):
    pass


log = logging.getLogger("anyspec.server")


class ShuttingDown(Exception):
    """The server stops: what is queued or running ends with this error, and nothing new starts."""


SHARED = 16  # prompt tokens a joining job must be able to copy from another one to wait a pass for them


@dataclass
class Outcome:
    text: str
    finish_reason: str
    completion_tokens: int
    prompt_tokens: int
    stats: Stats | None  # None when the generation was cut by the time limit
    speculative: bool
    timed_out: bool = False
    # with logprobs asked for: per token (its bytes, logprob, [(bytes, logprob) of the likeliest])
    logprobs: list[tuple[bytes, float, list[tuple[bytes, float]]]] | None = None
    # with prompt logprobs asked for (echo): the same per prompt token, the first without (None)
    prompt_logprobs: list[tuple[bytes, float | None, list[tuple[bytes, float]] | None]] | None = None
    stop_reason: str | int | None = None  # the stop string or stop token id that ended the answer


@dataclass(eq=False)  # a job is itself: it keys the batch
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
    ids: list[int] | None = None  # the prompt's target ids and text (from the request's check, or
    text: str | None = None  # encoded when the scheduler first needs them)

    def emit(self, kind: str, value=None) -> None:
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, (kind, value))
        except RuntimeError:  # the event loop is gone (server shutting down)
            self.cancelled.set()


@dataclass
class Running:
    speculative: bool  # with the draft
    target: object  # the job's sequence of the target: its cache shows when the prompt is read
    started: float = field(default_factory=time.monotonic)
    # when the prefill was over (the prompt's tokens but the last cached): --generation-timeout counts
    # from here, as llama-server's t_max_predict_ms counts from the first generated token
    generating: float | None = None
    timed_out: threading.Event = field(default_factory=threading.Event)  # ends it after its round


def control_names(tokenizer, spelled: list[bytes]) -> dict[int, bytes]:
    """The names, as UTF-8, of the ids whose text is nothing but that the tokenizer names (special
    and added tokens)."""
    ids = [i for i, b in enumerate(spelled) if not b]
    return {i: n.encode() for i, n in zip(ids, tokenizer.convert_ids_to_tokens(ids), strict=True) if n}


class Scheduler:
    def __init__(self, engine: Engine, max_queue: int, generation_timeout: float, metrics: Metrics,
                 max_batch: int = MAX_BATCH):
        self.engine = engine
        self.batched = engine.batchable
        self.max_batch = max_batch if self.batched else 1
        self.max_queue = max_queue
        self.generation_timeout = generation_timeout
        self.metrics = metrics
        self.pending: collections.deque[Job] = collections.deque()
        self.running: dict[Job, Running] = {}
        self.driver = Driver(self._new_slot, self._start, self._on_text, self._on_done, self._on_error,
                             drafts=(engine.draft,))
        self.cond = threading.Condition()
        self.stopping = False
        self.draining = False  # new jobs are refused; those queued and running go on
        self.joining: set[Job] = set()  # jobs taken from the queue, not yet running
        self.thread = threading.Thread(target=self.run, name="anyspec-worker", daemon=True)
        self.working = threading.Lock()  # held while ``run`` runs: the engine is the worker's then

    @property
    def depth(self) -> int:
        """Jobs that wait for a slot: those queued beyond the slots the next pass gives them."""
        with self.cond:
            return max(0, len(self.pending) - self._open_slots())

    def _open_slots(self) -> int:
        """Slots no job holds or is taking (read under ``cond``: a job enters ``running`` and leaves
        ``joining`` at once, so it is never counted twice)."""
        return self.max_batch - len(self.running) - len(self.joining)

    @property
    def free(self) -> list[tuple]:
        """Slots whose job ended, kept for the next job."""
        return self.driver.free

    @property
    def slots(self) -> int:
        """How many slots exist (at most ``max_batch``)."""
        return len(self.driver.free) + len(self.driver.slots)

    def start(self) -> None:
        """Run the worker in a thread of its own (else the caller runs ``run`` itself)."""
        self.thread.start()

    def stop(self) -> None:
        with self.cond:
            self.stopping = True
            for job in [*self.pending, *self.running]:
                job.cancelled.set()
            self.cond.notify_all()
        if self.thread.is_alive():
            self.thread.join(timeout=30)

    def close(self, wait: float = 30.0) -> bool:
        """``stop``, then once the worker has returned (within ``wait`` seconds), drop the slots'
        caches and close the engine, so that the models' memory goes; whether it did."""
        self.stop()
        if not self.working.acquire(timeout=wait):
            return False
        try:
            self.driver.close()
            self.engine.close()
        finally:
            self.working.release()
        return True

    def submit(self, *jobs: Job) -> None:
        """Queue the jobs one after the other, all or none (``QueueFull``)."""
        with self.cond:
            if self.stopping or self.draining:
                raise ShuttingDown
            if len(self.pending) + len(jobs) > self.max_queue + self._open_slots():
                raise QueueFull
            self.pending.extend(jobs)
            self.cond.notify()

    def cancel(self, job: Job, outcome: str = "cancelled") -> None:
        """Stop ``job``; one still queued is counted under ``outcome`` (``queue_timeout``: it waited
        too long), one running as ``cancelled`` once the worker retires it."""
        job.cancelled.set()
        with self.cond:
            if job in self.pending:
                self.pending.remove(job)
                self.metrics.add_generation(outcome, 0, 0.0, None)
            self.cond.notify()

    def _ids(self, job: Job) -> list[int]:
        if job.ids is None or job.text is None:
            job.ids, job.text, _ = encode_prompt(self.engine.target.tokenizer, job.prompt)
        return job.ids

    def _waits_for_prefix(self, job: Job, joining: list[Job]) -> bool:
        """Whether the job should join a pass later: a job joining now, or one whose prefill has yet
        to run, computes at least ``SHARED`` tokens of its prompt that no sequence holds yet, which
        it can then copy instead (prefix cache on)."""
        others = [*joining, *self.running]
        if not (others and self.batched and self.engine.config.prefix_cache):
            return False
        ids = self._ids(job)[:-1]
        coming = max(common_prefix(self._ids(other), ids) for other in others)
        if coming < SHARED:
            return False
        target = self.engine.target
        held = longest_prefix(target.sequences if isinstance(target, MultiSequence) else (), ids)[1]
        return coming - held >= SHARED

    def _new_slot(self) -> tuple:
        engine = self.engine
        return engine.new_slot() if self.batched else (engine.target, engine.draft)

    def run(self, alive=lambda: True) -> None:
        """The worker: admit, retire and step the batch until ``stop`` (or until ``alive()`` is false)."""
        with self.working:
            self._work(alive)

    def _work(self, alive) -> None:
        while True:
            with self.cond:
                while not self.pending and not self.running and not self.stopping and alive():
                    self.cond.wait(timeout=0.5)
                if self.stopping or not alive():
                    self._end_all()
                    return
                joining, later = [], []  # later: jobs that wait a pass for a prefix a joining job computes
                while self.pending and len(self.running) + len(joining) + len(later) < self.max_batch:
                    job = self.pending.popleft()
                    (later if self._waits_for_prefix(job, joining) else joining).append(job)
                self.pending.extendleft(reversed(later))
                self.joining = set(joining)
            for job in joining:
                try:
                    ids = self._ids(job)
                except Exception as exc:  # reported to the request; the worker keeps serving
                    self._on_error(job, exc)
                else:
                    self.driver.admit(job, ids)
                with self.cond:  # where it failed before it ran
                    self.joining.discard(job)
            self._retire_cancelled()
            self.metrics.add_pass(len(self.driver), self.driver.step())

    def _end_all(self) -> None:
        """Every queued and running job ends with ``ShuttingDown`` (its stream ends with an error)."""
        self.stopping = True
        for job in [*self.pending, *self.running]:
            self.driver.fail(job, ShuttingDown())
            job.cancelled.set()
        self.pending.clear()

    def _start(self, job: Job, slot: tuple) -> Steps:
        speculative = job.speculative and self.engine.draft is not None
        with self.cond:
            run = self.running[job] = Running(speculative, slot[0])
            self.joining.discard(job)
        return announced(self.engine.steps(job.prompt, job.params, *slot, self.driver.batch, job,
                                           encoded=(job.ids, job.text), speculative=job.speculative,
                                           stop=run.timed_out), job, slot[0])

    def _retire_cancelled(self) -> None:
        now = time.monotonic()
        for job, run in list(self.running.items()):
            if job.cancelled.is_set():
                self.driver.remove(job)
                del self.running[job]
                self.metrics.add_generation("cancelled", committed(run.target.cached_ids, job.ids),
                                            now - run.started, None)
                continue
            if run.generating is None and read(run.target.cached_ids, job.ids):
                run.generating = now
            if run.generating is not None and now - run.generating > self.generation_timeout:
                run.timed_out.set()  # it ends after its current round, as one cut by its length

    def _on_text(self, job: Job, piece: str) -> None:
        """A piece of the answer; with logprobs, the entries of its tokens go first (``"logprobs"``)."""
        if isinstance(piece, Piece) and piece.logprobs:
            job.emit("logprobs", self._spelled(piece.logprobs))
        job.emit("text", str(piece))

    def _on_done(self, job: Job, result) -> None:
        run = self.running.pop(job)
        stats, timed_out = result.stats, result.finish_reason == "abort"
        self.metrics.add_generation("timed_out" if timed_out else "completed", len(result.token_ids),
                                    stats.total_seconds, stats)
        job.emit("done", Outcome(result.text, "length" if timed_out else result.finish_reason,
                                 len(result.token_ids), stats.prompt_tokens, stats, run.speculative,
                                 timed_out=timed_out, logprobs=self._spelled(result.logprobs),
                                 prompt_logprobs=self._spelled(result.prompt_logprobs, job.ids),
                                 stop_reason=result.stop_reason))

    @functools.cached_property
    def alternatives(self) -> list[bytes]:
        """The bytes a likeliest alternative is shown by: a control token (b"" in the text's bytes)
        by its name, as vLLM shows it, else several read "" and collapse into one completions key."""
        named = control_names(self.engine.target.tokenizer, self.engine.target_bytes)
        return [named.get(i, b) for i, b in enumerate(self.engine.target_bytes)]

    def _spelled(self, entries: list | None, ids: list[int] | None = None) -> list | None:
        """Logprob entries with their tokens as bytes; ``ids``: the prompt's, whose first has none."""
        if entries is None:
            return None
        spell, alternative = self.engine.target_bytes, self.alternatives
        return [(spell[e.token], e.logprob, [(alternative[t], lp) for t, lp in e.top]) if e is not None
                else (spell[ids[i]], None, None) for i, e in enumerate(entries)]

    def _on_error(self, job: Job, exc: Exception) -> None:
        self.running.pop(job, None)
        if not isinstance(exc, ConfigError | ShuttingDown):  # bad request data (400), or a stop: no failure
            log.error("a generation failed", exc_info=exc)
        self.metrics.add_generation("error", 0, 0.0, None)
        job.emit("error", exc)


def read(cached: list[int], prompt: list[int]) -> bool:
    """Whether a cache holds all of a prompt but its last token (which the first verify reads): its
    prefill is over. A slot's cache may still hold an earlier job's tokens when the job starts."""
    n = len(prompt) - 1
    return len(cached) >= n and cached[:n] == prompt[:n]


def committed(cached: list[int], prompt: list[int]) -> int:
    """The tokens a generation had committed, from its target cache: the prompt's, those accepted,
    and the bonus token still to be read (none while the prompt is being read)."""
    return max(0, len(cached) - len(prompt) + 1)


def announced(steps: Steps, job: Job, target) -> Steps:
    """``steps``, the job told ``("start", n)`` when they reach their first forward, or their end
    where they need none (a prompt only scored, held whole by the prefix cache or of one token):
    the prefill has kept what it reuses of the target's cache by then, so n is the prompt's tokens
    read from the prefix cache (an Anthropic stream's ``message_start`` counts them). Every job's
    events begin with it: ``admit`` waits for it."""
    sent, started = None, False
    try:
        while True:
            try:
                forward = steps.send(sent)
            except StopIteration as end:
                if not started:
                    job.emit("start", len(target.cached_ids))
                return end.value
            if not started:
                job.emit("start", len(target.cached_ids))
                started = True
            sent = yield forward
    finally:
        steps.close()
