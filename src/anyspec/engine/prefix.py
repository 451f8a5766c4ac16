"""The prefix cache: a sequence keeps the cached tokens its next prompt begins with, or copies a
longer prefix another sequence of the same model holds."""

from __future__ import annotations

from anyspec.engine.model import PrefixSharing


def common_prefix(a: list[int], b: list[int]) -> int:
    """Length of the longest common prefix of two id lists (C-speed slice compares)."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo


def longest_prefix(seqs, ids: list[int]) -> tuple[object | None, int]:
    """The first of ``seqs`` whose ``cached_ids`` share the longest prefix with ``ids``, and its
    length; (None, 0) where none shares a token."""
    best, most = None, 0
    for seq in seqs:
        if (n := common_prefix(seq.cached_ids, ids)) > most:
            best, most = seq, n
    return best, most


def reuse_prefix(model, ids: list[int], enabled: bool = True) -> int:
    """Keep the cached tokens that begin ``ids`` and drop the rest; returns how many were kept.

    Where another sequence of the model (``model.donors()``: a batch's other slots) holds a longer
    prefix of ``ids``, that prefix is copied instead, so concurrent requests that share a system
    prompt compute it once. Only for a row-invariant model (``model.row_invariant``: anyspec's
    row-wise kernel in every product and attention, so a token's keys and values are the same bits
    however many tokens were computed with it); any other model starts empty, since a prefix
    computed within another request could differ in the last bits from the target alone's own
    prefill.
    """
    if not reusable(model, enabled):
        model.reset()
        return 0
    keep = common_prefix(model.cached_ids, ids)
    donor, most = longest_prefix(model.donors() if isinstance(model, PrefixSharing) else [], ids)
    if most > keep:
        model.adopt(donor, most)
        return most
    if keep:
        model.crop(keep)
    else:
        model.reset()
    return keep


def reusable(model, enabled: bool) -> bool:
    return enabled and model.row_invariant
