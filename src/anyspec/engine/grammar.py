"""Constrained generation: a JSON schema, a tool-call format or vLLM's guided decoding (a regular
expression, a choice of strings, a Lark grammar), compiled once against the target's tokenizer
(llguidance), and each generation's place in it, which masks the target's logits.

``Grammars(tokenizer, vocab_size, end_ids)`` compiles and caches; ``Grammar.start(stats)`` gives a
generation its ``Constraint``. In a verify, every row of the target's logits gets the mask of its
own grammar state: a chain's row i follows the first i proposed tokens, a tree's row follows its
path. The committed tokens then advance the state. A proposal is cut at its first token the grammar
rejects (the target, masked, could never choose it), and where the grammar forces the next tokens
they are proposed without the draft. The answer is the masked target's own, token for token.
"""

from __future__ import annotations

import json
import re
import threading
import time
import warnings
from collections import OrderedDict

import numpy as np
import torch

from anyspec.algorithms import tree
from anyspec.config import json_depth, lone_surrogate, utf8_problem
from anyspec.engine.proposers import Proposal
from anyspec.errors import ConfigError

CACHED = 64  # compiled grammars kept, the least recently used dropped first
MAX_SCHEMA_BYTES = 65_536
TRIAL_STEPS = 4  # tokens a new grammar is followed for, to find the limits it reaches early
JSON_DEPTH = 124  # objects and arrays in objects and arrays: llguidance's JSON reader takes 128 levels,
#                  the grammar it writes around a schema holds it 4 deep
LIMITS = dict(initial_lexer_fuel=1_000_000, step_lexer_fuel=200_000, max_grammar_size=200_000,
              max_lexer_states=50_000,  # what bounds compile and mask time (llguidance's fuel: ~50k/ms)
              verbose_errors=False)  # an error is its reason, without the parser's state and grammar
# llguidance compiles a chain of rules (r0: r1, r1: r2, ...) recursively, one native frame or more
# per rule and per parenthesis around a reference: a grammar of MAX_SCHEMA_BYTES needs ~55 MiB of
# stack at its deepest (rules nested in 28 parentheses each), where a thread's default 8 MiB
# overflows at ~2,600 plain rules and the process dies. Its masks and steps do not recurse so.
NATIVE_STACK = 256 << 20
TOOL_OPEN, TOOL_CLOSE = "<tool_call>", "</tool_call>"
STYLE = dict(whitespace_flexible=False, item_separator=", ", key_separator=": ")  # as json.dumps writes
GUIDES = {"json": "JSON Schema", "regex": "regular expression", "choice": "list of choices",
          "grammar": "Lark or GBNF grammar"}  # vLLM's guided decoding, and what each is


class GrammarError(ConfigError):
    """A schema or tool list that cannot be compiled; ``field`` names the request field."""


def _llguidance():
    try:
        with warnings.catch_warnings():  # its torch helpers use torch.jit.script_method, deprecated
            warnings.simplefilter("ignore", DeprecationWarning)
            import llguidance
            import llguidance.hf
            import llguidance.torch
    except ImportError:
        raise ConfigError("JSON mode, JSON schemas and tool calls need llguidance: "
                          "pip install 'anyspec[server]'") from None
    return llguidance


_stack_size = threading.Lock()


def native(call, *args, **kwargs):
    """``call(*args, **kwargs)`` on a thread of its own with a NATIVE_STACK stack, its result or
    exception returned or raised here: every llguidance call that compiles or checks a grammar."""
    out = {}

    def run():
        try:
            out["value"] = call(*args, **kwargs)
        except BaseException as exc:  # noqa: BLE001 (raised again in the caller's thread)
            out["error"] = exc

    with _stack_size:
        default = threading.stack_size(NATIVE_STACK)
        try:
            thread = threading.Thread(target=run, name="anyspec-grammar", daemon=True)
            thread.start()
        finally:
            threading.stack_size(default)
    thread.join()
    if "error" in out:
        raise out["error"]
    return out["value"]


class Grammars:
    """Grammars compiled against one tokenizer, cached by their text."""

    def __init__(self, tokenizer, vocab_size: int, end_ids: set[int], limits: dict | None = None):
        ll = _llguidance()
        self.tokenizer, self.vocab_size, self.end_ids = tokenizer, vocab_size, end_ids
        self.lltok = ll.hf.from_tokenizer(tokenizer, n_vocab=vocab_size, eos_token=sorted(end_ids))
        self.limits = ll.LLParserLimits(**LIMITS | (limits or {}))
        self.cache: OrderedDict[str, Grammar] = OrderedDict()

    def json(self, schema: dict | bool | None, field: str) -> Grammar:
        """Any JSON object (``schema=None``, JSON mode) or a value matching ``schema``."""
        return self._compile(schema_grammar(schema, field), field)

    def guide(self, kind: str, value, field: str) -> Grammar:
        """vLLM's guided decoding of ``kind`` (``guide_grammar``)."""
        return self._compile(guide_grammar(kind, value, field), field, GUIDES[kind])

    def tool_calls(self, functions: list[dict], one: bool, field: str, text: bool = False) -> Grammar:
        """One ``<tool_call>`` block (``one``) or several, each ``{"name": ..., "arguments": ...}`` of
        one of ``functions`` (OpenAI's ``{"name", "parameters"}``), as Qwen2.5's template asks.
        ``text``: any text first, the calls optional (``tool_choice: "auto"``): free until the
        model opens a call, which is then held to the functions' schemas. A call opens and closes
        with the template's tokens or with the same text in pieces (``<``, ``tool``, ``_call``,
        ``>``), which Qwen2.5-Coder writes as often; either way it is read as a call."""
        # each function's parameters are a schema of their own (its "$ref"s point into it), inside
        # the call's object as json.dumps writes it (STYLE)
        heads = [json.dumps({"name": f["name"], "arguments": 0})[:-2] for f in functions]  # to "arguments":
        calls = [f'{json.dumps(head)} args{i} "}}"' for i, head in enumerate(heads)]
        params = [json.dumps((f.get("parameters") or {"type": "object"}) | {"x-guidance": STYLE})
                  for f in functions]
        if sum(map(len, params)) > MAX_SCHEMA_BYTES:
            raise GrammarError(f"The function parameters in '{field}' are {sum(map(len, params))} bytes as "
                               f"JSON; at most {MAX_SCHEMA_BYTES} are compiled.", field)
        body = "body: " + " | ".join(calls) + "\n" + "".join(f"args{i}: %json {schema}\n"
                                                              for i, schema in enumerate(params))
        marks = [self.tokenizer.convert_tokens_to_ids(t) for t in (TOOL_OPEN, TOOL_CLOSE)]
        lark = _calls_lark(marks, one, text) + body
        return self._compile(native(_llguidance().LLMatcher.grammar_from_lark, lark), field)

    def _compile(self, text: str, field: str, what: str = GUIDES["json"]) -> Grammar:
        if text in self.cache:
            self.cache.move_to_end(text)
            cached = self.cache[text]  # compiled once; its errors name the field asked for now
            return cached if cached.field == field else Grammar(cached.matcher, self.vocab_size, field)
        matcher, error = native(self._matcher, text)
        if error:
            raise GrammarError(f"'{field}' cannot be used: {_reason(error, what)}", field)
        grammar = Grammar(matcher, self.vocab_size, field)
        self.cache[text] = grammar
        while len(self.cache) > CACHED:
            self.cache.popitem(last=False)
        return grammar

    def _matcher(self, text: str):
        """The matcher of ``text`` and its error, if any: in its first mask, which builds the lexer's
        start (its limits count too), or in a few first steps, where a lexeme too complex for the
        lexer (``(a{1000}){1000}``) runs out of fuel: each step takes the first token the grammar
        forces, else the first it allows."""
        matcher = _llguidance().LLMatcher(self.lltok, text, log_level=0, limits=self.limits)
        if matcher.is_error():
            return matcher, matcher.get_error()
        mask, trial = matcher.compute_bitmask(), matcher.deep_copy()
        for _ in range(TRIAL_STEPS):
            token = next(iter(trial.compute_ff_tokens()), None)
            if token is None:
                bits = np.unpackbits(np.frombuffer(mask, dtype=np.uint8), bitorder="little")
                token = next((int(t) for t in np.flatnonzero(bits) if t not in self.end_ids), None)
            if token is None or not trial.consume_token(token):
                break
            mask = trial.compute_bitmask()
        return matcher, matcher.get_error() or trial.get_error()


def _calls_lark(marks: list[int], one: bool, text: bool) -> str:
    """The calls around their ``body`` rule: ``marks`` are the ids of TOOL_OPEN and TOOL_CLOSE, each
    also allowed as its text. A lexeme runs on as far as it can, so free text (``text``) could not
    stop before a TOOL_OPEN it spells: it is PLAIN, text without one, or OPENED, text up to its first
    one, the call's opening included."""
    tags = zip(marks, (TOOL_OPEN, TOOL_CLOSE), strict=True)
    opening, closing = (f"<[{mark}]> | {json.dumps(tag)}" for mark, tag in tags)
    # Qwen2.5 ends its last call with a newline before the end of its turn: without the "\n"?
    # that newline could only open another call
    calls = 'call "\\n"?' if one else 'call ("\\n" open call)* "\\n"?'
    start = (f"start: PLAIN | PLAIN? <[{marks[0]}]> calls | OPENED calls\n"
             f"PLAIN: /(?s:.*)/ & ~/(?s:.*{TOOL_OPEN}.*)/\n"
             f"OPENED: /(?s:.*{TOOL_OPEN})/ & ~/(?s:.*{TOOL_OPEN}.+)/\n"
             if text else "start: open calls\n")
    return (start + f"calls: {calls}\nopen: {opening}\nclose: {closing}\n"
            'call: "\\n" body "\\n" close\n')


def check_unicode(value, field: str) -> None:
    """Every string in ``value`` (and in its lists and objects, keys too) valid Unicode: JSON's
    ``"\\ud800"`` and undecodable command-line bytes give lone surrogates, which no grammar holds."""
    if (found := lone_surrogate(value)) is not None:
        text = found[1]
        raise GrammarError(f"'{field}' is not valid Unicode text (a lone surrogate at character "
                           f"{utf8_problem(text)} of {text[:40]!r}).", field)


def schema_grammar(schema: dict | bool | None, field: str) -> str:
    """The llguidance grammar of a JSON schema (None: any JSON object), written as ``json.dumps``
    writes it: ``{"a": 1, "b": [2, 3]}``. Models write JSON so; a draft more often agrees with the
    target under it than under compact JSON, and neither can run on in whitespace."""
    if schema is None:
        schema = {"type": "object"}
    if schema is False:
        raise GrammarError(f"'{field}' is the schema false, which no answer matches.", field)
    if not isinstance(schema, dict | bool):
        raise GrammarError(f"'{field}' must be a JSON Schema object.", field)
    check_unicode(schema, field)
    if (depth := json_depth(schema)) > JSON_DEPTH:
        raise GrammarError(f"'{field}' nests objects and arrays {depth} deep; at most {JSON_DEPTH} are "
                           "compiled.", field)
    text = json.dumps({} if schema is True else schema)  # true: any JSON value
    if len(text) > MAX_SCHEMA_BYTES:
        raise GrammarError(f"'{field}' is {len(text)} bytes as JSON; at most {MAX_SCHEMA_BYTES} are "
                           "compiled.", field)
    try:
        return native(_llguidance().LLMatcher.grammar_from_json_schema, text, defaults=STYLE)
    except ValueError as exc:
        raise GrammarError(f"'{field}' cannot be used: it is not a valid JSON Schema ({_one_line(str(exc))})",
                           field) from None


def guide_grammar(kind: str, value, field: str) -> str:
    """The llguidance grammar of vLLM's guided decoding: ``json`` (a JSON Schema, or its text),
    ``regex`` (the whole answer matches it), ``choice`` (the answer is one of these strings) or
    ``grammar`` (llguidance's Lark, or the GBNF of llama.cpp and of vLLM's xgrammar)."""
    ll = _llguidance()
    if kind == "json":
        if isinstance(value, str):
            check_unicode(value, field)  # the text; its parsed schema's strings are checked below
            try:
                value = json.loads(value)
            except json.JSONDecodeError as exc:
                raise GrammarError(f"'{field}' is not valid JSON: {exc}", field) from None
        return schema_grammar(value, field)
    check_unicode(value, field)
    if kind == "choice":
        if not isinstance(value, list) or not value or not all(isinstance(c, str) and c for c in value):
            raise GrammarError(f"'{field}' must be a non-empty array of non-empty strings.", field)
        text = "start: " + " | ".join(json.dumps(c, ensure_ascii=False) for c in value)
    elif not isinstance(value, str) or not value:
        raise GrammarError(f"'{field}' must be a non-empty string.", field)
    elif kind == "regex":
        text = native(ll.LLMatcher.grammar_from_regex, value)
    else:
        from llguidance.gbnf_to_lark import any_to_lark
        try:
            lark = native(any_to_lark, value)
        except Exception as exc:  # noqa: BLE001 (its converter raises bare Exceptions too)
            reason = " ".join(str(exc).split())
            raise GrammarError(f"'{field}' cannot be used: it is not a valid GBNF grammar ({reason})",
                               field) from None
        text = native(ll.LLMatcher.grammar_from_lark, lark)
    if len(text) > MAX_SCHEMA_BYTES:
        raise GrammarError(f"'{field}' is {len(text)} bytes as a grammar; at most {MAX_SCHEMA_BYTES} are "
                           "compiled.", field)
    return text


def check_grammar(text: str, field: str, what: str = GUIDES["json"]) -> None:
    """A grammar's problems, found before any tokenizer is loaded (``Grammars`` finds the rest)."""
    ll = _llguidance()
    error = native(ll.LLMatcher.validate_grammar, text, None, limits=ll.LLParserLimits(**LIMITS))
    if error and not error.startswith("WARNING"):
        raise GrammarError(f"'{field}' cannot be used: {_reason(error, what)}", field)


def _one_line(error: str) -> str:
    """llguidance's error as one line: its first and its ``error:`` lines, without any dump of the
    parser's state or grammar that follows."""
    error = error.split("<state>")[0].split("<grammar>")[0]
    lines = [line.strip() for line in error.strip().splitlines()]
    return " ".join(lines[:1] + [line for line in lines[1:] if line.startswith("error:")])


def _too_complex(error: str) -> bool:
    return re.search(r"fuel|limit|\btoo\b|max is", error, re.IGNORECASE) is not None


def _reason(error: str, what: str) -> str:
    error = _one_line(error)
    if what == GUIDES["json"]:  # a place in the grammar made from the schema: nothing a client wrote
        error = re.sub(r"^at \d+\(\d+\): ", "", error)
    if "Unimplemented" in error or "Unknown format" in error:
        return f"an unsupported {what} feature ({error})"
    if _too_complex(error):
        return f"it is too large or too complex to compile in bounded time ({error})"
    return f"it is not a valid {what} ({error})"


class Grammar:
    """A compiled grammar: its matcher at the start, copied for each generation; ``field``: what
    it was asked for as (the server's request field), which its errors name."""

    def __init__(self, matcher, vocab_size: int, field: str | None = None):
        self.matcher, self.vocab_size, self.field = matcher, vocab_size, field

    def start(self, stats) -> Constraint:
        """A generation's state; its time goes to ``stats.grammar_seconds``."""
        return Constraint(self.matcher.deep_copy(), self.vocab_size, stats, self.field)


class Free:
    """No grammar: every proposal verified as it is, without masks."""

    def forced(self, limit: int) -> list[int]:
        return []

    def rows(self, proposal: Proposal, more: int = 0) -> tuple[Proposal, None]:
        return proposal, None

    def advance(self, committed: list[int]) -> None:
        pass


class Constraint(Free):
    """One generation's state in its grammar: after the tokens committed so far."""

    def __init__(self, matcher, vocab_size: int, stats, field: str | None = None):
        self.matcher, self.vocab_size, self.stats, self.field = matcher, vocab_size, stats, field

    def forced(self, limit: int) -> list[int]:
        """The next tokens the grammar allows alone (up to ``limit``)."""
        if limit <= 0:
            return []
        t0 = time.perf_counter()
        forced = self.matcher.compute_ff_tokens()[:limit]
        self.stats.grammar_seconds += time.perf_counter() - t0
        return forced

    def rows(self, proposal: Proposal, more: int = 0) -> tuple[Proposal, torch.Tensor]:
        """The proposal cut at the first token the grammar rejects (a chain; a trie stays whole), then
        up to ``more`` tokens the grammar forces after its chain (accepted whenever the chain is),
        and the bitmask of every row a verify of it computes, in the verify's order."""
        t0 = time.perf_counter()
        valid = self.matcher.validate_tokens(proposal.ids)
        ids = proposal.ids if proposal.trie else proposal.ids[:valid]
        tail = self._forced_after(ids, more) if valid == len(ids) else []
        proposal = proposal._replace(ids=ids + tail, tail=proposal.tail + len(tail))
        if tail and proposal.trie:
            tokens, parents = proposal.trie
            ups = [len(ids) - 1] + list(range(len(tokens), len(tokens) + len(tail) - 1))  # the chain's
            proposal = proposal._replace(trie=(tokens + tail, parents + ups))  # nodes come first
        masks = self._tree(*proposal.trie) if proposal.trie else self._walk(proposal.ids)
        self.stats.grammar_seconds += time.perf_counter() - t0
        if self.matcher.is_error():
            raise self._failed()
        return proposal, masks

    def _failed(self) -> ConfigError:
        """The grammar's error mid-answer: its limits reached (a lexeme or a parse too complex to
        follow in bounded time), which the request asked for."""
        said = f"The grammar of '{self.field}'" if self.field else "The answer's grammar"
        return ConfigError(f"{said} failed mid-answer: {_one_line(self.matcher.get_error())}", self.field)

    # The proposed tokens are read on copies of the state, never on the state itself with a
    # rollback after: a matcher that consumed tokens and rolled them back can give a later mask that
    # allows a token its parser then refuses (a JSON key closed by '",'), one the target alone's
    # mask, never rolled back, rejects.

    def _forced_after(self, ids: list[int], limit: int) -> list[int]:
        if limit <= 0:
            return []
        after = self.matcher.deep_copy()
        after.consume_tokens(ids)
        return after.compute_ff_tokens()[:limit]

    def _walk(self, ids: list[int]) -> torch.Tensor:
        ll = _llguidance()
        masks = ll.torch.allocate_token_bitmask(len(ids) + 1, self.vocab_size)
        walker = self.matcher.deep_copy()
        for i in range(len(ids) + 1):
            ll.torch.fill_next_token_bitmask(walker, masks, i)
            if i < len(ids):
                walker.consume_token(ids[i])
        return masks

    def _tree(self, tokens: list[int], parents: list[int]) -> torch.Tensor:
        """Row 0 (the pending token's) and one row per trie node, each after its path; a node on a
        path the grammar rejects keeps a mask that allows all (the target never reaches it)."""
        ll = _llguidance()
        masks = ll.torch.allocate_token_bitmask(len(tokens) + 1, self.vocab_size)
        ll.torch.fill_next_token_bitmask(self.matcher, masks, 0)
        for j, path in enumerate(tree.paths(tokens, parents)):
            if self.matcher.validate_tokens(path) == len(path):
                walker = self.matcher.deep_copy()
                walker.consume_tokens(path)
                ll.torch.fill_next_token_bitmask(walker, masks, j + 1)
        return masks

    def advance(self, committed: list[int]) -> None:
        t0 = time.perf_counter()
        if committed and not self.matcher.consume_tokens(committed):
            if _too_complex(self.matcher.get_error()):
                raise self._failed()
            raise RuntimeError(f"a committed token broke the grammar: {_one_line(self.matcher.get_error())}")
        self.stats.grammar_seconds += time.perf_counter() - t0


def masked(logits: torch.Tensor, masks: torch.Tensor | None) -> torch.Tensor:
    """``logits`` with every token its row's mask rejects at -inf (a copy; ``masks=None``: as they are).

    A mask row is llguidance's bitmask: token t is allowed when bit t % 32 of int32 word t // 32 is
    set, which in the words' little-endian bytes is bit t % 8 of byte t // 8. It is unpacked with numpy rather
    than llguidance's ``apply_token_bitmask_inplace``, whose ``torch.compile`` made each process's
    first constrained request seconds slower; tokens past the mask's width are rejected too."""
    if masks is None:
        return logits
    vocab = logits.shape[-1]
    words = masks[:len(logits)].numpy().astype("<i4", copy=False)  # little-endian words, on any machine
    bits = np.unpackbits(words.view(np.uint8), axis=1, bitorder="little")
    allowed = np.zeros((len(logits), vocab), dtype=bool)
    width = min(vocab, bits.shape[1])
    allowed[:, :width] = bits[:, :width]
    return logits.masked_fill(torch.from_numpy(~allowed), float("-inf"))
