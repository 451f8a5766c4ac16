"""Token-Level Intersection (TLI): lossless speculative decoding across two vocabularies.

The draft and the target have different vocabularies. Their *intersection* is the set of tokens
whose bytes are identical on both sides; ``draft_to_target`` maps each intersection token's draft
id to the target id with the same bytes (-1 elsewhere).

One round, for k draft tokens:

1. ``propose``: the draft's logits are *constrained* to the intersection (everything else -inf).
   Greedy takes the argmax. Sampling draws from q', the constrained logits renormalised and shaped
   by the same temperature / top-k / top-p as the target. The token is mapped to its target id.
2. The target scores [pending token, t1..tk] in ONE forward pass: k+1 distributions p_0..p_k.
3. ``verify``: token t_i is accepted with probability min(1, p_i(t_i) / q'_i(t_i)). At the first
   rejection the next token is drawn from norm(max(0, p_i - q'_i)) over the WHOLE target
   vocabulary (q' is pushed into target space, so tokens outside the intersection, where
   q' = 0, keep their full target probability; draft tokens sharing a target id add up). If all k
   are accepted, a *bonus token* is drawn from p_k. Every round therefore commits between 1 and
   k+1 tokens, and each committed token is distributed exactly as if the target had sampled it
   alone (Leviathan et al. 2023; the intersection only changes q', never p).

Greedy decoding is the temperature -> 0 limit: accept while t_i == argmax p_i, then emit argmax.
"""

from __future__ import annotations

import torch

from anyspec.algorithms.sampling import argmax, logits_to_probs


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


def propose(draft_logits: torch.Tensor, intersection_mask: torch.Tensor | None, temperature: float,
            top_k: int = 0, top_p: float = 1.0,
            generator: torch.Generator | None = None) -> tuple[int, torch.Tensor | None]:
    """One draft token from ``draft_logits [Vd]``: ``(draft id, q')``; q' is None when greedy."""
    logits = constrain(draft_logits, intersection_mask)
    if temperature == 0:
        return argmax(logits)[0], None
    q = logits_to_probs(logits, temperature, top_k, top_p)
    return int(torch.multinomial(q, 1, generator=generator)), q


def to_target_space(q: torch.Tensor, draft_ids: torch.Tensor, target_ids: torch.Tensor,
                    target_vocab_size: int) -> torch.Tensor:
    """Push draft-vocabulary probabilities ``q [.., Vd]`` onto the target vocabulary ``[.., Vt]``.

    Only intersection tokens carry mass (q' is zero elsewhere by construction). Two draft tokens
    with the same bytes (e.g. SentencePiece's "▁" and its byte piece <0x20>) land on one target
    id and their probabilities add up: the probability that the draft proposes that target id.
    """
    out = q.new_zeros(*q.shape[:-1], target_vocab_size)
    return out.index_add_(-1, target_ids, q[..., draft_ids])


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


def verify_sample(p: torch.Tensor, q: torch.Tensor, draft_target_ids: list[int],
                  generator: torch.Generator | None = None) -> tuple[int, int]:
    """Speculative sampling over the whole target vocabulary -> ``(n accepted, next token)``.

    ``p [k+1, Vt]``: target probabilities; ``q [k, Vt]``: the draft's q' in target space;
    ``draft_target_ids``: the k proposed tokens as target ids.
    """
    k = len(draft_target_ids)
    if k:
        rows = torch.arange(k)
        ids = torch.tensor(draft_target_ids)
        ratio = p[rows, ids] / q[rows, ids]
        accepted = torch.rand(k, generator=generator) < ratio
        n = k if bool(accepted.all()) else int(torch.argmin(accepted.int()))
    else:
        n = 0
    if n < k:
        residual = torch.clamp(p[n] - q[n], min=0)
        total = residual.sum()
        # p == q up to rounding: rejection had probability ~0; any draw from p is then exact.
        probs = residual / total if total > 1e-12 else p[n]
    else:
        probs = p[k]
    return n, int(torch.multinomial(probs, 1, generator=generator))


def target_probs(target_logits: torch.Tensor, temperature: float, top_k: int = 0,
                 top_p: float = 1.0) -> torch.Tensor:
    """The target's distributions p ``[k+1, Vt]``, shaped exactly like the draft's q'."""
    return logits_to_probs(target_logits, temperature, top_k, top_p)
