"""Logits to a probability distribution: temperature, then top-nσ, top-k, top-p (nucleus), min-p
and typical-p; and the largest entries of a vocabulary row.

The draft and the target go through the same filter (``filtered_logits``), so the draft chooses
from a distribution shaped by the same settings as the target's (``engine/sampler.py``).

``argmax`` and ``top_ids`` run on numpy, whose argmax is vectorised: torch's CPU argmax and topk
over a whole vocabulary are many times slower, and they run once per drafted token and once per
verified row.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import torch


def logits_to_probs(logits: torch.Tensor, temperature: float = 1.0, top_k: int = 0,
                    top_p: float = 1.0, min_p: float = 0.0, **more) -> torch.Tensor:
    """``logits [..., V]`` -> float32 probabilities ``[..., V]``: the softmax of ``filtered_logits``."""
    return torch.softmax(filtered_logits(logits, temperature, top_k, top_p, min_p, **more), dim=-1)


def filtered_logits(logits: torch.Tensor, temperature: float = 1.0, top_k: int = 0,
                    top_p: float = 1.0, min_p: float = 0.0, typical_p: float = 1.0,
                    top_n_sigma: float = 0.0) -> torch.Tensor:
    """``logits [..., V]`` / ``temperature`` (> 0) as float32, -inf where top-nσ, top-k, top-p
    (nucleus), min-p or typical-p leave a token out, in that order, each on what the ones before
    left. Top-nσ (llama.cpp's) keeps the logits at most ``top_n_sigma`` standard deviations below
    the largest. Min-p keeps the tokens at least ``min_p`` times as probable as the likeliest.
    Typical-p (transformers') keeps the tokens whose surprisal is nearest the entropy, the fewest
    whose probabilities reach ``typical_p`` (``typical``).

    ``top_n_sigma = 0``, ``top_k = 0``, ``top_p = 1``, ``min_p = 0`` and ``typical_p = 1`` switch
    those filters off. Tokens at ``-inf`` (e.g. outside the intersection) stay there.
    """
    logits = logits.float() / temperature
    if top_n_sigma > 0:
        logits = _rowwise(logits, lambda row: _within_sigmas(row, top_n_sigma))
    if top_k > 0 and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        probs = torch.softmax(logits, dim=-1)
        logits = logits.masked_fill(probs < nucleus_floor(probs, top_p), float("-inf"))
    if min_p > 0.0:
        probs = torch.softmax(logits, dim=-1)
        logits = logits.masked_fill(probs < min_p * probs.amax(dim=-1, keepdim=True), float("-inf"))
    if typical_p < 1.0:
        logits = _rowwise(logits, lambda row: typical(row, typical_p))
    return logits


def _rowwise(logits: torch.Tensor, kept) -> torch.Tensor:
    """``logits`` with -inf where ``kept(row)`` (a float64 row in numpy, its boolean mask) is False:
    row by row, so that a row's statistics are summed the same way in any batch."""
    rows = logits.detach().reshape(-1, logits.shape[-1]).contiguous().numpy()
    masks = [kept(row.astype(np.float64)) for row in rows]
    return logits.masked_fill(~torch.from_numpy(np.stack(masks)).reshape(logits.shape), float("-inf"))


def _within_sigmas(x: np.ndarray, n: float) -> np.ndarray:
    finite = np.isfinite(x)
    if not finite.any():
        return finite
    values = x[finite]
    return finite & (x >= values.max() - n * values.std())


def typical(x: np.ndarray, mass: float, bins: int = 1024) -> np.ndarray:
    """Which of the logits ``x`` (float64, one row) locally typical sampling keeps: with p the
    softmax and H its entropy, the tokens nearest H in surprisal -log p, the fewest whose
    probabilities sum to ``mass`` or more, with every token as near as the last of them. The
    distances go into ``bins`` buckets, and only the bucket where the sum crosses ``mass`` is sorted
    (a row has 151,936 entries, slow to sort whole)."""
    finite = np.isfinite(x)
    if not finite.any():
        return finite
    values = x[finite]
    values = values - values.max()
    weights = np.exp(values)
    total = weights.sum()
    p, surprisal = weights / total, np.log(total) - values
    distance = np.abs(surprisal - (p * surprisal).sum())
    width = distance.max() / bins
    if width == 0:
        return finite
    bucket = np.minimum((distance / width).astype(np.int64), bins - 1)
    below = np.cumsum(np.bincount(bucket, weights=p, minlength=bins))
    crossing = min(int(np.searchsorted(below, mass)), bins - 1)
    inside = np.flatnonzero(bucket == crossing)
    inside = inside[np.argsort(distance[inside], kind="stable")]
    reached = (below[crossing - 1] if crossing else 0.0) + np.cumsum(p[inside])
    last = inside[min(int(np.searchsorted(reached, mass)), len(inside) - 1)]
    kept = np.zeros_like(finite)
    kept[finite] = distance <= distance[last]
    return kept


def nucleus_floor(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """The smallest probability in each row's nucleus ``[..., 1]``, of ``probs [..., V]``: the fewest
    largest probabilities whose sum reaches ``top_p``; every token as probable as the last of them
    is in too, so ties never depend on an order; the sums run in float64. Looked for among the row's
    64 largest, then four times as many until their sum reaches ``top_p``: a nucleus is mostly a
    small part of a vocabulary, which is slow to sort whole."""
    size, n = probs.shape[-1], 64
    while True:
        largest = torch.topk(probs, n, dim=-1) if n < size else torch.sort(probs, dim=-1, descending=True)
        top, wide = largest.values, largest.values.double()
        mass = torch.cumsum(wide, dim=-1)
        if n >= size or bool((mass[..., -1] >= top_p).all()):
            break
        n = 4 * n if 4 * n <= size // 16 else size  # a large nucleus: the whole row at once
    inside = ((mass - wide) < top_p).sum(dim=-1, keepdim=True)  # at least the first: 0 before it
    return torch.gather(top, -1, (inside - 1).clamp(min=0))  # a row with nothing left (NaN) stays so


def penalized(logits: torch.Tensor, counts: list[dict[int, int]], presence: float, frequency: float,
              bias: dict[int, float], repeated: list[torch.Tensor] | None = None,
              repetition: float = 1.0) -> torch.Tensor:
    """``logits [R, V]`` as float32 with OpenAI's logit bias and penalties: token t gains ``bias[t]``
    in every row; with ``repetition`` (vLLM's and transformers' repetition penalty) each token of
    ``repeated[r]`` (in the prompt or written before row r) has its logit divided by it where
    positive, multiplied where not; then t loses ``frequency * n + presence`` in row r where it was
    written n > 0 times before that row (``counts[r]``). Each row by itself, whatever the rows
    beside it."""
    out = logits.float().clone()
    if bias:
        out[:, list(bias)] += torch.tensor(list(bias.values()), dtype=torch.float32)
    if repetition != 1.0:
        for r, ids in enumerate(repeated):
            x = out[r, ids]
            out[r, ids] = torch.where(x > 0, x / repetition, x * repetition)
    for r, seen in enumerate(counts):
        if seen:
            times = torch.tensor(list(seen.values()), dtype=torch.float32)
            out[r, list(seen)] -= frequency * times + presence
    return out


def argmax(logits: torch.Tensor) -> list[int]:
    """Each row's index of its largest value along the last dimension, as ``torch.argmax`` gives
    it: the first of equal maxima, and the first NaN where there is one."""
    rows = logits.detach().reshape(-1, logits.shape[-1]).to(torch.float32).cpu().numpy()
    return [int(row.argmax()) for row in rows]


def top_ids(probs: torch.Tensor, n: int) -> list[int]:
    """The indices of the ``n`` largest of ``probs [V]`` (non-negative), largest first; among equal
    values the lowest index first."""
    x = probs.detach().to(torch.float32).cpu().numpy().copy()
    out = []
    for _ in range(min(n, len(x))):
        i = int(x.argmax())
        out.append(i)
        x[i] = -1.0
    return out


class TokenLogprob(NamedTuple):
    token: int
    logprob: float  # log-softmax of the model's raw logits (no temperature, top-k or top-p)
    top: list[tuple[int, float]]  # the ``n`` likeliest ids and their logprobs, likeliest first


def token_logprobs(rows: torch.Tensor, tokens: list[int], n: int) -> list[TokenLogprob]:
    """Each of ``tokens``' logprob under its row of ``rows [len(tokens), V]`` (the row that chose
    it), with the row's ``n`` likeliest entries (fewer where a grammar's mask left fewer possible)."""
    out = []
    if not tokens:
        return out
    logp = torch.log_softmax(rows.float(), dim=-1)
    for row, token in zip(logp, tokens, strict=True):
        top = torch.topk(row, n) if n else None
        pairs = [(i, v) for i, v in zip(top.indices.tolist(), top.values.tolist(), strict=True)
                 if v > -math.inf] if top is not None else []
        out.append(TokenLogprob(token, float(row[token]), pairs))
    return out
