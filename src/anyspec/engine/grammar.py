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

import time
from collections import OrderedDict

import numpy as np
import torch

from anyspec.algorithms import tree
from anyspec.engine.grammar_text import (
    GUIDES,
    LIMITS,
    TOOL_CLOSE,
    TOOL_OPEN,
    GrammarError,
    guide_grammar,
    load_llguidance,
    native,
    one_line,
    reason,
    schema_grammar,
    too_complex,
    tool_calls_lark,
)
from anyspec.engine.proposers import Proposal
from anyspec.errors import ConfigError

CACHED = 64  # compiled grammars kept, the least recently used dropped first
TRIAL_STEPS = 4  # tokens a new grammar is followed for, to find the limits it reaches early


class Grammars:
    """Grammars compiled against one tokenizer, cached by their text."""

    def __init__(self, tokenizer, vocab_size: int, end_ids: set[int], limits: dict | None = None):
        ll = load_llguidance()
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
        marks = [self.tokenizer.convert_tokens_to_ids(t) for t in (TOOL_OPEN, TOOL_CLOSE)]
        return self._compile(tool_calls_lark(functions, marks, one, text, field), field)

    def _compile(self, text: str, field: str, what: str = GUIDES["json"]) -> Grammar:
        if text in self.cache:
            self.cache.move_to_end(text)
            cached = self.cache[text]  # compiled once; its errors name the field asked for now
            return cached if cached.field == field else Grammar(cached.matcher, self.vocab_size, field)
        matcher, error = native(self._matcher, text)
        if error:
            raise GrammarError(f"'{field}' cannot be used: {reason(error, what)}", field)
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
        matcher = load_llguidance().LLMatcher(self.lltok, text, log_level=0, limits=self.limits)
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
        return ConfigError(f"{said} failed mid-answer: {one_line(self.matcher.get_error())}", self.field)

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
        ll = load_llguidance()
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
        ll = load_llguidance()
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
            if too_complex(self.matcher.get_error()):
                raise self._failed()
            raise RuntimeError(f"a committed token broke the grammar: {one_line(self.matcher.get_error())}")
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
