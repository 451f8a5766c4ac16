"""The speculative decoding loop: a draft proposes k tokens, the target verifies them in one pass.

Two ways across different vocabularies: ``algorithm="tli"`` (the draft is confined to the tokens
both vocabularies share, ``algorithms/tli.py``) and ``algorithm="slem"`` (the draft writes freely and
its text is re-encoded with the target tokenizer, ``algorithms/slem.py``); the default, ``"auto"``,
runs SLEM for greedy requests and TLI for sampled ones (``algorithm_for``).

``Engine(target, draft, config).generate(prompt, params)``; ``draft=None`` runs the target alone on
the same loop (k = 0 every round), which is the honest baseline. ``speculative_generate`` is the
whole method top to bottom.
"""

from __future__ import annotations

import codecs
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field

import torch

from anyspec import defaults
from anyspec.algorithms import slem, tli
from anyspec.algorithms.adaptive_k import AdaptiveK, confidence
from anyspec.draft_context import (
    ANCHOR,
    DraftContext,
    append_retokenize,
    append_token_map,
    common_prefix,
)
from anyspec.errors import ConfigError
from anyspec.tokenbytes import text_bytes_table, token_bytes_table

METHODS = ("draft_model",)
ALGORITHMS = ("auto", "tli", "slem")  # auto: SLEM for greedy requests, TLI for sampled ones
DRAFT_SAMPLE_METHODS = ("greedy", "sample")
DRAFT_CONTEXTS = ("retokenize", "token-map")


@dataclass
class SpeculativeConfig:
    method: str = "draft_model"
    num_speculative_tokens: int = defaults.NUM_SPECULATIVE_TOKENS
    use_heterogeneous_vocab: bool = True
    draft_sample_method: str = "sample"
    algorithm: str = "auto"
    draft_context: str = "retokenize"
    adaptive_k: bool = False  # per round, k in 0..num_speculative_tokens from measured speed
    draft_confidence: float = defaults.DRAFT_CONFIDENCE  # end a round's draft after a token the draft
    #                                                      gives less probability (0 = off)
    prefix_cache: bool = True  # start from the KV cache of the prompt prefix a request shares with
    #                            the one before (row-invariant models only: reuse_prefix)

    def __post_init__(self):
        if self.method not in METHODS:
            raise ConfigError(f"unknown speculative method {self.method!r}; use method='draft_model'")
        if isinstance(self.num_speculative_tokens, bool) or not isinstance(self.num_speculative_tokens, int) \
                or self.num_speculative_tokens < 1:
            raise ConfigError(f"num_speculative_tokens (k) must be an integer >= 1, got "
                              f"{self.num_speculative_tokens!r}; use --no-draft for target-only decoding")
        if self.algorithm not in ALGORITHMS:
            raise ConfigError(f"unknown algorithm {self.algorithm!r}; use one of {', '.join(ALGORITHMS)}")
        if self.draft_sample_method not in DRAFT_SAMPLE_METHODS:
            raise ConfigError(f"unknown draft_sample_method {self.draft_sample_method!r}; "
                              f"use one of {', '.join(DRAFT_SAMPLE_METHODS)}")
        if self.draft_context not in DRAFT_CONTEXTS:
            raise ConfigError(f"unknown draft_context {self.draft_context!r}; "
                              f"use one of {', '.join(DRAFT_CONTEXTS)}")
        if isinstance(self.draft_confidence, bool) or not isinstance(self.draft_confidence, (int, float)) \
                or not 0 <= self.draft_confidence < 1:
            raise ConfigError(f"draft_confidence must be a probability in [0, 1) (0 = off), got "
                              f"{self.draft_confidence!r}")
        if not isinstance(self.prefix_cache, bool):
            raise ConfigError(f"prefix_cache must be True or False, got {self.prefix_cache!r}")
        if self.algorithm == "slem" and self.draft_context != "retokenize":
            raise ConfigError("algorithm='slem' needs draft_context='retokenize' (the draft writes its own "
                              "tokens, so it must read its own tokenization)")


@dataclass
class SamplingParams:
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    max_new_tokens: int = 128
    seed: int | None = None
    stop: list[str] = field(default_factory=list)

    def __post_init__(self):
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        if not self.temperature >= 0:
            raise ConfigError(f"temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"top_p must be in (0, 1], got {self.top_p}")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise ConfigError(f"top_k must be an integer >= 0 (0 = off), got {self.top_k!r}")
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise ConfigError(f"max_new_tokens must be an integer >= 1, got {self.max_new_tokens!r}")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise ConfigError("stop strings must be non-empty strings")


@dataclass
class Stats:
    algorithm: str = "none"  # what ran: tli, slem, or none (the target alone)
    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    generated: int = 0
    accepted_hist: list[int] = field(default_factory=list)  # rounds that accepted 0, 1, .., k tokens
    prompt_tokens: int = 0
    prompt_cached: int = 0  # prompt tokens whose KV came from the previous request (prefix_cache)
    draft_seconds: float = 0.0
    target_seconds: float = 0.0
    total_seconds: float = 0.0
    draft_fallbacks: int = 0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def mean_accepted_length(self) -> float:
        """Proposed target tokens accepted per round (the bonus token not counted)."""
        return self.accepted / self.rounds if self.rounds else 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.generated / self.total_seconds if self.total_seconds else 0.0

    def to_dict(self) -> dict:
        out = asdict(self)
        out.update(acceptance_rate=self.acceptance_rate, mean_accepted_length=self.mean_accepted_length,
                   tokens_per_second=self.tokens_per_second)
        return out


@dataclass
class GenerationResult:
    text: str
    token_ids: list[int]  # target ids of the generated tokens (an EOS that ended it not included)
    finish_reason: str  # "stop" (EOS or a stop string) or "length"
    stats: Stats


class DraftProposer:
    """The draft model plus the bridge to the target vocabulary.

    With ``use_heterogeneous_vocab`` the bridge is a ``VocabMapping`` (the intersection); without
    it the vocabularies must be the same size and ids pass through unchanged. SLEM crosses through
    the text instead and uses only the two byte tables and the target tokenizer.
    """

    def __init__(self, draft, target, config: SpeculativeConfig):
        self.model = draft
        self.config = config
        tokenizer = draft.tokenizer
        if config.use_heterogeneous_vocab:
            from anyspec.vocab import VocabMapping

            with warnings.catch_warnings():  # the engine never maps target ids to a target UNK
                warnings.filterwarnings("ignore", message="the target tokenizer has no unk token")
                mapping = VocabMapping(target.tokenizer, tokenizer, target.vocab_size, draft.vocab_size,
                                       "cpu")
            if mapping.intersection_size == 0:
                raise ConfigError("the draft and target vocabularies share no token; choose another draft")
            self.intersection_mask = mapping.intersection_mask.to(torch.bool)
            draft_to_target = mapping.draft_to_target.to(torch.long)
            target_to_draft = mapping.target_to_draft.to(torch.long)
            self.token_bytes = text_bytes_table(mapping.draft_token_bytes, draft.vocab_size)
            self.target_token_bytes = text_bytes_table(mapping.target_token_bytes, target.vocab_size)
            self.unk_id = mapping.draft_unk_id
        else:
            if draft.vocab_size != target.vocab_size:
                raise ConfigError(
                    f"the draft's vocabulary ({draft.vocab_size} ids) differs from the target's "
                    f"({target.vocab_size}); set use_heterogeneous_vocab=True to draft across vocabularies")
            self.intersection_mask = None
            draft_to_target = target_to_draft = torch.arange(target.vocab_size)
            slem_tables = config.algorithm != "tli"  # auto runs SLEM for greedy requests
            self.token_bytes = token_bytes_table(tokenizer, draft.vocab_size) if slem_tables else []
            self.target_token_bytes = (token_bytes_table(target.tokenizer, target.vocab_size) if slem_tables
                                       else None)
            self.unk_id = 0
        self.inter_draft_ids, self.inter_target_ids = tli.intersection_ids(draft_to_target,
                                                                            self.intersection_mask)
        self.draft_to_target = draft_to_target.tolist()
        self.target_to_draft = target_to_draft.tolist()
        self.anchor_ids = tokenizer.encode(ANCHOR, add_special_tokens=False)
        self.target_tokenizer = target.tokenizer
        self.target_anchor_ids = target.tokenizer.encode(ANCHOR, add_special_tokens=False)
        self.own_context = config.use_heterogeneous_vocab and config.draft_context == "retokenize"

    def start(self, prompt_text: str, target_prompt_ids: list[int], chat: bool) -> DraftContext:
        """The draft's context for a prompt: its own tokenization, or target ids mapped one by one."""
        if self.own_context:
            ids = self.model.tokenizer.encode(prompt_text, add_special_tokens=not chat)
            return DraftContext(ids=ids, n_fixed=len(ids))
        ctx = DraftContext(ids=[], n_fixed=0, policy="token-map")
        append_token_map(ctx, target_prompt_ids, self.target_to_draft, self.unk_id)
        ctx.n_fixed = len(ctx.ids)
        return ctx

    def commit(self, ctx: DraftContext, target_ids: list[int], new_bytes: bytes) -> None:
        if ctx.policy == "retokenize":
            append_retokenize(ctx, new_bytes, self.model.tokenizer, self.token_bytes, self.anchor_ids)
        else:
            append_token_map(ctx, target_ids, self.target_to_draft, self.unk_id)

    def text_to_target(self, ctx: DraftContext, draft_ids: list[int], limit: int) -> list[int]:
        """SLEM: the draft tokens' text as at most ``limit`` target ids that spell it exactly.

        Nothing when the committed text ends inside a character: the draft reads only up to that
        character, so its text does not continue the target's bytes.
        """
        if ctx.policy == "retokenize" and len(ctx.text) > (ctx.ends[-1] if ctx.ends else 0):
            return []
        return slem.retokenize(slem.draft_bytes(draft_ids, self.token_bytes), self.target_tokenizer,
                               self.target_token_bytes, self.target_anchor_ids, limit)

    def q_target_space(self, qs: list[torch.Tensor | int], target_vocab_size: int) -> torch.Tensor:
        """Stack the round's q' (a greedy draft's q' is one-hot) into target space ``[k, Vt]``."""
        rows = []
        for q in qs:
            if isinstance(q, int):
                row = torch.zeros(target_vocab_size)
                row[self.draft_to_target[q]] = 1.0
                rows.append(row)
            else:
                rows.append(tli.to_target_space(q, self.inter_draft_ids, self.inter_target_ids,
                                                target_vocab_size))
        return torch.stack(rows)


class Engine:
    def __init__(self, target, draft=None, config: SpeculativeConfig | None = None):
        self.target = target
        self.config = config or SpeculativeConfig()
        self.proposer = DraftProposer(draft, target, self.config) if draft is not None else None
        known = self.proposer.target_token_bytes if self.proposer is not None else None
        self.target_bytes = known if known is not None else token_bytes_table(target.tokenizer,
                                                                              target.vocab_size)
        from anyspec.vocab.bytes import eos_ids

        self.eos_ids = target.eos_ids() | set(eos_ids(target.tokenizer))

    def generate(self, prompt: str | list[dict], params: SamplingParams | None = None,
                 on_text: Callable[[str], None] | None = None) -> GenerationResult:
        """Generate; ``on_text`` receives text as it is committed (never half a character)."""
        stream = self.stream(prompt, params)
        while True:
            try:
                piece = next(stream)
            except StopIteration as done:
                return done.value
            if on_text is not None:
                on_text(piece)

    def stream(self, prompt: str | list[dict], params: SamplingParams | None = None
               ) -> Iterator[str]:
        """Yield committed text; the generator's return value is the ``GenerationResult``."""
        return speculative_generate(self, prompt, params or SamplingParams())


def algorithm_for(config: SpeculativeConfig, params: SamplingParams) -> str:
    """The algorithm a request runs. ``auto``: SLEM when greedy (exact match keeps every draft
    token the target would pick, and the draft may write tokens outside the intersection; on code it
    accepted 45% vs TLI's 24%), TLI when sampling (accepting with min(1, p/q') keeps more than exact
    match's p(t)), and TLI with the token-map context, which SLEM cannot use."""
    if config.algorithm != "auto":
        return config.algorithm
    if params.temperature == 0 and config.draft_context == "retokenize":
        return "slem"
    return "tli"


def check_prompt(prompt: str | list[dict]) -> None:
    if isinstance(prompt, str):
        if not prompt:
            raise ConfigError("the prompt is empty; pass some text")
    elif not prompt or not all(isinstance(m, dict) and "role" in m for m in prompt):
        raise ConfigError("chat messages must be a non-empty list of {'role': ..., 'content': ...}")


def render_prompt(tokenizer, prompt: str | list[dict], fallback_text: str | None = None) -> tuple[str, bool]:
    """``(text, is_chat)``: chat messages through the tokenizer's own template when it has one."""
    check_prompt(prompt)
    if isinstance(prompt, str):
        return prompt, False
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True), True
    if fallback_text is not None:
        return fallback_text, False
    raise ConfigError("the target tokenizer has no chat template; pass the prompt as plain text")


def speculative_generate(engine: Engine, prompt: str | list[dict], params: SamplingParams
                         ) -> Iterator[str]:
    target, proposer = engine.target, engine.proposer
    k = engine.config.num_speculative_tokens if proposer is not None else 0
    use_slem = proposer is not None and algorithm_for(engine.config, params) == "slem"
    greedy = params.temperature == 0
    generator = torch.Generator().manual_seed(params.seed if params.seed is not None else 0)
    if params.seed is None:
        generator.seed()
    stats = Stats(accepted_hist=[0] * (k + 1))
    if proposer is not None:
        stats.algorithm = "slem" if use_slem else "tli"
    schedule = AdaptiveK(k) if proposer is not None and engine.config.adaptive_k else None
    stop_below = engine.config.draft_confidence
    t_start = time.perf_counter()

    # Prompt: the target's tokens; the draft's own tokenization of the same text.
    target_text, chat = render_prompt(target.tokenizer, prompt)
    prompt_ids = target.tokenizer.encode(target_text, add_special_tokens=not chat)
    stats.prompt_tokens = len(prompt_ids)
    reuse = engine.config.prefix_cache
    stats.prompt_cached = reuse_prefix(target, prompt_ids[:-1], reuse)
    t0 = time.perf_counter()
    if len(prompt_ids) - 1 > stats.prompt_cached:
        target.extend(prompt_ids[stats.prompt_cached:-1], last=1)
    stats.target_seconds += time.perf_counter() - t0
    pending = prompt_ids[-1]  # committed, not yet in the target's cache
    if proposer is not None:
        draft = proposer.model
        if not reusable(draft, reuse):
            draft.reset()  # else the first round's catch-up keeps what the draft's prompt shares
        draft_text, draft_chat = render_prompt(draft.tokenizer, prompt, fallback_text=target_text)
        ctx = proposer.start(draft_text, prompt_ids, draft_chat)

    out_ids: list[int] = []
    out_text = ""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    hold = max((len(s) for s in params.stop), default=1) - 1  # chars that may start a stop string
    streamed = 0
    finish = None
    while finish is None:
        stats.rounds += 1
        k_round = min(schedule.choose() if schedule else k, params.max_new_tokens - len(out_ids) - 1)

        # 1. Propose: k draft tokens, one cached forward each. TLI constrains them to the
        #    intersection; SLEM lets the draft write freely and re-encodes its text for the target
        #    (at most k target tokens, possibly none).
        t0 = time.perf_counter()
        draft_ids, qs, catch_up = [], [], 0
        if k_round > 0:
            keep = min(common_prefix(draft.cached_ids, ctx.ids), len(ctx.ids) - 1)
            catch_up = len(ctx.ids) - keep
            draft.crop(keep)
            logits = draft.extend(ctx.ids[keep:], last=1)[-1]
            temperature = 0.0 if proposer.config.draft_sample_method == "greedy" else params.temperature
            for i in range(k_round):
                if use_slem:
                    d, q = slem.propose(logits, temperature, params.top_k, params.top_p, generator), None
                else:
                    d, q = tli.propose(logits, proposer.intersection_mask, temperature, params.top_k,
                                       params.top_p, generator)
                draft_ids.append(d)
                qs.append(d if q is None else q)
                if use_slem and not proposer.token_bytes[d]:
                    break  # EOS or another special token ends the draft's text (slem.draft_bytes)
                if stop_below and i + 1 < k_round and confidence(
                        logits, d, q, None if use_slem else proposer.intersection_mask) < stop_below:
                    break  # the draft doubts this token: the next ones are unlikely to be accepted
                if i + 1 < k_round:
                    logits = draft.extend([d])[-1]
        if use_slem:
            proposed = proposer.text_to_target(ctx, draft_ids, k_round)
        else:
            proposed = [proposer.draft_to_target[d] for d in draft_ids]
        draft_time = time.perf_counter() - t0
        stats.draft_seconds += draft_time

        # 2. Verify the m proposed tokens in one target forward over [pending, t1..tm]; 3. accept.
        #    SLEM is exact match: speculative sampling with a one-hot q on each proposed token.
        t0 = time.perf_counter()
        logits = target.extend([pending] + proposed)
        if greedy:
            n, next_token = tli.verify_greedy(logits, proposed)
        else:
            p = tli.target_probs(logits, params.temperature, params.top_k, params.top_p)
            if use_slem:
                q = slem.one_hot(proposed, p.shape[-1])
            else:
                q = proposer.q_target_space(qs, target.vocab_size) if qs else None
            n, next_token = tli.verify_sample(p, q, proposed, generator)
        target.crop(target.num_cached - (len(proposed) - n))  # keep pending + the n accepted
        pending = next_token
        stats.target_seconds += time.perf_counter() - t0
        if schedule:  # a draft pass that also read the prompt or a long tail is no measure of k
            schedule.update(len(draft_ids), n, draft_time if catch_up <= 3 else None,
                            time.perf_counter() - t0, proposed=len(proposed))
        stats.drafted += len(proposed)
        stats.accepted += n
        stats.accepted_hist[n] += 1

        # 4. Commit token by token: EOS, max_new_tokens and stop strings end the generation.
        committed, cut = [], None
        for token in proposed[:n] + [next_token]:
            if token in engine.eos_ids:
                finish = "stop"
                break
            committed.append(token)
            out_ids.append(token)
            size = len(out_text)
            out_text += decoder.decode(engine.target_bytes[token])
            cut = _find_stop(out_text, params.stop, size)
            if cut is not None:
                out_text, finish = out_text[:cut], "stop"
                break
            if len(out_ids) >= params.max_new_tokens:
                finish = "length"
                break
        stats.generated = len(out_ids)
        if finish is not None:
            if cut is None:
                out_text += decoder.decode(b"", final=True)  # an unfinished character becomes U+FFFD
            hold = 0
        if len(out_text) - hold > streamed:
            yield out_text[streamed: len(out_text) - hold]
            streamed = len(out_text) - hold

        # 5. The draft's context follows the committed text.
        if finish is None and proposer is not None:
            t0 = time.perf_counter()
            proposer.commit(ctx, committed, b"".join(engine.target_bytes[t] for t in committed))
            stats.draft_seconds += time.perf_counter() - t0

    if proposer is not None:
        stats.draft_fallbacks = ctx.fallbacks
    stats.total_seconds = time.perf_counter() - t_start
    return GenerationResult(text=out_text, token_ids=out_ids, finish_reason=finish, stats=stats)


def reuse_prefix(model, ids: list[int], enabled: bool = True) -> int:
    """Keep the cached tokens that begin ``ids`` and drop the rest; returns how many were kept.

    Only for a row-invariant model (``model.row_invariant``: anyspec's row-wise kernel in every
    product and attention, so a token's keys and values are the same bits however many tokens were
    computed with it); any other model starts empty, since a prefix computed within another
    request could differ in the last bits from the target alone's own prefill.
    """
    keep = common_prefix(model.cached_ids, ids) if reusable(model, enabled) else 0
    if keep:
        model.crop(keep)
    else:
        model.reset()
    return keep


def reusable(model, enabled: bool) -> bool:
    return enabled and getattr(model, "row_invariant", False)


def _find_stop(text: str, stops: list[str], before: int) -> int | None:
    """Index of the earliest stop string that ends after position ``before``, or None."""
    best = None
    for s in stops:
        i = text.find(s, max(0, before - len(s) + 1))
        if i >= 0 and (best is None or i < best):
            best = i
    return best


def generate(prompt: str | list[dict], target: str = "qwen2.5-coder-1.5b", draft: str | None = "smollm2-135m",
             config: SpeculativeConfig | None = None, params: SamplingParams | None = None,
             dtype: str | None = None, on_text: Callable[[str], None] | None = None,
             draft_dtype: str | None = None) -> GenerationResult:
    """One call: load the models (built-in names, folders or GGUF files) and generate."""
    from anyspec.backends.transformers import check_model_path, load_model, resolve_dtype

    config = config or SpeculativeConfig()
    params = params or SamplingParams()
    check_prompt(prompt)
    for spec in [target] + ([draft] if draft else []):
        check_model_path(spec)
    target_model = load_model(target, dtype=dtype, name="target")
    draft_dtype = resolve_dtype(draft_dtype, draft=True)
    draft_model = load_model(draft, dtype=draft_dtype, name="draft") if draft else None
    return Engine(target_model, draft_model, config).generate(prompt, params, on_text=on_text)
