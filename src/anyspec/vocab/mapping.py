"""The vocabulary intersection of Token-Level Intersection (TLI) speculative decoding.

A draft token and a target token are the same token when they stand for the same bytes. The
draft only proposes tokens inside the intersection; the target verifies them after each draft
id is translated to its target id. Special and control tokens are never in the intersection.
"""

from __future__ import annotations

import warnings
from itertools import repeat
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
    """
    target_ids, target_pieces = _eligible(target, target_vocab_size)
    draft_ids, draft_pieces = _eligible(draft, draft_vocab_size)
    target_index = _canonical(target, target_ids, target_pieces)
    draft_index = _canonical(draft, draft_ids, draft_pieces)
    draft_to_target = np.full(draft_vocab_size, -1, dtype=np.int64)
    target_to_draft = np.full(target_vocab_size, -1, dtype=np.int64)
    draft_to_target[draft_ids] = np.fromiter(map(target_index.get, draft_pieces, repeat(-1)),
                                             dtype=np.int64, count=len(draft_pieces))
    target_to_draft[target_ids] = np.fromiter(map(draft_index.get, target_pieces, repeat(-1)),
                                              dtype=np.int64, count=len(target_pieces))
    return draft_to_target, target_to_draft


def _eligible(table: TokenTable, model_vocab_size: int) -> tuple[np.ndarray, list[bytes]]:
    n = min(len(table), model_vocab_size)
    off = table.offsets
    ids = np.flatnonzero(table.present[:n] & ~table.special[:n] & (off[1:n + 1] > off[:n]))
    pieces = table.pieces
    return ids, [pieces[i] for i in ids.tolist()]


def _canonical(table: TokenTable, ids: np.ndarray, pieces: list[bytes]) -> dict[bytes, int]:
    """Bytes -> preferred id: later dict entries win, so insert in reverse preference order."""
    order = np.lexsort((-ids, ~table.fallback[ids]))
    id_list = ids.tolist()
    return {pieces[k]: id_list[k] for k in order.tolist()}


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
        self.intersection_size = int(self.intersection_mask.sum())
        self._outside = {self.device: ~self.intersection_mask}
        self.target_eos_ids = eos_ids(target_tokenizer)
        self.draft_eos_ids = eos_ids(draft_tokenizer)
        self.target_unk_id = unk_id(target_tokenizer, "target")
        self.draft_unk_id = unk_id(draft_tokenizer, "draft")

    def constrain_draft_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """A copy of draft ``logits`` (``[..., draft_vocab]``) with −inf outside the intersection."""
        if logits.shape[-1] != self.draft_vocab_size:
            raise ValueError(f"draft logits have {logits.shape[-1]} entries in the last dimension; "
                             f"the mapping was built for a draft vocab of {self.draft_vocab_size}")
        outside = self._outside.get(logits.device)
        if outside is None:
            outside = self._outside[logits.device] = self._outside[self.device].to(logits.device)
        return logits.masked_fill(outside, float("-inf"))

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
