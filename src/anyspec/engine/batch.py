"""Several generations at once: their forwards go through the models together.

A generation (``loop.speculative_generate``) is a generator. It yields committed text (``str``) and
the model forwards it needs (``Forward``), and each ``Forward`` is answered with its logits.
A ``Batch`` steps them: each step runs the pending forwards of one model in a single pass, draft
forwards first, so that the generations draft together and then verify together in one target
pass. It measures each pass: the seconds go to every generation in it (``Meter``) and into the
model's ``PassCosts``, which the generations' k schedules and branch rules read. ``alone`` runs
one generation in a batch of its own; a ``Driver`` admits generations into slots (their KV
caches), steps the batch and frees or drops the slots, for ``Engine.generate_batch`` and the
server's scheduler alike.

Why this is lossless: every row of anyspec's kernels is computed alone, its attention over its
own sequence's cache only, so a row's logits are the same bits whatever else shares the pass.
Greedy answers are token-identical to the request alone; sampled ones draw from the target's
distribution with the request's own generator.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Iterator
from contextlib import contextmanager
from typing import NamedTuple

import torch

from anyspec.algorithms.adaptive_k import Acceptance, BatchSchedule, PassCosts
from anyspec.backends.stack import Sequence
from anyspec.engine.prefix import common_prefix


class Forward(NamedTuple):
    seq: object  # a model with one cache, or a ``stack.Sequence`` of a model that holds several
    ids: list[int]
    last: int | None = None  # logits of only the last rows
    head: object = None  # the model's ``restricted_head``: logits of its rows only, -inf elsewhere
    parents: list[int] | None = None  # the ids are a tree (``StackModel.forward``): each one's parent


Steps = Generator["str | Forward", "torch.Tensor | None", object]

# Prompt tokens a forward reads at most: a long prefill is many passes, so that a batch (or the
# server's worker, which checks for cancelled requests and shutdown between passes) is never held
# for long by one prompt. Row-invariant kernels give the same bits either way.
PREFILL_CHUNK = 256
# Prompt rows one pass gives a prefill while other generations' rounds share the pass: a long prompt
# then costs each of their passes about as much as a round's verify, not a whole chunk's.
SHARED_PREFILL = 32


def chunked(seq, ids: list[int], last: int | None = None, head=None, stop=None) -> Steps:
    """``ids`` through ``seq`` in forwards of at most ``PREFILL_CHUNK`` tokens; returns the logits of
    the last one (None where ``stop``, a ``threading.Event``, was set before it)."""
    logits = None
    for start in range(0, len(ids), PREFILL_CHUNK):
        if stop is not None and stop.is_set():
            return None
        logits = yield Forward(seq, ids[start:start + PREFILL_CHUNK], last, head)
    return logits


def extend(forward: Forward) -> torch.Tensor:
    """One forward through its sequence alone."""
    extra = {name: value for name, value in (("head", forward.head), ("parents", forward.parents))
             if value is not None}
    return forward.seq.extend(forward.ids, forward.last, **extra)


def alone(start: Callable[[Batch], Steps]) -> Generator[str, None, object]:
    """One generation in a batch of its own: ``start(batch)`` gives its steps (under key 0). Yields
    its text; returns its return value, or raises the exception it raised."""
    pieces, end = [], {}
    batch = Batch(lambda _, text: pieces.append(text), lambda _, result: end.setdefault("result", result),
                  lambda _, exc: end.setdefault("error", exc))
    batch.add(0, start(batch))
    while True:
        yield from pieces
        pieces.clear()
        if "error" in end:
            raise end["error"]
        if "result" in end:
            return end["result"]
        batch.step()


def take_slot(free: list[tuple], ids: list[int], new_slot: Callable[[], tuple]) -> tuple:
    """The slot a request whose prompt is ``ids`` runs in: of the ``free`` slots (taken out of the
    list) the one whose target sequence holds the longest prefix of the prompt, the first of equals
    (with the prefix cache, the request keeps those keys and values); ``new_slot()`` if none is free."""
    if not free:
        return new_slot()
    best = max(range(len(free)), key=lambda i: common_prefix(free[i][0].cached_ids, ids))
    return free.pop(best)


def drop_slot(slot: tuple) -> None:
    """Forget a slot whose generation failed: whatever its caches hold is never read again. Sequences
    leave their model (a fresh slot takes their place); a model with one cache starts empty."""
    for seq in slot:
        if isinstance(seq, Sequence):
            seq.release()
        elif seq is not None:
            seq.reset()


def share_pass(forwards: list[Forward]) -> tuple[list[Forward], list[Forward | None]]:
    """What one pass runs of each forward, and what waits for a later pass (None: nothing). Beside a
    forward of at most ``SHARED_PREFILL`` rows (a round), a longer one whose leading rows give no
    logits (a prefill) runs ``SHARED_PREFILL`` of them now and the rest later."""
    now, rest = [], []
    shared = any(len(f.ids) <= SHARED_PREFILL for f in forwards)
    for f in forwards:
        split = (shared and f.parents is None and f.last is not None
                 and len(f.ids) - f.last >= SHARED_PREFILL)
        now.append(f._replace(ids=f.ids[:SHARED_PREFILL], last=1) if split else f)
        rest.append(f._replace(ids=f.ids[SHARED_PREFILL:]) if split else None)
    return now, rest


def model_of(seq) -> object:
    return seq.model if isinstance(seq, Sequence) else seq


class Meter:
    """The measured seconds of the passes one generation took part in, by model (``Batch.step``
    adds each one; ``timing`` adds work of the generation's own), beside the batch's ``PassCosts``
    of each model's passes by their rows."""

    def __init__(self, costs_of: Callable[[object], PassCosts]):
        self.spent: dict[int, float] = {}
        self.costs_of = costs_of

    def add(self, model, seconds: float) -> None:
        self.spent[id(model)] = self.spent.get(id(model), 0.0) + seconds

    @contextmanager
    def timing(self, seq) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.add(model_of(seq), time.perf_counter() - t0)

    def mark(self) -> dict[int, float]:
        return dict(self.spent)

    def seconds(self, seq, since: dict[int, float] | None = None) -> float:
        """Seconds of ``seq``'s model so far, or since ``mark()`` gave ``since``."""
        key = id(model_of(seq))
        return self.spent.get(key, 0.0) - (since or {}).get(key, 0.0)

    def total(self) -> float:
        return sum(self.spent.values())

    def costs(self, seq) -> PassCosts:
        """The passes of ``seq``'s model in this batch, by their rows."""
        return self.costs_of(model_of(seq))


class Batch:
    """Generations in flight, each under a key; ``step`` advances all of them by one model pass.

    ``on_text(key, text)`` receives text as it is committed, ``on_done(key, result)`` the
    generation's return value and ``on_error(key, exc)`` an exception it raised; after either, the
    key has left the batch. ``drafts``: the models whose forwards go first.
    """

    def __init__(self, on_text: Callable, on_done: Callable, on_error: Callable, drafts=()):
        self.on_text, self.on_done, self.on_error = on_text, on_done, on_error
        self.drafts = [d for d in drafts if d is not None]
        self.waiting: dict[object, tuple[Steps, Forward]] = {}  # key -> (generation, its next forward)
        self.members: set = set()
        self.costs: dict[int, PassCosts] = {}  # id(model) -> its passes' measured seconds
        self.meters: dict[object, Meter] = {}  # key -> the seconds of the passes it took part in
        self.schedules: dict[object, BatchSchedule] = {}  # key -> how many tokens it drafts a round

    def __len__(self) -> int:
        return len(self.members)

    def __contains__(self, key) -> bool:
        return key in self.members

    def schedule(self, key, k_max: int, target, draft, shared: bool = True,
                 adaptive: bool = False) -> BatchSchedule:
        """How many tokens generation ``key`` drafts each round (``adaptive_k.BatchSchedule``, on
        the measured costs of this batch's passes); it starts from the mean acceptance of the
        generations already here."""
        peers = self._peers()
        mean = sum(p.acceptance.rate for p in peers) / len(peers) if peers else 0.5
        costs = [self.costs_of(m) for m in (target, draft)]
        schedule = BatchSchedule(k_max, self._peers, *costs, Acceptance(2 * mean, 2 * (1 - mean)), shared,
                                 adaptive)
        self.schedules[key] = schedule
        return schedule

    def meter(self, key) -> Meter:
        """What generation ``key``'s passes cost it (``Batch.step`` measures each pass)."""
        return self.meters.setdefault(key, Meter(self.costs_of))

    def costs_of(self, model) -> PassCosts:
        """The measured seconds of ``model``'s passes in this batch, by their rows."""
        return self.costs.setdefault(id(model), PassCosts())

    def _peers(self) -> list[BatchSchedule]:
        return [self.schedules[k] for k in self.members if k in self.schedules]

    def add(self, key, steps: Steps) -> None:
        """Start a generation; it runs up to its first forward now."""
        self.members.add(key)
        self._advance(key, steps, None)

    def remove(self, key) -> None:
        """Stop a generation (a cancelled or timed-out request); its sequences are free after this."""
        entry = self.waiting.pop(key, None)
        self._leave(key)
        if entry is not None:
            entry[0].close()

    def next_model(self) -> object | None:
        """The model the next step runs: a draft while any generation waits on one, else a target."""
        models = [model_of(forward.seq) for _, forward in self.waiting.values()]
        drafts = [m for m in models if any(m is d for d in self.drafts)]
        return (drafts or models or [None])[0]

    def step(self) -> int:
        """One pass of one model over every forward waiting on it; returns the rows it computed."""
        model = self.next_model()
        if model is None:
            return 0
        keys = [key for key, (_, f) in self.waiting.items() if model_of(f.seq) is model]
        forwards, rest = share_pass([self.waiting[key][1] for key in keys])
        rows = sum(len(f.ids) for f in forwards)
        t0 = time.perf_counter()
        if all(isinstance(f.seq, Sequence) for f in forwards):
            # one restricted head for all, or the whole head (rows outside it are never read)
            head = forwards[0].head if all(f.head is forwards[0].head for f in forwards) else None
            logits = model.forward([(f.seq, f.ids, f.last, f.parents) for f in forwards], head)
        else:  # a model with one cache: its forwards one by one
            logits = [extend(f) for f in forwards]
        seconds = time.perf_counter() - t0
        self.costs_of(model).record(rows, seconds)
        for key in keys:
            if key in self.meters:
                self.meters[key].add(model, seconds)
        for key, reply, later in zip(keys, logits, rest, strict=True):
            if later is None:
                self._advance(key, self.waiting[key][0], reply)
            else:
                self.waiting[key] = (self.waiting[key][0], later)
        return rows

    def _advance(self, key, steps: Steps, reply) -> None:
        self.waiting.pop(key, None)
        try:
            while True:
                step = steps.send(reply)
                if isinstance(step, Forward):
                    self.waiting[key] = (steps, step)
                    return
                reply = None
                self.on_text(key, step)
        except StopIteration as done:
            self._leave(key)
            try:
                self.on_done(key, done.value)
            except Exception as exc:  # the caller's own handling failed: the generation still ends
                self.on_error(key, exc)
        except Exception as exc:  # reported for this generation; the others go on
            self._leave(key)
            self.on_error(key, exc)

    def _leave(self, key) -> None:
        self.members.discard(key)
        self.schedules.pop(key, None)
        self.meters.pop(key, None)


class Driver:
    """Generations, each in a slot of its own, run together in a ``Batch``: ``admit`` starts one in
    the slot ``take_slot`` gives it, ``step`` runs one pass. A slot whose generation ends, or is
    removed, is free for the next one; one whose generation fails is dropped (``drop_slot``), since
    whatever its caches hold may be half written. ``Engine.generate_batch`` and the server's
    scheduler run on it. ``start(key, slot)`` gives a generation's steps; ``on_text``, ``on_done``
    and ``on_error`` are ``Batch``'s."""

    def __init__(self, new_slot: Callable[[], tuple], start: Callable[[object, tuple], Steps],
                 on_text: Callable, on_done: Callable, on_error: Callable, drafts=()):
        self.new_slot, self.start, self.on_done, self.on_error = new_slot, start, on_done, on_error
        self.batch = Batch(on_text, self._done, self._failed, drafts)
        self.free: list[tuple] = []
        self.slots: dict[object, tuple] = {}  # key -> the slot its generation runs in

    def __len__(self) -> int:
        return len(self.batch)

    def admit(self, key, ids: list[int]) -> None:
        """Start generation ``key``, whose prompt is ``ids``."""
        try:
            slot = self.slots[key] = take_slot(self.free, ids, self.new_slot)
            steps = self.start(key, slot)
        except Exception as exc:  # reported for this generation, as one it raised
            self._failed(key, exc)
            return
        self.batch.add(key, steps)

    def remove(self, key) -> None:
        """Stop a running generation (cancelled, timed out); its slot is free for the next."""
        self.batch.remove(key)
        self.free.append(self.slots.pop(key))

    def fail(self, key, exc: Exception) -> None:
        """End generation ``key``, running or not yet admitted, with ``exc``."""
        self.batch.remove(key)
        self._failed(key, exc)

    def step(self) -> int:
        """One pass (``Batch.step``); a pass that fails ends every generation with its exception."""
        try:
            return self.batch.step()
        except Exception as exc:
            for key in list(self.slots):
                self.fail(key, exc)
            return 0

    def close(self) -> None:
        """Stop what runs and drop every slot: their caches would otherwise live as long as the models."""
        for key in list(self.slots):
            self.batch.remove(key)
        for slot in self.free + list(self.slots.values()):
            drop_slot(slot)
        self.free.clear()
        self.slots.clear()
        self.batch.drafts.clear()

    def _done(self, key, result) -> None:
        self.free.append(self.slots.pop(key))
        self.on_done(key, result)

    def _failed(self, key, exc: Exception) -> None:
        slot = self.slots.pop(key, None)
        if slot is not None:
            drop_slot(slot)
        self.on_error(key, exc)
