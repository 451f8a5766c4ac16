"""OpenAI's presence and frequency penalties and logit bias, vLLM's repetition penalty and
``allowed_token_ids``, and the end-of-sequence tokens held back (``ignore_eos``, or before
``min_tokens`` tokens, as vLLM's stop tokens are) in a generation's rounds.

A verify row's logits are penalized by the tokens generated before it: the committed ones, then the
proposed ones on its own path (a chain's earlier tokens, a trie node's ancestors), and its EOS
tokens go to -inf where its generated position is below ``min_tokens``. So each row is shaped
exactly as the target alone shapes the row at that position, and the choice stays the target's own
(``sampling.penalized``). The draft proposes unpenalized; that costs acceptance only. Logprobs are
those of the penalized logits, the distribution each token was chosen from.
"""

from __future__ import annotations

import math
from collections import Counter

import torch

from anyspec.algorithms import tree
from anyspec.algorithms.sampling import penalized
from anyspec.config import SamplingParams, check_allowed
from anyspec.engine.proposers import Proposal
from anyspec.errors import ConfigError


class Penalties:
    def __init__(self, params: SamplingParams, eos_ids: set[int]):
        self.params = params
        # the tokens held back, and the generated position up to which: EOS, then vLLM's stop tokens
        self.holds = [(torch.tensor(sorted(eos_ids), dtype=torch.long),
                       math.inf if params.ignore_eos else params.min_tokens),
                      (torch.tensor(sorted(params.stop_token_ids), dtype=torch.long), params.min_tokens)]
        self.counts: Counter[int] = Counter()  # the tokens generated so far
        self.seen: set[int] = set()  # the prompt's and the generated tokens (the repetition penalty's)
        self.written = 0

    @staticmethod
    def start(params: SamplingParams, vocab_size: int, eos_ids: set[int]) -> Penalties | None:
        """A generation's penalties; None where ``params`` ask for none."""
        for name, ids in (("logit_bias", params.logit_bias), ("stop_token_ids", params.stop_token_ids),
                          ("allowed_token_ids", params.allowed_token_ids or [])):
            if too_large := [t for t in ids if t >= vocab_size]:
                raise ConfigError(f"{name} names token {too_large[0]}, beyond the target's {vocab_size} "
                                  "tokens", name)
        check_allowed(params, eos_ids)
        if not (params.presence_penalty or params.frequency_penalty or params.logit_bias
                or params.repetition_penalty != 1.0 or params.min_tokens or params.ignore_eos
                or params.allowed_token_ids is not None):
            return None
        return Penalties(params, eos_ids)

    def prompted(self, ids: list[int]) -> None:
        """The prompt's tokens, which the repetition penalty counts as seen."""
        self.seen.update(ids)

    def commit(self, ids: list[int]) -> None:
        self.counts.update(ids)
        self.seen.update(ids)
        self.written += len(ids)

    def rows(self, proposal: Proposal):
        """The function that shapes the logits of a verify of ``proposal`` (rows: the pending token's,
        then one per proposed token, as ``loop.verify`` computes them)."""
        p = self.params
        before = paths(proposal)
        counts = [self.counts + Counter(path) for path in before]
        held = [(torch.tensor([r for r, path in enumerate(before) if self.written + len(path) < until]), ids)
                for ids, until in self.holds if len(ids)]
        repeated = None
        if p.repetition_penalty != 1.0:
            repeated = [torch.tensor(sorted(self.seen.union(path)), dtype=torch.long) for path in before]

        def shape(logits):
            out = penalized(logits, counts, p.presence_penalty, p.frequency_penalty, p.logit_bias, repeated,
                            p.repetition_penalty)
            for rows, ids in held:
                if len(rows):
                    out[rows[:, None], ids] = -math.inf
            if p.allowed_token_ids is not None:
                kept = out[:, p.allowed_token_ids]
                out.fill_(-math.inf)[:, p.allowed_token_ids] = kept
            return out
        return shape


def paths(proposal: Proposal) -> list[list[int]]:
    """For each verify row, the proposed tokens before the position it chooses: none for the pending
    token's row, then a chain's tokens up to each, or each trie node's path from the root."""
    if not proposal.trie:
        return [proposal.ids[:i] for i in range(len(proposal.ids) + 1)]
    return [[]] + tree.paths(*proposal.trie)
