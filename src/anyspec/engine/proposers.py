"""The two ways a draft with another vocabulary proposes target tokens, behind one small protocol.

* ``TLI`` (``algorithms/tli.py``): the draft chooses only among the tokens both vocabularies share,
  and each draft token is its target twin.
* ``SLEM`` (``algorithms/slem.py``): the draft writes freely; its text is re-encoded with the target
  tokenizer.

Either way verification is exact match: against the target's argmax when greedy, and when sampling
against the target's Gumbel-max choice at each position (``engine/sampler.py``), which the draft's
own choice reads the same noise for.

``propose`` runs a round's draft for either: the draft catches up on its context, then writes up to
k tokens, one cached forward each, and stops early after a token it doubts.
"""

from __future__ import annotations

from typing import NamedTuple, Protocol

import torch

from anyspec.algorithms import slem, tree
from anyspec.algorithms.adaptive_k import confidence, expected_tokens
from anyspec.algorithms.sampling import argmax
from anyspec.algorithms.tli import constrain
from anyspec.config import (
    DRAFT_CONFIDENCE,
    DRAFT_CONFIDENCE_AVX2,
    TREE_BRANCHES,
    SamplingParams,
    SpeculativeConfig,
)
from anyspec.engine.batch import Forward, Steps, chunked
from anyspec.engine.bridge import Bridge
from anyspec.engine.context import ANCHOR, DraftContext
from anyspec.engine.model import RestrictedHead
from anyspec.engine.prefix import common_prefix
from anyspec.engine.sampler import Sampler


class Proposal(NamedTuple):
    ids: list[int]  # target ids, to verify
    drafted: int = 0  # draft tokens written
    catch_up: int = 0  # context tokens the draft read before writing
    end: str = ""  # why the draft stopped writing: "k", "confidence" or "eos" (a token without text)
    source: str = "draft"  # or "ngram": copied from the context (verified as exact match)
    trie: tuple = ()  # (tokens, parents) of ids and the branches beside them (algorithms/tree.py); ()
    #                   for the chain alone
    found: tuple = ()  # a continuation found in the context (engine/lookup.py): ids, or a branch of the trie
    lead: int = 0  # tokens the grammar forces before the draft's (engine/grammar.py), first in ids
    tail: int = 0  # and after them, last in ids: neither counts as the draft's

    def drafted_part(self, accepted: int) -> tuple[int, int]:
        """Of ``accepted`` proposed tokens on the chain: those of the draft's own (not the grammar's
        ``lead`` or ``tail``), and how many of its own the chain held."""
        own = len(self.ids) - self.lead - self.tail
        return min(max(accepted - self.lead, 0), own), own


def after_forced(forced: list[int], proposal: Proposal) -> Proposal:
    """``proposal``, written by a draft that read the grammar's ``forced`` tokens first, behind them."""
    m = len(forced)
    trie = ()
    if proposal.trie:
        tokens, parents = proposal.trie
        trie = (forced + tokens, list(range(-1, m - 1)) + [p + m if p >= 0 else m - 1 for p in parents])
    return proposal._replace(ids=forced + proposal.ids, trie=trie, lead=m)


class Proposer(Protocol):
    algorithm: str
    mask: torch.Tensor | None  # the draft tokens it may write (None: all)
    head: object  # the draft's LM head rows its forwards compute (None: all)

    def ends_text(self, draft_id: int) -> bool: ...

    def to_target(self, ctx: DraftContext, draft_ids: list[int], limit: int) -> list[int]: ...


class TLI:
    algorithm = "tli"

    def __init__(self, bridge: Bridge, draft=None):
        self.bridge = bridge
        self.mask = bridge.intersection_mask
        self._draft, self._head = draft, None

    @property
    def head(self):
        """The draft's LM head on the intersection alone, where the draft model can restrict it
        (``model.RestrictedHead``): the logits TLI reads are the same bits, at a fraction of the
        head's cost. Built on first use."""
        if self._head is None and self.mask is not None and isinstance(self._draft, RestrictedHead):
            self._head = self._draft.restricted_head(self.mask.nonzero().flatten())
        return self._head

    def ends_text(self, draft_id: int) -> bool:
        return False

    def to_target(self, ctx, draft_ids, limit):
        return [self.bridge.draft_to_target[d] for d in draft_ids]



class SLEM:
    algorithm = "slem"
    mask = head = None  # it reads the draft's whole vocabulary

    def __init__(self, bridge: Bridge, target_tokenizer):
        self.bridge = bridge
        self.target_tokenizer = target_tokenizer
        self.target_anchor_ids = target_tokenizer.encode(ANCHOR, add_special_tokens=False)

    def ends_text(self, draft_id: int) -> bool:
        """EOS or another special token ends the draft's text (``slem.draft_bytes``)."""
        return not self.bridge.draft_bytes[draft_id]

    def to_target(self, ctx, draft_ids, limit):
        """At most ``limit`` target ids that spell the draft tokens' text exactly. Nothing when the
        committed text ends inside a character: the draft reads only up to that character, so its
        text does not continue the target's bytes."""
        if ctx.policy == "retokenize" and len(ctx.text) > (ctx.ends[-1] if ctx.ends else 0):
            return []
        return slem.retokenize(slem.draft_bytes(draft_ids, self.bridge.draft_bytes), self.target_tokenizer,
                               self.bridge.target_bytes, self.target_anchor_ids, limit)


def tuned_confidence(target) -> float:
    """The default confidence stop for ``target`` (docs/benchmarks.md, "The defaults"): where it runs on
    anyspec's kernels below their AVX-512 level, a verified row costs 10-12 ms of compute on two
    cores, and a round drafting past a token the draft gives less than 0.7 loses more than it gains."""
    return DRAFT_CONFIDENCE_AVX2 if costly_rows(target) else DRAFT_CONFIDENCE


def tuned_tree(target) -> int:
    """The default number of branches for ``target``: ``TREE_BRANCHES`` where its forward takes a tree
    of rows, but none where a verified row costs 10-12 ms (below the kernels' AVX-512 level), where
    the branches that pay for their rows win about as much as they cost (docs/benchmarks.md)."""
    return TREE_BRANCHES if target.tree_attention and not costly_rows(target) else 0


def costly_rows(target) -> bool:
    """Whether ``target`` runs on anyspec's kernels below their AVX-512 level."""
    return target.kernel_level is not None and target.kernel_level < 2


def algorithm_for(config: SpeculativeConfig, params: SamplingParams) -> str:
    """The algorithm a request runs. ``auto``: SLEM (the draft may write tokens outside the
    intersection, and its text still proposes the target's tokens), but TLI with the token-map
    context, which SLEM cannot use."""
    if config.algorithm != "auto":
        return config.algorithm
    return "slem" if config.draft_context == "retokenize" else "tli"


def propose(proposer: Proposer, draft, ctx: DraftContext, k: int, sampler: Sampler | None, position: int,
            config: SpeculativeConfig, worth=None, found: list[int] = (), found_rate: float = 0.0) -> Steps:
    """The round's ``Proposal``; ``draft`` is the model or sequence the draft runs on. Its tokens are
    the draft's argmax, or with a ``sampler`` its choice coupled to the target's noise, the first at
    generated ``position``. With ``worth(gain, rows, added)`` (a target that takes a tree), up to
    ``config.tree`` branches at the draft's next choices where ``worth`` says they pay, and the
    continuation ``found`` in the context (each of its tokens accepted with ``found_rate``) beside
    them where it pays too; ``found`` alone where the draft's text gives no target token."""
    keep = min(common_prefix(draft.cached_ids, ctx.ids), len(ctx.ids) - 1)
    draft.crop(keep)
    logits = (yield from chunked(draft, ctx.ids[keep:], 1, proposer.head))[-1]
    if config.draft_sample_method == "greedy":
        sampler = None
    stop_below = config.draft_confidence
    draft_ids, end, p_chain, others = [], "k", [], []
    for i in range(k):
        if sampler is None:
            d, q = argmax(constrain(logits, proposer.mask))[0], None
        else:
            d, q = sampler.draft_choice(logits, position + i, proposer.mask)
        draft_ids.append(d)
        sure = None
        if worth is not None:
            sure, alts = tree.next_choices(logits, d, proposer.mask, config.tree)
            p_chain.append(sure)
            others.append(alts)
        if proposer.ends_text(d):
            end = "eos"
            break
        if q is not None or sure is None:
            sure = confidence(logits, d, q, proposer.mask)
        if stop_below and i + 1 < k and sure < stop_below:
            end = "confidence"
            break  # the draft doubts this token: the next ones are unlikely to be accepted
        if i + 1 < k:
            logits = (yield Forward(draft, [d], None, proposer.head))[-1]
    ids = proposer.to_target(ctx, draft_ids, k)
    if not ids and found:
        return Proposal(list(found), len(draft_ids), len(ctx.ids) - keep, end, "ngram", found=tuple(found))
    branches, beside = [], []
    if worth is not None and ids:
        branches = choose_branches(proposer, ctx, draft_ids, ids, p_chain, others, k, config.tree, worth)
        if found and beside_pays([ids, *branches], list(found), found_rate, worth):
            beside = [list(found)]
    return Proposal(ids, len(draft_ids), len(ctx.ids) - keep, end,
                    trie=tree.trie([ids, *branches, *beside]) if branches or beside else (),
                    found=tuple(found) if beside else ())


def beside_pays(branches: list[list[int]], found: list[int], rate: float, worth) -> bool:
    """Whether the continuation ``found`` pays for the nodes it adds to the trie of ``branches``: its
    tokens past the longest prefix it shares with one of them, each accepted with ``rate``."""
    shared = max(common_prefix(b, found) for b in branches)
    added = tree.new_nodes(branches, found)
    rows = 1 + len(tree.trie(branches)[0])
    gain = expected_tokens(rate, len(found)) - expected_tokens(rate, shared)
    return added > 0 and worth(gain, rows, added)


def choose_branches(proposer: Proposer, ctx: DraftContext, draft_ids: list[int], ids: list[int],
                    p_chain: list[float], others: list[list[tuple[int, float]]], k: int, width: int,
                    worth) -> list[list[int]]:
    """At most ``width`` branches, the most promising first (``tree.gains``): at draft position i the
    draft's tokens before it and one of its other choices there, in target ids; each one only if it
    adds nodes to the trie and ``worth(gain, rows, added)`` says they pay."""
    out, rows = [], 1 + len(ids)
    gains = tree.gains(p_chain, [[p for _, p in alts] for alts in others])
    ranked = sorted(((g, i, j) for i, row in enumerate(gains) for j, g in enumerate(row)), reverse=True)
    for gain, i, j in ranked:
        if len(out) == width or not worth(gain, rows, 1):
            break  # the likeliest branch left does not pay even for one row
        branch = proposer.to_target(ctx, draft_ids[:i] + [others[i][j][0]], k)
        added = tree.new_nodes([ids, *out], branch)
        if added and worth(gain, rows, added):
            out.append(branch)
            rows += added
    return out


def round_end(proposal: Proposal, accepted: int, token: int, target_bytes: list[bytes]) -> str:
    """Why a round's accepted run ended, given the ``token`` the target added after ``accepted``
    proposed tokens: "rejected" (the target disagreed, or rejected when sampling), "boundary" (the
    texts agree but are cut into tokens differently: the target's token is a prefix of the rest of
    the proposed text, or extends all of it; or the draft wrote text that re-encodes to no target
    token), else why the draft stopped ("k", "confidence", "eos"), or "none" (nothing proposed)."""
    ids = proposal.ids
    if accepted < len(ids):
        rest, theirs = b"".join(target_bytes[t] for t in ids[accepted:]), target_bytes[token]
        agree = theirs and rest and (rest.startswith(theirs) or theirs.startswith(rest))
        return "boundary" if agree else "rejected"
    if not ids:
        if not proposal.drafted or proposal.end == "eos" and proposal.drafted == 1:
            return "eos" if proposal.drafted else "none"
        return "boundary"
    return proposal.end or "k"

