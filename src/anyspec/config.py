"""What a run may ask for, checked once: ``SpeculativeConfig`` (the pair's settings), ``SamplingParams``
(one request's) and the prompt. Every check raises ``ConfigError`` before any model is touched; the
CLI prints it as one line and the server answers 400.

The defaults for k and the draft's confidence stop are tuned by ``benchmarks/tune.py``
(docs/benchmarks.md): a round drafts up to 5 tokens and ends after a token the draft itself gives
less than 0.5, or less than 0.7 where each verified row costs more (anyspec's kernels below their
AVX-512 level: ``proposers.tuned_confidence``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields

from anyspec.errors import ConfigError

NUM_SPECULATIVE_TOKENS = 5
DRAFT_CONFIDENCE = 0.5  # where a verified row costs little beside a one-row forward
DRAFT_CONFIDENCE_AVX2 = 0.7  # anyspec's kernels at their AVX2 or plain level, where it costs more
MAX_BATCH = 4  # generations run together (Engine.generate_batch, anyspec serve)
MAX_SPECULATIVE_TOKENS = 64  # a round's draft; acceptance falls geometrically long before this
TREE_BRANCHES = 2  # a round's branches beside its chain, at most, where the target takes a tree (and
#                    verified rows are cheap: proposers.tuned_tree)
MAX_TREE_BRANCHES = 8
MAX_LOGPROBS = 20  # the most of the likeliest tokens reported beside each token (OpenAI's top_logprobs)
DRAFT_WINDOW = 256  # the draft reads a long prompt's last 256 to 511 tokens (engine/context.py prompt_window)
MAX_NGRAM = 4  # the longest context suffix prompt lookup matches (algorithms/ngram.py MAX_N)
AUTO_NGRAM, AUTO_NGRAM_PROMPT = 2, 256  # lookup by default: prompts this long (pasted files, documents,
#                                         conversations) are what answers copy; on short ones it costs
# Sampling settings below these are refused: logits / temperature and the top-p mass are float32,
# where smaller values overflow or round to 0 (temperature 0 is greedy; top_p 1e-6 is greedy already).
MIN_TEMPERATURE = 1e-4
MIN_TOP_P = 1e-6

METHODS = ("draft_model",)
ALGORITHMS = ("auto", "tli", "slem")  # auto: SLEM, but TLI where the draft reads the token map
DRAFT_SAMPLE_METHODS = ("greedy", "sample")
DRAFT_CONTEXTS = ("retokenize", "token-map")
SEED_RANGE = (0, 2**64)  # a seed's 64 bits
NO_SEED = -1  # llama.cpp's "a random seed": as if none were given


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def flag(default, help: str, *flags: str, **argparse_options):
    """A settings field and its command-line flag (``cli/options.add_flags``; ``SpeculativeConfig``'s,
    the server's ``Settings``): the flag's spelling (default ``--field-name``; a switch for a bool,
    inverting one that defaults to True), help and any argparse options (``type`` where the default
    is None, ``choices``, ``metavar``, a hidden ``alias``)."""
    return field(default=default, metadata={"help": help, "flags": flags, **argparse_options})


@dataclass(frozen=True)
class SpeculativeConfig:
    """The pair's settings, checked as they are made; ``dataclasses.replace`` makes a changed copy
    (checked again). Each field's metadata is its command-line flag (``cli/options.py``)."""

    method: str = flag(
        "draft_model", "speculative method: draft_model (the only one, and the default): the draft model "
        "proposes tokens, the target verifies them", metavar="{" + ",".join(METHODS) + "}")
    num_speculative_tokens: int = flag(
        NUM_SPECULATIVE_TOKENS, f"draft tokens per round, at most (1 to {MAX_SPECULATIVE_TOKENS}; "
        "default %(default)s)", "-k", "--num-speculative-tokens", metavar="K", alias="--k")
    use_heterogeneous_vocab: bool = flag(
        True, "the draft shares the target's vocabulary (use_heterogeneous_vocab off)", "--same-vocab")
    draft_sample_method: str = flag(
        "sample", "sampled requests: sample (default): the draft's choice reads the same noise as the "
        "target's (Gumbel-max) | greedy: the draft proposes its argmax",
        metavar="{" + ",".join(DRAFT_SAMPLE_METHODS) + "}")
    algorithm: str = flag(
        "auto", "auto (default): slem, or tli with --draft-context token-map | tli: the draft keeps to the "
        "shared tokens | slem: the draft writes freely, its text is re-encoded", choices=ALGORITHMS)
    draft_context: str = flag(
        "retokenize", "retokenize (default): the draft reads its own tokenization of the text | token-map: "
        "the target's tokens mapped one by one (vLLM's)", metavar="{" + ",".join(DRAFT_CONTEXTS) + "}")
    draft_window: int = flag(
        DRAFT_WINDOW, "the draft reads at most the last 2N tokens of a long prompt, from a multiple of N "
        "(0 = all of it; default %(default)s); the target always reads all", metavar="N")
    adaptive_k: bool = flag(
        False, "choose k (0 = target alone) each round from measured acceptance and speed")
    draft_confidence: float | None = flag(
        None, "end a round's draft after a token the draft gives probability below P (0 = always draft "
        f"k; default: {DRAFT_CONFIDENCE}, or {DRAFT_CONFIDENCE_AVX2} where anyspec's kernels run below "
        "their AVX-512 level)", type=float, metavar="P")
    prefix_cache: bool = flag(
        True, "prefill every prompt in full (default: a request starts from the KV cache of the prefix it "
        "shares with the one before or with another slot, on row-invariant models)", "--no-prefix-cache")
    batch_k: bool = flag(
        True, "in a batch, draft each generation's configured k every round (default: its k per round "
        "from the batch's pass costs and its acceptance)", "--no-batch-k")
    ngram: int | None = flag(
        None, "prompt lookup: where the last N or more tokens occurred earlier in the context, propose what "
        "followed them: alone while the text copies it, else beside the draft's chain; with --no-draft too "
        f"(0 = off; default: {AUTO_NGRAM} where a draft runs and the prompt has at least "
        f"{AUTO_NGRAM_PROMPT} tokens, else off; engine/lookup.py)", type=int, metavar="N")
    tree: int | None = flag(
        None, "up to N branches beside the draft's chain, at its second "
        f"choices where they pay for their rows (0 = the chain alone; default: {TREE_BRANCHES} where the "
        "target runs on anyspec's kernels (GGUF, or lean int8 or bf16) at their AVX-512 level, else 0; "
        "algorithms/tree.py)",
        type=int, metavar="N")

    def __post_init__(self):
        if self.method not in METHODS:
            raise ConfigError(f"unknown speculative method {self.method!r}; use method='draft_model'")
        k = self.num_speculative_tokens
        if not _is_int(k) or not 1 <= k <= MAX_SPECULATIVE_TOKENS:
            raise ConfigError(f"num_speculative_tokens (k) must be an integer from 1 to "
                              f"{MAX_SPECULATIVE_TOKENS}, got {k!r}; use draft=None (--no-draft) for "
                              "target-only decoding",
                              "num_speculative_tokens")
        if self.algorithm not in ALGORITHMS:
            raise ConfigError(f"unknown algorithm {self.algorithm!r}; use one of {', '.join(ALGORITHMS)}")
        if self.draft_sample_method not in DRAFT_SAMPLE_METHODS:
            raise ConfigError(f"unknown draft_sample_method {self.draft_sample_method!r}; "
                              f"use one of {', '.join(DRAFT_SAMPLE_METHODS)}")
        if self.draft_context not in DRAFT_CONTEXTS:
            raise ConfigError(f"unknown draft_context {self.draft_context!r}; "
                              f"use one of {', '.join(DRAFT_CONTEXTS)}")
        if self.draft_confidence is not None and (not _is_number(self.draft_confidence)
                                                  or not 0 <= self.draft_confidence < 1):
            raise ConfigError(f"draft_confidence must be a probability in [0, 1) (0 = off), got "
                              f"{self.draft_confidence!r}", "draft_confidence")
        if not _is_int(self.draft_window) or self.draft_window < 0:
            raise ConfigError(f"draft_window must be an integer >= 0 (0 = the whole prompt), "
                              f"got {self.draft_window!r}", "draft_window")
        if self.ngram is not None and (not _is_int(self.ngram) or not 0 <= self.ngram <= MAX_NGRAM):
            raise ConfigError(f"ngram must be an integer from 0 (off) to {MAX_NGRAM}, got {self.ngram!r}",
                              "ngram")
        if self.tree is not None and (not _is_int(self.tree) or not 0 <= self.tree <= MAX_TREE_BRANCHES):
            raise ConfigError(f"tree must be an integer from 0 (the chain alone) to {MAX_TREE_BRANCHES} "
                              f"branches, got {self.tree!r}", "tree")
        for name in ("use_heterogeneous_vocab", "adaptive_k", "prefix_cache", "batch_k"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{name} must be True or False, got {getattr(self, name)!r}")
        if self.algorithm == "slem" and self.draft_context != "retokenize":
            raise ConfigError("algorithm='slem' needs draft_context='retokenize' (the draft writes its own "
                              "tokens, so it must read its own tokenization)")


DRAFT_ONLY = ("use_heterogeneous_vocab", "draft_sample_method", "algorithm", "draft_context", "draft_window",
              "adaptive_k", "draft_confidence", "batch_k", "tree")  # what only a draft's rounds read


def check_alone(config: SpeculativeConfig) -> None:
    """The target decodes alone: a setting of the draft's rounds (k too, unless prompt lookup
    proposes) set away from its default would be ignored, so it is an error."""
    default = SpeculativeConfig()
    names = [n for n in DRAFT_ONLY if getattr(config, n) != getattr(default, n)]
    if not config.ngram and config.num_speculative_tokens != default.num_speculative_tokens:
        names.insert(0, "num_speculative_tokens")
    if names:
        said = ", ".join(f"{n} ({_spelling(n)})" for n in names)
        lookup = " (k on prompt lookup's too, --ngram)" if names[0] == "num_speculative_tokens" else ""
        raise ConfigError(f"{said} only {'acts' if len(names) == 1 else 'act'} on a draft's rounds{lookup}, "
                          "and there is no draft (--no-draft, draft=None); leave "
                          f"{'it' if len(names) == 1 else 'them'} out", names[0])


def _spelling(name: str) -> str:
    return "/".join(flags_of(name))


def flags_of(name: str, settings: type | None = None) -> tuple[str, ...]:
    """The command-line spellings of a settings field (``SpeculativeConfig``'s by default): those its
    metadata gives, else ``--field-name`` (a field of no settings class: ``--field-name`` too)."""
    spelled = {f.name: f.metadata.get("flags") for f in fields(settings or SpeculativeConfig)}.get(name)
    return tuple(spelled or ()) or (f"--{name.replace('_', '-')}",)


@dataclass(frozen=True)
class SamplingParams:
    """One request's sampling and stopping, checked as they are made; ``dataclasses.replace`` makes a
    changed copy (checked again)."""

    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    min_p: float = 0.0  # 0 = off
    typical_p: float = 1.0  # locally typical sampling (transformers'): off at 1
    top_n_sigma: float = 0.0  # llama.cpp's: the tokens within n standard deviations of the top (0 = off)
    presence_penalty: float = 0.0  # OpenAI's: off at 0, each from -2 to 2
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0  # vLLM's: off at 1; a seen token's logit / it where > 0, * it where not
    logit_bias: dict[int, float] = field(default_factory=dict)  # target token id -> added to its logit
    max_new_tokens: int = 128  # 0: the prompt is only read (into the prefix cache; its logprobs)
    min_tokens: int = 0  # the end-of-sequence tokens and stop strings wait for this many tokens
    ignore_eos: bool = False  # the end-of-sequence tokens are never chosen (max_new_tokens or a stop ends)
    seed: int | None = None  # 0 to 2**64 - 1; None or -1: the answer draws its own
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)  # vLLM's: each ends the answer, itself kept
    include_stop_str_in_output: bool = False  # vLLM's: a stop string that ends the answer stays in it
    allowed_token_ids: list[int] | None = None  # vLLM's: the answer's tokens are these alone (None: any)
    logprobs: int | None = None  # report each token's logprob and this many likeliest (None: off)
    prompt_logprobs: int | None = None  # the same for the prompt's tokens (its KV then computed anew)
    grammar: object = None  # a compiled grammar the answer follows (engine/grammar.py; None: free text)
    prediction: str | list[int] | None = None  # text the answer likely repeats, or its target token
    # ids (OpenAI's Predicted Outputs): prompt lookup proposes from it too (engine/lookup.py); the
    # answer is the same with it or without

    def __post_init__(self):
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", [self.stop])
        elif self.stop is None or isinstance(self.stop, tuple):
            object.__setattr__(self, "stop", list(self.stop or ()))
        if not isinstance(self.stop, list):
            raise ConfigError(f"stop must be a string or a list of strings, got {type(self.stop).__name__}",
                              "stop")
        if not _is_number(self.temperature) or not 0 <= self.temperature < math.inf:
            raise ConfigError(f"temperature must be a finite number >= 0 (0 = greedy), "
                              f"got {self.temperature!r}", "temperature")
        if 0 < self.temperature < MIN_TEMPERATURE:
            raise ConfigError(f"temperature must be 0 (greedy) or at least {MIN_TEMPERATURE:g}, "
                              f"got {self.temperature!r}", "temperature")
        if not _is_number(self.top_p) or not 0 < self.top_p <= 1:
            raise ConfigError(f"top_p must be in (0, 1], got {self.top_p!r}", "top_p")
        if self.top_p < MIN_TOP_P:
            raise ConfigError(f"top_p must be at least {MIN_TOP_P:g} (smaller keeps only the top token "
                              f"anyway), got {self.top_p!r}", "top_p")
        if not _is_number(self.min_p) or not 0 <= self.min_p <= 1:
            raise ConfigError(f"min_p must be in [0, 1] (0 = off), got {self.min_p!r}", "min_p")
        if not _is_number(self.typical_p) or not 0 < self.typical_p <= 1:
            raise ConfigError(f"typical_p must be in (0, 1] (1 = off), got {self.typical_p!r}", "typical_p")
        if not _is_number(self.top_n_sigma) or not 0 <= self.top_n_sigma <= 100:
            raise ConfigError(f"top_n_sigma must be from 0 to 100 (0 = off), got {self.top_n_sigma!r}",
                              "top_n_sigma")
        for name, value in (("presence_penalty", self.presence_penalty),
                            ("frequency_penalty", self.frequency_penalty)):
            if not _is_number(value) or not -2 <= value <= 2:
                raise ConfigError(f"{name} must be from -2 to 2, got {value!r}", name)
        if not _is_number(self.repetition_penalty) or not 0 < self.repetition_penalty < math.inf:
            raise ConfigError(f"repetition_penalty must be a finite number above 0 (1 = off), "
                              f"got {self.repetition_penalty!r}", "repetition_penalty")
        bias = self.logit_bias
        if not isinstance(bias, dict) or not all(_is_int(t) and t >= 0 and _is_number(b) and -100 <= b <= 100
                                                 for t, b in bias.items()):
            raise ConfigError("logit_bias must map token ids (integers >= 0) to numbers from -100 to 100",
                              "logit_bias")
        if not _is_int(self.top_k) or self.top_k < 0:
            raise ConfigError(f"top_k must be an integer >= 0 (0 = off), got {self.top_k!r}", "top_k")
        if not _is_int(self.max_new_tokens) or self.max_new_tokens < 0:
            raise ConfigError(f"max_new_tokens must be an integer >= 0 (0: the prompt is only read, and "
                              f"scored with prompt_logprobs), got {self.max_new_tokens!r}", "max_new_tokens")
        if not _is_int(self.min_tokens) or not 0 <= self.min_tokens <= self.max_new_tokens:
            raise ConfigError(f"min_tokens must be an integer from 0 to the most new tokens "
                              f"({self.max_new_tokens}), got {self.min_tokens!r}", "min_tokens")
        for name in ("ignore_eos", "include_stop_str_in_output"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{name} must be true or false, got {getattr(self, name)!r}", name)
        if self.grammar is not None:
            check_with_grammar(self)
        object.__setattr__(self, "seed", checked_seed(self.seed))
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None and not (_is_int(value) and 0 <= value <= MAX_LOGPROBS):
                raise ConfigError(f"{name} must be an integer from 0 to {MAX_LOGPROBS}, got {value!r}", name)
        if not _token_ids(self.stop_token_ids):
            raise ConfigError("stop_token_ids must be a list of token ids (integers >= 0)", "stop_token_ids")
        allowed = self.allowed_token_ids
        if allowed is not None and not (allowed and _token_ids(allowed)):
            raise ConfigError("allowed_token_ids must be a non-empty list of token ids (integers >= 0)",
                              "allowed_token_ids")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise ConfigError("stop strings must be non-empty strings", "stop")
        for s in self.stop:
            check_text(s, "a stop string", "stop")
        if isinstance(self.prediction, list):
            if not (self.prediction and _token_ids(self.prediction)):
                raise ConfigError("prediction must be a string or a non-empty list of token ids (integers "
                                  ">= 0)", "prediction")
        elif self.prediction is not None:
            if not isinstance(self.prediction, str):
                raise ConfigError(f"prediction must be a string (the text the answer likely repeats) or its "
                                  f"token ids, got {type(self.prediction).__name__}", "prediction")
            check_text(self.prediction, "the prediction", "prediction")
            if not self.prediction:
                raise ConfigError("the prediction is empty; give the text the answer likely repeats, or "
                                  "leave it out", "prediction")


def given(value, kind: type, what: str):
    """``value`` if it is a ``kind``, ``kind()`` if it is None; else a ConfigError naming ``what``."""
    if value is None:
        return kind()
    if not isinstance(value, kind):
        raise ConfigError(f"{what} must be a {kind.__name__}, got {type(value).__name__}")
    return value


def check_with_grammar(params: SamplingParams) -> None:
    """An answer held to a grammar ends where the grammar does, and its tokens are those the grammar
    allows: ``allowed_token_ids`` would leave a position where the grammar allows none of them."""
    if params.min_tokens or params.ignore_eos:
        raise ConfigError("min_tokens and ignore_eos cannot hold back the end of an answer that follows "
                          "a grammar (its end is the grammar's)",
                          "min_tokens" if params.min_tokens else "ignore_eos")
    if params.allowed_token_ids is not None:
        raise ConfigError("allowed_token_ids cannot be used with a grammar: the grammar chooses the tokens "
                          "an answer may take (a JSON schema, a regex, choices or a grammar, not both)",
                          "allowed_token_ids")


def check_allowed(params: SamplingParams, end_ids: set[int]) -> None:
    """``allowed_token_ids`` must hold a token that is not held back from the first position (the
    end-of-sequence tokens with ``ignore_eos`` or before ``min_tokens``, ``stop_token_ids`` before
    ``min_tokens``): else no token could be chosen there. ``end_ids``: the target's end-of-sequence
    tokens."""
    if params.allowed_token_ids is None:
        return
    held = set(end_ids) if params.ignore_eos or params.min_tokens else set()
    held |= set(params.stop_token_ids) if params.min_tokens else set()
    if set(params.allowed_token_ids) <= held:
        said = "ignore_eos" if params.ignore_eos else "min_tokens"
        raise ConfigError(f"allowed_token_ids holds only end-of-sequence or stop tokens, which {said} holds "
                          "back, so no token could be chosen; allow another token or leave "
                          f"{said} out", "allowed_token_ids")


def _token_ids(ids) -> bool:
    return isinstance(ids, list) and all(_is_int(t) and t >= 0 for t in ids)


def checked_seed(seed) -> int | None:
    """A request's seed as sampling reads it: None and -1 (``NO_SEED``, as llama.cpp reads it) are no
    seed, so the answer draws its own; else an integer from 0 to 2**64 - 1, or a ``ConfigError``."""
    if seed is None or (_is_int(seed) and seed == NO_SEED):
        return None
    if not (_is_int(seed) and SEED_RANGE[0] <= seed < SEED_RANGE[1]):
        raise ConfigError(f"seed must be an integer from 0 to 2**64 - 1, or -1 for none, got {seed!r}",
                          "seed")
    return seed


def utf8_problem(text: str) -> int | None:
    """Where the text stops being valid Unicode (a lone surrogate: what undecodable command-line
    bytes become, and what JSON's ``"\\ud800"`` gives); None when it is valid."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return exc.start
    return None


def lone_surrogate(value) -> tuple[str, str, bool] | None:
    """The first string of a JSON-like value (the value itself, or in its lists and objects, keys
    included) that is not valid Unicode: its path (``messages[0].content``; "" for the value itself;
    a key's is its object's), the string, and whether it is a key. None when all are valid."""
    stack = [("", value)]
    while stack:
        path, item = stack.pop()
        if isinstance(item, str):
            if utf8_problem(item) is not None:
                return path, item, False
        elif isinstance(item, dict):
            if (key := next((k for k in item if utf8_problem(k) is not None), None)) is not None:
                return path, key, True
            stack.extend((f"{path}.{k}" if path else k, v) for k, v in reversed(item.items()))
        elif isinstance(item, list):
            stack.extend((f"{path}[{i}]", v) for i, v in reversed(list(enumerate(item))))
    return None


def json_depth(value) -> int:
    """How deep objects and arrays nest in ``value`` (a scalar: 0, ``{}``: 1), found without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict | list):
            deepest = max(deepest, level)
            stack.extend((inner, level + 1) for inner in (item.values() if isinstance(item, dict) else item))
    return deepest


def check_text(text: str, what: str, field: str | None = None) -> None:
    """Text must be valid Unicode."""
    if (at := utf8_problem(text)) is not None:
        raise ConfigError(f"{what} is not valid UTF-8 text (character {at}); pass UTF-8", field)


ROLES = ("system", "user", "assistant", "tool")  # a chat message's roles


def check_callbacks(on_text=None, stop=None) -> None:
    """``on_text``: None or a callable taking each piece of text; ``stop``: None or a
    ``threading.Event``."""
    import threading

    if on_text is not None and not callable(on_text):
        raise ConfigError(f"on_text must be a callable that takes each piece of text, got "
                          f"{type(on_text).__name__}", "on_text")
    if stop is not None and not isinstance(stop, threading.Event):
        raise ConfigError(f"stop must be a threading.Event (set it to end the generation), got "
                          f"{type(stop).__name__}", "stop")


def check_prompt(prompt: str | list[dict]) -> None:
    """A non-empty text, or a non-empty list of ``{"role", "content"}`` messages, all valid UTF-8; the
    last may be an assistant's with ``"prefix": True``, which the answer continues."""
    if isinstance(prompt, str):
        if not prompt:
            raise ConfigError("the prompt is empty; pass some text")
        check_text(prompt, "the prompt")
        return
    if not isinstance(prompt, list):
        raise ConfigError(f"the prompt must be a string, or chat messages as a list of {{'role': ..., "
                          f"'content': ...}}, got {type(prompt).__name__} (token ids are the server's, "
                          "not the library's)")
    if not prompt or not all(isinstance(m, dict) for m in prompt):
        raise ConfigError("chat messages must be a non-empty list of {'role': ..., 'content': ...}")
    for i, m in enumerate(prompt):
        if m.get("role") not in ROLES:
            raise ConfigError(f"message {i}'s role must be one of {', '.join(ROLES)}, "
                              f"got {m.get('role')!r}")
        if not isinstance(content := m.get("content"), str):
            raise ConfigError(f"message {i}'s content must be a string, got {type(content).__name__} "
                              "(join text parts into one; an assistant message that only calls tools: '')")
        check_text(content, f"message {i}'s content")
        if m.get("prefix", False) is not False and (m.get("prefix") is not True or i != len(prompt) - 1
                                                    or m["role"] != "assistant" or not content):
            raise ConfigError(f"message {i}'s prefix: only the last message, an assistant's with some "
                              "content, may be marked prefix=True (the answer continues it)")
