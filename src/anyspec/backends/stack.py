"""The KV caches of anyspec's C++ decoder stack (lean and GGUF models); the rotary angles are arch.py's.

A model that holds several sequences at once (``GGUFModel.new_sequence``) gives each its own
``KVCache``; one ``decoder_forward`` then computes new rows of any of them together, each row over
its own sequence's cache.
"""

from __future__ import annotations

import torch


class KVCache:
    """One preallocated fp32 tensor per layer for keys and one for values, ``[kv_heads, capacity, head_dim]``.

    It grows by doubling; positions past the sequence's ``num_cached`` are simply overwritten by the
    next forward, so cropping costs nothing.
    """

    def __init__(self, layers: int, kv_heads: int, head_dim: int, capacity: int = 256):
        self.layers, self.kv_heads, self.head_dim = layers, kv_heads, head_dim
        self.keys, self.values = self._allocate(capacity), self._allocate(capacity)

    def _allocate(self, length: int) -> list[torch.Tensor]:
        # Ordinary tensors even when a caller runs the forward under inference mode: a cache grown
        # there is written outside it later (``copy_prefix``, ``Sequence.keep_rows``).
        with torch.inference_mode(False):
            return [torch.zeros(self.kv_heads, length, self.head_dim) for _ in range(self.layers)]

    @property
    def capacity(self) -> int:
        return self.keys[0].shape[1]

    def reserve(self, start: int, end: int) -> None:
        """Room for positions up to ``end``; the first ``start`` are kept."""
        if end > self.capacity:
            size = max(end, 2 * self.capacity)
            for old in (self.keys, self.values):
                new = self._allocate(size)
                for tensor, before in zip(new, old, strict=True):
                    tensor[:, :start] = before[:, :start]
                old[:] = new

    def copy_prefix(self, donor: KVCache, n: int) -> None:
        """The keys and values of ``donor``'s first ``n`` positions in place of this cache's."""
        self.reserve(0, n)
        for mine, theirs in zip(self.keys + self.values, donor.keys + donor.values, strict=True):
            mine[:, :n] = theirs[:, :n]


class Sequence:
    """One sequence of a model that holds several: its own KV cache and the ids in it.

    ``extend``, ``crop`` and ``reset`` work as on a model with one cache; ``model.forward`` takes
    the new ids of several sequences at once.
    """

    def __init__(self, model, cache: KVCache):
        self.model, self.cache = model, cache
        self.cached_ids: list[int] = []

    @property
    def num_cached(self) -> int:
        return len(self.cached_ids)

    @property
    def row_invariant(self) -> bool:
        return self.model.row_invariant

    @property
    def tree_attention(self) -> bool:
        return self.model.tree_attention

    @property
    def context_length(self) -> int | None:
        return self.model.context_length

    @property
    def kernel_level(self) -> int | None:
        return self.model.kernel_level

    def reset(self) -> None:
        self.cached_ids = []

    def release(self) -> None:
        """Leave the model: the sequence holds nothing and is no donor (``donors``) any more."""
        self.cached_ids = []
        self.model.sequences.discard(self)

    def donors(self) -> list[Sequence]:
        """The model's other sequences, whose cached prefixes this one may adopt."""
        return [s for s in self.model.sequences if s is not self]

    def adopt(self, donor: Sequence, n: int) -> None:
        """Start from a copy of ``donor``'s first ``n`` cached tokens. On a row-invariant model they
        are the bits this sequence would compute for the same ids, without the compute."""
        self.cache.copy_prefix(donor.cache, n)
        self.cached_ids = donor.cached_ids[:n]

    def crop(self, n: int) -> None:
        del self.cached_ids[n:]

    def extend(self, ids: list[int], last: int | None = None, head=None, parents=None) -> torch.Tensor:
        return self.model.forward([(self, ids, last, parents)], head)[0]

    def keep_rows(self, start: int, rows: list[int]) -> None:
        """Of the tokens cached from ``start`` on (a tree's, ``model.forward``), keep ``rows`` (a
        branch, root first) as the positions from ``start``, and drop the rest."""
        if rows != list(range(len(rows))):
            at = torch.tensor(rows) + start
            for t in self.cache.keys + self.cache.values:
                t[:, start:start + len(rows)] = t[:, at]
        self.cached_ids[start:] = [self.cached_ids[start + r] for r in rows]
