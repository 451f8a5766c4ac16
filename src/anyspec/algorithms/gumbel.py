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

The noise is counter-based, so any entry of any position is computed without the others: entry c
of the noise with key K (``key(seed, i)``) takes the top 52 bits k of SplitMix64's finaliser of
``K + (c + 1) * golden``, u = (2k + 1) / 2^53 (exact in float64, never 0 or 1), and
G = -log(-log(u)) with the C library's ``log`` (Python's ``math.log``, the kernel's ``std::log``).
A choice is the row's largest ``float64(l_v) + G_v``, the first of equal ones.

Few entries' logarithms decide a choice. Since -log(u) >= 1 - u, G <= -log(1 - u), and
1 - u = n / 2^53 with n = 2^53 - 2k - 1 a positive integer, so G <= (53 - floor(log2 n)) ln 2: the
top bit of an integer bounds each entry's noise (by 53 ln 2 at most), and only the entries whose
bound reaches the best value found so far are computed. ``choose`` does that on numpy; anyspec's
kernel makes the same choices (``gumbel_choose``, ``backends/csrc/gumbel.cpp``).
"""

from __future__ import annotations

import math

import numpy as np
import torch

GOLDEN = 0x9E3779B97F4A7C15
MASK = (1 << 64) - 1
LN2 = math.log(2.0)
CEILING = 53 * LN2  # no entry's noise is above it


def mix(x: int) -> int:
    """SplitMix64's finaliser on a Python int (64 bits)."""
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK
    return x ^ (x >> 31)


def key(seed: int, position: int, stream: int = 0) -> int:
    """The 64-bit key of one position's noise; ``stream`` separates noises of one seed (the draft's
    own tokens outside the target's vocabulary)."""
    return mix(mix(mix(seed & MASK) ^ (position & MASK)) ^ stream)


def bits(noise_key: int, counters: np.ndarray) -> np.ndarray:
    """The integers k (52 bits, uint64) of entries ``counters`` of the noise with ``noise_key``."""
    with np.errstate(over="ignore"):
        x = (counters.astype(np.uint64) + np.uint64(1)) * np.uint64(GOLDEN) + np.uint64(noise_key)
        x ^= x >> np.uint64(30)
        x *= np.uint64(0xBF58476D1CE4E5B9)
        x ^= x >> np.uint64(27)
        x *= np.uint64(0x94D049BB133111EB)
        x ^= x >> np.uint64(31)
    return x >> np.uint64(12)


def value(k: int) -> float:
    """The noise of an entry whose integer is ``k``."""
    return -math.log(-math.log((2 * k + 1) * 2.0**-53))


def bound(k: np.ndarray) -> np.ndarray:
    """An upper bound of each entry's noise from its integer's ``k`` top bit (float64)."""
    n = (np.uint64(1 << 53) - np.uint64(2) * k - np.uint64(1)).astype(np.float64)  # exact: below 2^53
    return (54 - np.frexp(n)[1]) * LN2  # frexp's exponent is floor(log2 n) + 1


def pick(row: np.ndarray, row_key: int, twins: np.ndarray | None = None, twin_key: int = 0) -> int:
    """The choice of one row (float64 ``[V]``): the first largest ``row[v] + G_v`` over its finite
    entries (0 when none is), G_v entry v of the noise with ``row_key``, or entry ``twins[v]`` of
    the noise with ``twin_key`` where that is not negative (a draft's tokens that the target has)."""
    finite = np.flatnonzero(row > -np.inf)
    if len(finite) == 0:
        return 0
    if twins is None:
        ks = bits(row_key, finite)
    else:
        counters = twins[finite]
        shared = counters >= 0
        ks = np.where(shared, bits(twin_key, np.where(shared, counters, 0)), bits(row_key, finite))
    logits = row[finite]
    reach = logits + bound(ks)
    margin = 1e-9 * (CEILING + float(np.abs(logits).max()))  # float64 roundings, far below it
    first = int(np.argmax(reach))  # the likeliest to win: what it reaches drops every entry below it
    tried = np.union1d([first], np.flatnonzero(reach + margin >= logits[first] + value(int(ks[first]))))
    values = [logits[i] + value(int(ks[i])) for i in tried]  # in order: max takes the first of ties
    return int(finite[tried[values.index(max(values))]])


def choose(filtered: torch.Tensor, keys: list[int], twins: np.ndarray | None = None,
           twin_keys: list[int] | None = None) -> list[int]:
    """Each row's choice (``pick``) from ``filtered [R, V]`` (logits / T, -inf where top-k, top-p, a
    grammar or a mask leave a token out), row r with the noise of ``keys[r]`` (and ``twin_keys[r]``)."""
    rows = filtered.detach().to(torch.float32).numpy().astype(np.float64)
    twin_keys = twin_keys or [0] * len(keys)
    return [pick(row, k, twins, t) for row, k, t in zip(rows, keys, twin_keys, strict=True)]
