"""Sampling that a draft cannot change: Gumbel-max with noise fixed by the seed and the position.

The token at generated position i is ``argmax_v(l_v / T + G_v)``, where ``l`` are the target's logits
after top-k / top-p (``sampling.filtered_logits``: -inf outside them) and ``G`` is standard Gumbel
noise, one value per vocabulary entry, fixed by ``(seed, i)``. When the G_v are independent, the
argmax is distributed exactly as softmax(l / T) (the Gumbel-max trick), so each committed token is
an exact sample of the target's distribution. Since the noise depends on the seed and the position
only, the target alone and the target verifying any draft commit the same token at position i
from the same logits row: anyspec's kernels give that row the same bits either way, so a seeded
answer is the same text with or without speculation, whatever k, branches or batch.

Verifying becomes exact match, as for greedy decoding: a proposed token is accepted when it is the
target's own choice at its position. A draft that reads the same noise (on the tokens it shares
with the target) picks the same token whenever its distribution is close to the target's (Daliri,
Musco and Suresh, "Coupling without Communication and Drafter-Invariant Speculative Decoding",
2024), far more often than an independent sample would.

The noise is counter-based: SplitMix64 over ``key(seed, i) + v * golden``, so any entry of any
position is computed without the others, the same on every machine.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

GOLDEN = 0x9E3779B97F4A7C15
MASK = (1 << 64) - 1


def mix(x: int) -> int:
    """SplitMix64's finaliser on a Python int (64 bits)."""
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK
    return x ^ (x >> 31)


def key(seed: int, position: int, stream: int = 0) -> int:
    """The 64-bit key of one position's noise; ``stream`` separates noises of one seed (the draft's
    own tokens outside the target's vocabulary)."""
    return mix(mix(mix(seed & MASK) ^ (position & MASK)) ^ stream)


def noise(seed: int, position: int, size: int, stream: int = 0,
          ids: np.ndarray | None = None) -> torch.Tensor:
    """Standard Gumbel noise ``[size]`` (float64) for ``position``: entry v is -log(-log(u_v)), u_v
    uniform in (0, 1) from SplitMix64 of ``key + (v + 1) * golden``; ``ids``: those entries only
    (the same values, each computed alone)."""
    with np.errstate(over="ignore"):
        start = np.uint64(key(seed, position, stream))
        v = np.arange(size, dtype=np.uint64) if ids is None else ids.astype(np.uint64)
        x = (v + np.uint64(1)) * np.uint64(GOLDEN) + start
        x ^= x >> np.uint64(30)
        x *= np.uint64(0xBF58476D1CE4E5B9)
        x ^= x >> np.uint64(27)
        x *= np.uint64(0x94D049BB133111EB)
        x ^= x >> np.uint64(31)
    u = ((x >> np.uint64(11)).astype(np.float64) + 0.5) * 2.0**-53  # 53 bits, never 0 or 1
    return torch.from_numpy(-np.log(-np.log(u)))


FEW = 16  # a row with at most 1/FEW of its entries finite draws noise for those alone


class Noises:
    """One generation's noise, position by position (``make(position)``), kept while its positions
    may be verified again (a rejected row's position comes back in the next round)."""

    def __init__(self, make: Callable[[int], torch.Tensor], keep: int = 64):
        self.make, self.keep = make, keep
        self.cache: dict[int, torch.Tensor] = {}

    def at(self, position: int) -> torch.Tensor:
        if position not in self.cache:
            if len(self.cache) >= self.keep:
                del self.cache[min(self.cache)]
            self.cache[position] = self.make(position)
        return self.cache[position]


def choose(filtered: torch.Tensor, noises: list[Callable[[np.ndarray | None], torch.Tensor]]) -> list[int]:
    """Each row's token: ``argmax(filtered[r] + noise_r)`` in float64; ``filtered [R, V]`` are
    logits / T with -inf where top-k / top-p (or a mask) leave a token out. ``noises[r]`` gives row
    r's noise for some entries (``noises[r](ids)``; None: all of them), drawn only where the row is
    finite when few are (top-k, top-p, min-p, a grammar): -inf stays -inf whatever the noise, so the
    choice is the same. Row by row on numpy, whose argmax is vectorised (``sampling.argmax``)."""
    rows = filtered.detach().to(torch.float32).numpy().astype(np.float64)  # numpy widens faster
    out = []
    for row, noise in zip(rows, noises, strict=True):
        finite = np.flatnonzero(row > -np.inf)
        if 0 < len(finite) <= len(row) // FEW:
            out.append(int(finite[np.argmax(row[finite] + noise(finite).numpy())]))
        else:
            out.append(int(np.argmax(row + noise(None).numpy()[: len(row)])))
    return out
