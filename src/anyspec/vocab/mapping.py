"""The vocabulary intersection of Token-Level Intersection (TLI) speculative decoding.

A draft token and a target token are the same token when they stand for the same bytes. The
draft only proposes tokens inside the intersection; the target verifies them after each draft
id is translated to its target id. Special and control tokens are never in the intersection.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import torch

from anyspec.vocab import cache as vocab_cache
from anyspec.vocab.bytes import TokenTable, eos_ids, token_table


def match_tables(target: TokenTable, draft: TokenTable, target_vocab_size: int,
                 draft_vocab_size: int) -> tuple[np.ndarray, np.ndarray]:
    """``(draft_to_target, target_to_draft)``: id maps with −1 where a token has no partner.

    Only ids below the model vocab sizes, present, non-special and with non-empty bytes take
    part. Every such id whose bytes the other side also has is mapped, to the other side's
    *canonical* id for those bytes: its ordinary token if it has one, else its ``<0xNN>`` byte
    piece, the lowest id first among equals. So both maps are inverse on canonical ids, and
    every mapped pair stands for identical bytes.

    Tokens are compared by a 64-bit hash of their bytes, in arrays; every matched pair is then
    compared byte for byte, and on any hash collision the exact (dict) path decides instead.
    """
    target_ids, draft_ids = _eligible(target, target_vocab_size), _eligible(draft, draft_vocab_size)
    target_keys, target_canonical, target_group = _canonical(target, target_ids, _hashes(target)[target_ids])
    draft_keys, draft_canonical, draft_group = _canonical(draft, draft_ids, _hashes(draft)[draft_ids])
    draft_to_target = np.full(draft_vocab_size, -1, dtype=np.int64)
    target_to_draft = np.full(target_vocab_size, -1, dtype=np.int64)
    if len(target_keys) and len(draft_keys):
        pos = np.minimum(np.searchsorted(target_keys, draft_keys), len(target_keys) - 1)
        hit = target_keys[pos] == draft_keys
        partner_of_draft_group = np.where(hit, target_canonical[pos], -1)
        partner_of_target_group = np.full(len(target_keys), -1, dtype=np.int64)
        partner_of_target_group[pos[hit]] = draft_canonical[hit]
        draft_to_target[draft_ids] = partner_of_draft_group[draft_group]
        target_to_draft[target_ids] = partner_of_target_group[target_group]
    # Every draft pair is checked byte for byte. A target id maps to the canonical draft id of its
    # group, which pairs with the group's canonical target id (checked above), so checking each
    # target id against its own group's canonical id covers the other direction.
    mapped = np.flatnonzero(draft_to_target >= 0)
    exact = _same_bytes(draft, mapped, target, draft_to_target[mapped]).all()
    if exact and len(target_ids):
        member = target_ids != target_canonical[target_group]
        exact = _same_bytes(target, target_ids[member], target, target_canonical[target_group][member]).all()
    if not exact:
        return _match_exact(target, draft, target_ids, draft_ids, target_vocab_size, draft_vocab_size)
    return draft_to_target, target_to_draft


def _eligible(table: TokenTable, model_vocab_size: int) -> np.ndarray:
    n = min(len(table), model_vocab_size)
    off = table.offsets
    return np.flatnonzero(table.present[:n] & ~table.special[:n] & (off[1:n + 1] > off[:n]))


_BASE = np.uint64(0x9E3779B97F4A7C15)
_BASE_INVERSE = np.uint64(pow(0x9E3779B97F4A7C15, -1, 1 << 64))
_LENGTH_MIX = np.uint64(0xD6E8FEB86659FD93)


def _powers(base: np.uint64, n: int) -> np.ndarray:
    out = np.full(n, base, dtype=np.uint64)
    out[0] = 1
    return np.cumprod(out, out=out)


def _hashes(table: TokenTable) -> np.ndarray:
    """Polynomial hash (mod 2**64) of every token's bytes, from prefix sums over the blob."""
    data = np.frombuffer(table.blob, dtype=np.uint8).astype(np.uint64)
    prefix = np.zeros(len(data) + 1, dtype=np.uint64)
    np.cumsum(data * _powers(_BASE, len(data) + 1)[:-1], out=prefix[1:])
    starts, ends = table.offsets[:-1], table.offsets[1:]
    inverse = _powers(_BASE_INVERSE, len(data) + 1)
    return (prefix[ends] - prefix[starts]) * inverse[starts] + (ends - starts).astype(np.uint64) * _LENGTH_MIX


def _canonical(table: TokenTable, ids: np.ndarray, hashes: np.ndarray) -> tuple[np.ndarray, ...]:
    """Sorted distinct hashes, the preferred id of each (ordinary before byte piece, then lowest),
    and the index into those of every id in ``ids``."""
    order = np.argsort(hashes)
    sorted_hash, sorted_ids = hashes[order], ids[order]
    first = np.ones(len(order), dtype=bool)
    first[1:] = sorted_hash[1:] != sorted_hash[:-1]
    sorted_group = np.cumsum(first) - 1
    canonical = sorted_ids[first]
    sizes = np.bincount(sorted_group, minlength=len(canonical)) if len(order) else np.zeros(0, dtype=np.int64)
    shared = np.flatnonzero(sizes[sorted_group] > 1)
    if len(shared):
        members, groups = sorted_ids[shared], sorted_group[shared]
        ranked = np.lexsort((members, table.fallback[members], groups))
        lead = np.ones(len(ranked), dtype=bool)
        lead[1:] = groups[ranked][1:] != groups[ranked][:-1]
        canonical[groups[ranked][lead]] = members[ranked][lead]
    group = np.empty(len(order), dtype=np.int64)
    group[order] = sorted_group
    return sorted_hash[first], canonical, group


def _same_bytes(a: TokenTable, a_ids: np.ndarray, b: TokenTable, b_ids: np.ndarray) -> np.ndarray:
    """Whether token ``a_ids[k]`` of ``a`` and ``b_ids[k]`` of ``b`` have identical bytes, for each k."""
    a_start, b_start = a.offsets[a_ids], b.offsets[b_ids]
    length = a.offsets[a_ids + 1] - a_start
    same = length == b.offsets[b_ids + 1] - b_start
    length = np.where(same, length, 0)
    total = int(length.sum())
    if total == 0:
        return same
    begin = _cumulative_starts(length)
    within = np.arange(total, dtype=np.int64) - np.repeat(begin, length)
    a_bytes = np.frombuffer(a.blob, dtype=np.uint8)[np.repeat(a_start, length) + within]
    b_bytes = np.frombuffer(b.blob, dtype=np.uint8)[np.repeat(b_start, length) + within]
    differ = np.zeros(total + 1, dtype=np.int64)
    np.cumsum(a_bytes != b_bytes, out=differ[1:])
    return same & (differ[begin + length] == differ[begin])


def _cumulative_starts(length: np.ndarray) -> np.ndarray:
    begin = np.zeros(len(length), dtype=np.int64)
    np.cumsum(length[:-1], out=begin[1:])
    return begin


def _match_exact(target: TokenTable, draft: TokenTable, target_ids: np.ndarray, draft_ids: np.ndarray,
                 target_vocab_size: int, draft_vocab_size: int) -> tuple[np.ndarray, np.ndarray]:
    """The same maps as :func:`match_tables`, with Python dicts keyed by the bytes themselves."""
    def index(table: TokenTable, ids: np.ndarray) -> dict[bytes, int]:
        order = np.lexsort((-ids, ~table.fallback[ids]))
        return {table[int(i)]: int(i) for i in ids[order]}

    target_index, draft_index = index(target, target_ids), index(draft, draft_ids)
    draft_to_target = np.full(draft_vocab_size, -1, dtype=np.int64)
    target_to_draft = np.full(target_vocab_size, -1, dtype=np.int64)
    for i in draft_ids.tolist():
        draft_to_target[i] = target_index.get(draft[i], -1)
    for i in target_ids.tolist():
        target_to_draft[i] = draft_index.get(target[i], -1)
    return draft_to_target, target_to_draft


def mask_outside(logits: torch.Tensor, outside: dict, vocab_size: int) -> torch.Tensor:
    """``logits`` with −inf where ``outside`` is True; ``outside`` maps device -> bool mask, filled
    on first use of a new device so no call allocates more than its output."""
    if logits.shape[-1] != vocab_size:
        raise ValueError(f"draft logits have {logits.shape[-1]} entries in the last dimension; "
                         f"the mapping was built for a draft vocab of {vocab_size}")
    mask = outside.get(logits.device)
    if mask is None:
        mask = outside[logits.device] = next(iter(outside.values())).to(logits.device)
    return logits.masked_fill(mask, float("-inf"))


def unk_id(tokenizer: Any, side: str) -> int:
    """The id absent tokens fall back to: ``unk_token_id``, else ``eos_token_id`` (warned)."""
    unk = getattr(tokenizer, "unk_token_id", None)
    if unk is not None:
        return int(unk)
    eos = getattr(tokenizer, "eos_token_id", None)
    if eos is not None:
        warnings.warn(f"the {side} tokenizer has no unk token; using its eos token ({eos}) instead",
                      stacklevel=3)
        return int(eos)
    raise ValueError(f"the {side} tokenizer has neither an unk nor an eos token to fall back to")


class VocabMapping:
    """Token-level intersection of a target and a draft vocabulary, by the bytes of each token.

    ``draft_to_target`` (sized by the draft model's vocab) and ``target_to_draft`` (sized by the
    target model's vocab) are long tensors with −1 where a token is outside the intersection.
    Model vocab sizes may exceed the tokenizer (padded embedding rows map to −1); tokenizer ids
    at or above the model size are ignored. ``target_token_bytes[id]`` / ``draft_token_bytes[id]``
    give the bytes an id stands for (b"" for ids the tokenizer lacks).

    Built mappings are cached on disk (``cache_dir()/vocab``); pass ``cache=False`` to skip it.
    """

    def __init__(self, target_tokenizer: Any, draft_tokenizer: Any, target_vocab_size: int | None = None,
                 draft_vocab_size: int | None = None, device: str | torch.device = "cpu",
                 *, cache: bool = True):
        self.target_vocab_size = int(target_vocab_size if target_vocab_size is not None
                                     else len(target_tokenizer))
        self.draft_vocab_size = int(draft_vocab_size if draft_vocab_size is not None
                                    else len(draft_tokenizer))
        self.device = torch.device(device)
        self.from_cache = False
        built = None
        key = None
        if cache:
            key = vocab_cache.mapping_key(target_tokenizer, draft_tokenizer, self.target_vocab_size,
                                          self.draft_vocab_size)
            built = vocab_cache.load(key)
            if built is not None and not (vocab_cache.verify_sample(target_tokenizer, built[0], 1)
                                          and vocab_cache.verify_sample(draft_tokenizer, built[1], 2)):
                built = None
            self.from_cache = built is not None
        if built is None:
            target_table, draft_table = token_table(target_tokenizer), token_table(draft_tokenizer)
            d2t, t2d = match_tables(target_table, draft_table, self.target_vocab_size,
                                    self.draft_vocab_size)
            if key is not None:
                try:
                    vocab_cache.save(key, target_table, draft_table, d2t, t2d)
                except OSError as exc:
                    warnings.warn(f"could not write the vocabulary cache ({exc}); continuing without it",
                                  stacklevel=2)
            built = (target_table, draft_table, d2t, t2d)
        self.target_token_bytes, self.draft_token_bytes, d2t, t2d = built
        self.draft_to_target = torch.from_numpy(np.asarray(d2t, dtype=np.int64)).to(self.device)
        self.target_to_draft = torch.from_numpy(np.asarray(t2d, dtype=np.int64)).to(self.device)
        self.intersection_mask = self.draft_to_target >= 0
        self.intersection_size = int(np.count_nonzero(np.asarray(d2t) >= 0))
        self._outside = {self.device: ~self.intersection_mask}
        self.target_eos_ids = eos_ids(target_tokenizer)
        self.draft_eos_ids = eos_ids(draft_tokenizer)
        self.target_unk_id = unk_id(target_tokenizer, "target")
        self.draft_unk_id = unk_id(draft_tokenizer, "draft")

    def constrain_draft_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """A copy of draft ``logits`` (``[..., draft_vocab]``) with −inf outside the intersection."""
        return mask_outside(logits, self._outside, self.draft_vocab_size)

    def map_draft_to_target_ids(self, ids: torch.Tensor, fill_unk: bool = False) -> torch.Tensor:
        """Target ids for draft ``ids``; −1 outside the intersection (the target UNK if ``fill_unk``)."""
        return _lookup(self.draft_to_target, ids, self.target_unk_id if fill_unk else -1)

    def map_target_to_draft_ids(self, ids: torch.Tensor, fill_unk: bool = False) -> torch.Tensor:
        """Draft ids for target ``ids``; −1 outside the intersection (the draft UNK if ``fill_unk``)."""
        return _lookup(self.target_to_draft, ids, self.draft_unk_id if fill_unk else -1)

    def __repr__(self) -> str:
        return (f"VocabMapping(intersection={self.intersection_size}, target_vocab={self.target_vocab_size}, "
                f"draft_vocab={self.draft_vocab_size})")


def _lookup(table: torch.Tensor, ids: torch.Tensor, absent: int) -> torch.Tensor:
    ids = torch.as_tensor(ids, device=table.device)
    inside = (ids >= 0) & (ids < table.numel())
    mapped = table[ids.clamp(0, table.numel() - 1)]
    mapped = torch.where(inside, mapped, torch.full_like(mapped, -1))
    if absent != -1:
        mapped = torch.where(mapped < 0, torch.full_like(mapped, absent), mapped)
    return mapped
