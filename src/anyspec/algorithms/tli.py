"""Token-Level Intersection (TLI): lossless speculative decoding across two vocabularies.

The draft and the target have different vocabularies. Their *intersection* is the set of tokens
whose bytes are identical on both sides; ``draft_to_target`` maps each intersection token's draft
id to the target id with the same bytes (-1 elsewhere).

One round, for k draft tokens:

1. Propose: the draft's logits are *constrained* to the intersection (``constrain``: everything
   else -inf), and the draft picks its argmax, or for a sampled request its Gumbel-max choice
   with the target's noise on the shared tokens (``engine/sampler.py``). Each token is mapped to
   its target id.
2. The target scores [pending token, t1..tk] in ONE forward pass: k+1 rows of logits.
3. Verify by exact match (``verify_exact``): t_i is accepted while it is the target's own choice
   at its position, the argmax or the Gumbel-max choice with noise fixed by the seed and the
   position (``gumbel.py``); at the first mismatch, or after all k as the *bonus token*, the
   target's choice is committed. Every round commits between 1 and k+1 tokens, each exactly the
   token the target alone would commit there, so greedy answers are the target's and sampled ones
   are exact samples of its distribution, whatever the draft proposed.

Speculative sampling's min(1, p/q') acceptance with a residual draw (Leviathan et al. 2023) is
also lossless, but its committed tokens depend on the draft's proposals, so a seeded answer would
change with speculation; exact match against seed-keyed choices keeps it the target alone's.
"""

from __future__ import annotations

import torch

from anyspec.algorithms.sampling import argmax


def intersection_ids(draft_to_target: torch.Tensor,
                     intersection_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(draft ids, target ids)`` of the intersection, aligned: draft_ids[j] <-> target_ids[j]."""
    keep = draft_to_target >= 0
    if intersection_mask is not None:
        keep &= intersection_mask[: keep.shape[0]]
    draft_ids = keep.nonzero().squeeze(1)
    return draft_ids, draft_to_target[draft_ids]


def constrain(draft_logits: torch.Tensor, intersection_mask: torch.Tensor | None) -> torch.Tensor:
    """Draft logits with every token outside the intersection set to -inf."""
    if intersection_mask is None:
        return draft_logits
    return draft_logits.masked_fill(~intersection_mask, float("-inf"))


def verify_greedy(target_logits: torch.Tensor, draft_target_ids: list[int]) -> tuple[int, int]:
    """``target_logits [k+1, Vt]`` scored after [pending, t1..tk] -> ``(n accepted, bonus token)``."""
    return verify_exact(argmax(target_logits), draft_target_ids)


def verify_exact(choice: list[int], draft_target_ids: list[int]) -> tuple[int, int]:
    """Exact match: ``choice[i]`` is the target's own token after [pending, t1..ti] (its argmax, or
    its Gumbel-max choice, ``algorithms/gumbel.py``) -> ``(n accepted, the token the target adds)``."""
    n = 0
    while n < len(draft_target_ids) and draft_target_ids[n] == choice[n]:
        n += 1
    return n, choice[n]
