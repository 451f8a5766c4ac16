"""Logits to a probability distribution: temperature, then top-k, then top-p (nucleus).

The draft and the target go through the same function, so the distribution the draft sampled
from (q') and the one the target would sample from (p) are shaped by the same settings.
"""

from __future__ import annotations

import torch


def logits_to_probs(logits: torch.Tensor, temperature: float = 1.0, top_k: int = 0,
                    top_p: float = 1.0) -> torch.Tensor:
    """``logits [..., V]`` -> float32 probabilities ``[..., V]``. ``temperature`` must be > 0.

    ``top_k = 0`` and ``top_p = 1`` switch those filters off. Tokens at ``-inf`` (e.g. outside the
    intersection) get probability 0.
    """
    logits = logits.float() / temperature
    if top_k > 0 and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        sorted_probs = torch.softmax(sorted_logits, dim=-1)
        mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
        drop_sorted = mass_before >= top_p  # keep the smallest prefix whose mass reaches top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return torch.softmax(logits, dim=-1)


def sample(probs: torch.Tensor, generator: torch.Generator | None = None) -> int:
    """One token id drawn from ``probs [V]``."""
    return int(torch.multinomial(probs, 1, generator=generator))
