"""The speculative decoding loop: a draft proposes k tokens, the target verifies them in one pass.

``Engine(target, draft, config).generate(prompt, params)``; ``draft=None`` runs the target alone on
the same loop (k = 0 every round), which is the honest baseline. ``speculative_generate`` is the
whole method top to bottom: propose, verify, accept, commit, follow. It yields its model forwards
(``batch.Forward``) as well as its text, so that ``batch.Batch`` can run the forwards of many
generations together; ``Engine.stream`` runs one in a batch of its own (``batch.alone``). The
seconds it reports, and those its k schedule and branch rule weigh, are its passes' own as
``Batch.step`` measures them (``batch.Meter``).
"""

from __future__ import annotations

import contextlib
import gc
import os
import threading
import time
import weakref
from collections.abc import Callable, Generator, Iterator
from dataclasses import replace

from anyspec.backends.memory import release_memory
from anyspec.config import MAX_BATCH, SamplingParams, SpeculativeConfig, check_callbacks, given
from anyspec.engine import lookup as prompt_lookup
from anyspec.engine.batch import Batch, Driver, Meter, Steps, alone
from anyspec.engine.bridge import build_bridge, token_bytes_table
from anyspec.engine.context import DraftReader
from anyspec.engine.grammar import Free, Grammar, Grammars
from anyspec.engine.grammar_text import GUIDES
from anyspec.engine.model import MultiSequence
from anyspec.engine.output import GenerationResult, Output
from anyspec.engine.penalties import Penalties
from anyspec.engine.prefix import common_prefix
from anyspec.engine.prompt import encode_prompt, end_ids
from anyspec.engine.proposers import (
    SLEM,
    TLI,
    Proposal,
    Proposer,
    after_forced,
    algorithm_for,
    propose,
    tuned_confidence,
    tuned_tree,
)
from anyspec.engine.sampler import Sampler, request_seed
from anyspec.engine.stats import Stats, count, count_commit, count_end
from anyspec.engine.verify import prefill, verify
from anyspec.errors import ConfigError, EngineBusy


class Engine:
    """Speculative decoding over a loaded target and draft (``draft=None``: the target alone, on
    the same loop), made by ``anyspec.load``. ``generate`` and ``stream`` run one request at a time
    on the engine's own KV caches (the prefix cache keeps what the next prompt shares);
    ``generate_batch`` runs several together; ``guide`` compiles a grammar for
    ``SamplingParams(grammar=...)``. ``close`` frees the models and gives their memory back to the
    system (``with anyspec.load(...) as engine:`` closes it at the block's end); a closed engine
    refuses every request with a ``ConfigError``."""

    def __init__(self, target, draft=None, config: SpeculativeConfig | None = None):
        if isinstance(target, str | os.PathLike) or isinstance(draft, str | os.PathLike):
            raise ConfigError("Engine takes loaded models; anyspec.load(target, draft, config) loads them "
                              "by name, folder or .gguf file and gives the Engine")
        self.target, self.draft = target, draft
        self.config = given(config, SpeculativeConfig, "config")
        if self.config.draft_confidence is None:
            self.config = replace(self.config, draft_confidence=tuned_confidence(target))
        if self.config.tree is None:
            self.config = replace(self.config, tree=tuned_tree(target))
        elif self.config.tree and not target.tree_attention:
            raise ConfigError(f"tree={self.config.tree} needs a target whose forward takes a tree of rows "
                              "(a GGUF, or lean int8 or bf16, model on anyspec's kernels); "
                              "use tree=0 (--tree 0)")
        self.proposers: dict[str, Proposer] = {}
        bridge = None
        if draft is not None:
            bridge = build_bridge(draft, target, self.config)
            own = self.config.use_heterogeneous_vocab and self.config.draft_context == "retokenize"
            k = self.config.num_speculative_tokens
            room = max(1, draft.context_length - k - 1) if draft.context_length else None
            self.reader = DraftReader(draft, bridge, own, self.config.draft_window, room)
            self.proposers["tli"] = TLI(bridge, draft)
            if bridge.target_bytes is not None:
                self.proposers["slem"] = SLEM(bridge, target.tokenizer)
        self.bridge = bridge
        known = bridge.target_bytes if bridge is not None else None
        if known is None:
            known = token_bytes_table(target.tokenizer, target.vocab_size)
        self.target_bytes = known
        self.eos_ids = end_ids(target)
        self.streaming = False  # a generation is under way (stream, generate_batch)
        self._grammars: Grammars | None = None  # compiled against the target's tokenizer (guide)
        self.closed = False  # its models are freed (close)
        self._streams: weakref.WeakSet = weakref.WeakSet()  # those made by stream, for the with-block's end

    def close(self) -> None:
        """Free the models: the engine drops them and all it built from them (proposers, the
        vocabulary bridge, compiled grammars), then what no one else holds is collected and the
        heap's free pages go back to the system (``backends.memory.release_memory``). Closing a
        closed engine does nothing; closing one whose stream is under way raises ``EngineBusy``.
        Afterwards every request raises a ``ConfigError``. A model the caller still holds stays
        alive."""
        if self.closed:
            return
        self._idle("then close the Engine")
        self.closed = True
        self.target = self.draft = self.bridge = self.reader = self.target_bytes = self.eos_ids = None
        self.proposers = {}
        self._grammars = None
        release_memory()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, kind, error, trace) -> None:
        """A stream begun in the block and left open ends with it (one running in another thread
        keeps the engine open: ``EngineBusy``, unless the block raised, whose error then goes on)."""
        for stream in list(self._streams):
            with contextlib.suppress(ValueError):  # running now, in another thread
                stream.close()
        try:
            self.close()
        except EngineBusy:
            if error is None:
                raise

    def _open(self) -> None:
        """Raise unless the engine still holds its models (``close``)."""
        if self.closed:
            raise ConfigError("this Engine is closed; load another with anyspec.load")

    def _idle(self, then: str) -> None:
        """Raise ``EngineBusy``, saying what to do ``then``, while a generation runs on the engine."""
        if self.streaming:
            # a stream dropped unfinished and held only by a reference cycle (a web framework's, when
            # its client left) is closed by the collector, which frees the engine
            gc.collect()
        if self.streaming:
            raise EngineBusy("this Engine is running a generation (a generate, stream or generate_batch call "
                             "in another thread, or a stream begun and not finished or closed); wait for it, "
                             f"finish or close() the stream, {then}")

    def guide(self, kind: str, value) -> Grammar:
        """A grammar to hold answers to, as ``SamplingParams(grammar=engine.guide(kind, value))``:
        ``"json"`` (a JSON Schema as a dict or its text; None: any JSON object), ``"regex"`` (the
        whole answer matches it), ``"choice"`` (one of these strings) or ``"grammar"`` (GBNF, as
        llama.cpp's, or llguidance's Lark). Needs llguidance (``pip install 'anyspec[server]'``)."""
        self._open()
        if kind not in GUIDES:
            raise ConfigError(f"a guide's kind is one of {', '.join(GUIDES)}, got {kind!r}")
        if self._grammars is None:
            self._grammars = Grammars(self.target.tokenizer, self.target.vocab_size, self.eos_ids)
        return self._grammars.guide(kind, value, kind)

    def proposer_for(self, params: SamplingParams) -> Proposer | None:
        self._open()
        return self.proposers[algorithm_for(self.config, params)] if self.draft is not None else None

    def generate(self, prompt: str | list[dict], params: SamplingParams | None = None,
                 on_text: Callable[[str], None] | None = None, stop: threading.Event | None = None, *,
                 encoded: tuple[list[int], str] | None = None) -> GenerationResult:
        """Generate; ``on_text`` receives text as it is committed (never half a character); ``stop``
        and ``encoded`` as ``stream``'s. An error ``on_text`` raises ends the generation and frees
        the engine."""
        check_callbacks(on_text)
        with contextlib.closing(self.stream(prompt, params, stop, encoded=encoded)) as stream:
            while True:
                try:
                    piece = next(stream)
                except StopIteration as done:
                    return done.value
                if on_text is not None:
                    on_text(piece)

    def stream(self, prompt: str | list[dict], params: SamplingParams | None = None,
               stop: threading.Event | None = None, *, encoded: tuple[list[int], str] | None = None
               ) -> Generator[str, None, GenerationResult]:
        """Yield committed text; the generator's return value is the ``GenerationResult``. It runs on
        the engine's own KV caches, so one at a time: a second stream that starts while another is
        under way (begun, not finished or closed) raises ``EngineBusy``. ``stop``, once set (from
        any thread), ends the generation after its current round: its result has the text and
        statistics so far and ``finish_reason`` ``"abort"``. ``encoded``: the prompt's target ids and
        text as ``encode_prompt`` gives them, where the caller has them already."""
        self._open()
        params = given(params, SamplingParams, "params")
        check_callbacks(stop=stop)
        stream = self._one_at_a_time(alone(lambda batch: self.steps(prompt, params, self.target, self.draft,
                                                                    batch, 0, encoded, stop=stop)))
        self._streams.add(stream)
        return stream

    def _one_at_a_time(self, generation: Iterator[str]):
        with self._running():
            return (yield from generation)

    @contextlib.contextmanager
    def _running(self):
        """The engine marked busy while a generation runs on it (``EngineBusy`` if one runs already)."""
        self._idle("or use generate_batch for several")
        self.streaming = True
        try:
            yield
        finally:
            self.streaming = False

    def steps(self, prompt: str | list[dict], params: SamplingParams, target, draft, batch: Batch, key,
              encoded: tuple[list[int], str] | None = None, speculative: bool = True,
              stop: threading.Event | None = None) -> Steps:
        """The generation on the given sequences of the target and the draft, to run in ``batch``
        under ``key``: its k per round follows its schedule (``adaptive_k.BatchSchedule``: its share
        of the batch's passes, unless ``batch_k`` is off; alone, measured costs with ``adaptive_k``).
        ``encoded``: the prompt's target ids and text (``encode_prompt``), when the caller has them
        already; ``speculative=False``: the target alone, the draft left as it is; ``stop``: as
        ``stream``'s."""
        self._open()
        schedule = None
        if self.draft is not None and speculative:
            schedule = batch.schedule(key, self.config.num_speculative_tokens, self.target, self.draft,
                                      self.config.batch_k, self.config.adaptive_k)
        return speculative_generate(self, prompt, params, batch.meter(key), target, draft, schedule, encoded,
                                    speculative, stop)

    @property
    def batchable(self) -> bool:
        """Whether its models hold several KV caches, so that generations can share their passes."""
        self._open()
        return all(isinstance(m, MultiSequence) for m in (self.target, self.draft) if m is not None)

    def new_slot(self) -> tuple:
        """A sequence of the target and one of the draft (None without a draft), each with its own
        KV cache, for one generation of a batch."""
        if not self.batchable:  # raises on a closed engine
            raise ConfigError("batched generation needs models that hold several KV caches (GGUF, or lean "
                              "int8 or bf16, models on anyspec's kernels); run these requests one at a time")
        return self.target.new_sequence(), self.draft.new_sequence() if self.draft is not None else None

    def generate_batch(self, requests: list[tuple[str | list[dict], SamplingParams | None]],
                       max_batch: int = MAX_BATCH) -> list[GenerationResult]:
        """Every ``(prompt, params)`` (params None: the defaults), up to ``max_batch`` at a time; a
        request joins as soon as another one ends, in the slot the server would give it
        (``batch.take_slot``). Each result is the same as ``generate`` gives the request alone."""
        self._open()
        if isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1:
            raise ConfigError(f"max_batch must be an integer >= 1, got {max_batch!r}")
        if not isinstance(requests, list | tuple) or not all(isinstance(r, list | tuple) and len(r) == 2
                                                             for r in requests):
            raise ConfigError("requests must be a list of (prompt, params) pairs (params None: the defaults)")
        requests = [(prompt, given(params, SamplingParams, f"requests[{i}]'s params"))
                    for i, (prompt, params) in enumerate(requests)]
        results: dict[int, GenerationResult] = {}
        errors: dict[int, Exception] = {}
        encoded: dict[int, tuple[list[int], str]] = {}

        def start(i: int, slot: tuple) -> Steps:
            prompt, params = requests[i]
            return self.steps(prompt, params, *slot, driver.batch, i, encoded.pop(i))

        driver = Driver(self.new_slot, start, lambda i, text: None, results.__setitem__, errors.__setitem__,
                        drafts=(self.draft,))
        waiting = list(range(len(requests)))[::-1]
        with self._running(), contextlib.closing(driver):
            while waiting or len(driver):
                while waiting and len(driver) < max_batch and not errors:
                    i = waiting.pop()
                    try:
                        encoded[i] = encode_prompt(self.target.tokenizer, requests[i][0])[:2]
                    except Exception as exc:  # raised below, as a generation's own error is
                        errors[i] = exc
                        break
                    driver.admit(i, encoded[i][0])
                if not errors:
                    driver.step()
                if errors:
                    raise next(iter(errors.values()))
        return [results[i] for i in range(len(requests))]


def speculative_generate(engine: Engine, prompt: str | list[dict], params: SamplingParams, meter: Meter,
                         target=None, draft=None, schedule=None, encoded: tuple[list[int], str] | None = None,
                         speculative: bool = True, stop: threading.Event | None = None) -> Steps:
    """``meter``: the seconds of its passes (``Batch.meter``); ``target`` and ``draft``: the
    sequences it runs on (the engine's models by default); ``schedule``: what chooses k each round
    (``adaptive_k.BatchSchedule``; None: the config's k every round); ``speculative=False``: the
    target alone (prompt lookup still proposes, with ``ngram``); ``stop``: once set, the generation
    ends before its next round (``"abort"``)."""
    target = target if target is not None else engine.target
    draft = (draft if draft is not None else engine.draft) if speculative else None
    proposer, k, sampler, stats = start(engine, params, draft)
    constraint = params.grammar.start(stats) if params.grammar is not None else Free()
    penalties = Penalties.start(params, engine.target.vocab_size, engine.eos_ids)
    predicted = prompt_lookup.prediction_ids(params.prediction, engine.target, stats)
    t_start = time.perf_counter()
    pending, ctx, prompt_ids, scored = yield from prefill(engine, target, draft, prompt, params, stats, meter,
                                                          encoded, stop)
    if penalties:
        penalties.prompted(prompt_ids)
    output = Output(engine.target_bytes, engine.eos_ids, params)
    lookup = prompt_lookup.start(engine.config.ngram, prompt_ids, meter.costs(target), k,
                                 meter.costs(draft) if proposer else None, predicted)
    worth = branch_worth(meter, target, output) if engine.config.tree and proposer else None

    while not output.ended(stop):
        stats.rounds += 1
        behind = len(ctx.ids) - common_prefix(draft.cached_ids, ctx.ids) if proposer else 0
        started = meter.total()
        budget = params.max_new_tokens - len(output.ids) - 1
        k_round = min(schedule.choose(behind) if schedule else k, budget)

        # 1. Propose target tokens (possibly none): what the grammar forces, with the draft's behind
        #    them; a continuation found earlier in the context, alone while the text copies it or
        #    where that beats the draft (no draft forward); else up to k_round of the draft's, with
        #    it beside them where it pays. The grammar's forced tokens follow the chain's end.
        proposal = Proposal([])
        forced = constraint.forced(budget if proposer else 0)
        found = lookup.find(budget) if lookup and not forced else []
        if forced and (k_round == 0 or len(forced) >= budget):
            proposal = Proposal(forced, source="grammar")
        elif found and (proposer is None or k_round == 0 or lookup.copying
                        or lookup.alone_pays(found, behind)):
            proposal = Proposal(found, source="ngram", found=tuple(found))
        elif k_round > 0 and proposer is not None:
            follow(engine, meter, draft, ctx, forced)  # the masked target can write nothing else
            rate = lookup.acceptance.rate if lookup else 0.0
            proposal = yield from propose(proposer, draft, ctx, min(k_round, budget - len(forced)), sampler,
                                          len(output.ids) + len(forced), engine.config, worth, found, rate)
            proposal = after_forced(forced, proposal)

        # 2. Verify them in one target forward over [pending, t1..tm]; 3. accept n, plus one token.
        proposal, mask = constraint.rows(proposal, budget - len(proposal.ids) if proposer else 0)
        accepted, pending, rows = yield from verify(target, pending, proposal, sampler, len(output.ids), mask,
                                                    penalties.rows(proposal) if penalties else None)
        count(stats, proposal, accepted, pending, engine.target_bytes)
        if schedule and proposal.source == "draft":
            schedule.update(proposal.drafted, *proposal.drafted_part(len(accepted)))

        # 4. Commit token by token: EOS, max_new_tokens and stop strings end the generation.
        committed = output.commit(accepted + [pending], rows)
        constraint.advance(committed)
        for follower in filter(None, (lookup, penalties)):
            follower.commit(committed)
        count_commit(stats, len(output.ids), t_start)
        if piece := output.ready():
            yield piece

        # 5. The draft's context follows the committed text (it read the forced lead already).
        if output.finish is None and proposer is not None:
            follow(engine, meter, draft, ctx, committed[proposal.lead:])
        if lookup and proposal.source == "draft":
            lookup.drafted(len(committed) - proposal.lead, meter.total() - started, behind)

    if piece := output.ready():  # what a stop string held back, where ``stop`` ended it
        yield piece
    count_end(stats, meter, target, draft, ctx, t_start, lookup, predicted, output.ids)
    return GenerationResult(output.text, output.ids, output.finish, stats, output.logprobs, scored,
                            output.stopped_by)


def start(engine: Engine, params: SamplingParams, draft) -> tuple[Proposer | None, int, Sampler | None,
                                                                  Stats]:
    """A generation's proposer (None: the target alone, or prompt lookup alone), its k, its sampler
    (None: greedy) and its statistics."""
    proposer = engine.proposer_for(params) if draft is not None else None
    looks = proposer is None and prompt_lookup.min_n(engine.config.ngram, 0, False, bool(params.prediction))
    k = engine.config.num_speculative_tokens if proposer is not None or looks else 0
    seed = request_seed(params)
    sampler = Sampler(params, seed, engine.bridge) if params.temperature else None
    stats = Stats(algorithm=proposer.algorithm if proposer else "ngram" if looks else "none",
                  accepted_hist=[0] * (k + 1), seed=seed if sampler else None)
    return proposer, k, sampler, stats


def follow(engine: Engine, meter: Meter, draft, ctx, ids: list[int]) -> None:
    """The draft's context reads ``ids``, target tokens now committed (or forced on the target)."""
    if ids:
        with meter.timing(draft):
            engine.reader.commit(ctx, ids, b"".join(engine.target_bytes[t] for t in ids))


def branch_worth(meter: Meter, target, output: Output):
    """The ``worth(gain, rows, added)`` rule for branches (``proposers.choose_branches``): a branch
    pays when the tokens it is expected to add, at the seconds of passes each committed token has
    cost so far, outweigh the measured cost of its ``added`` rows on a verify of ``rows``."""
    costs, start = meter.costs(target), meter.total()

    def worth(gain: float, rows: int, added: int) -> bool:
        per_token = (meter.total() - start) / max(1, len(output.ids))
        return gain > 0 and (gain * per_token > costs(rows + added) - costs(rows) if costs.mean else True)

    return worth
