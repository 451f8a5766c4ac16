"""What the lean and GGUF models share around anyspec's C++ decoder stack: the KV caches, the
sequences and a batch's rows; the rotary angles are arch.py's.

A model that holds several sequences at once (``StackModel.new_sequence``) gives each its own
``KVCache``; one ``decoder_forward`` then computes new rows of any of them together, each row over
its own sequence's cache (``assemble`` lays them out, ``StackModel.forward`` runs them).
"""

from __future__ import annotations

import weakref
from typing import NamedTuple

import torch

from anyspec.algorithms.tree import depths


class KVCache:
    """One preallocated tensor per layer for keys and one for values, ``[kv_heads, capacity, head_dim]``,
    of fp32 or fp16 (``dtype``; the kernel rounds each key and value to it as it writes them).

    It grows by doubling, to at most the model's context (``limit``); positions past the sequence's
    ``num_cached`` are simply overwritten by the next forward, so cropping costs nothing.
    """

    def __init__(self, layers: int, kv_heads: int, head_dim: int, capacity: int = 256,
                 dtype: torch.dtype = torch.float32):
        self.layers, self.kv_heads, self.head_dim, self.dtype = layers, kv_heads, head_dim, dtype
        self.keys, self.values = self._allocate(capacity), self._allocate(capacity)

    def _allocate(self, length: int) -> list[torch.Tensor]:
        # Ordinary tensors even when a caller runs the forward under inference mode: a cache grown
        # there is written outside it later (``copy_prefix``, ``Sequence.keep_rows``).
        with torch.inference_mode(False):
            shape = (self.kv_heads, length, self.head_dim)
            return [torch.zeros(shape, dtype=self.dtype) for _ in range(self.layers)]

    @property
    def capacity(self) -> int:
        return self.keys[0].shape[1]

    def reserve(self, start: int, end: int, limit: int | None = None) -> None:
        """Room for positions up to ``end``; the first ``start`` are kept. ``limit``: the most it
        grows to beyond ``end`` (the model's context)."""
        if end > self.capacity:
            size = max(end, min(2 * self.capacity, limit or 2 * self.capacity))
            for old in (self.keys, self.values):
                new = self._allocate(size)
                for tensor, before in zip(new, old, strict=True):
                    tensor[:, :start] = before[:, :start]
                old[:] = new

    def copy_prefix(self, donor: KVCache, n: int, limit: int | None = None) -> None:
        """The keys and values of ``donor``'s first ``n`` positions in place of this cache's."""
        self.reserve(0, n, limit)
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
        self.cache.copy_prefix(donor.cache, n, self.context_length)
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


class Rows(NamedTuple):
    """One ``decoder_forward``'s rows: the new ids of several sequences, one entry after another."""

    ids: torch.Tensor
    positions: torch.Tensor  # each row's position in its sequence
    owners: torch.Tensor  # each row's entry in the batch
    keys: list[torch.Tensor]  # each entry's cache, layer by layer
    values: list[torch.Tensor]
    slots: list[int]  # each row's place in its cache, where an entry is a tree (else empty)
    parents: list[int]  # each row's parent row, -1 for one that follows its cache (trees only)
    picked: list[int]  # the rows whose logits are returned
    keeps: list[int]  # how many of those each entry has


def check_distinct(batch: list[tuple]) -> None:
    if len({id(entry[0]) for entry in batch}) != len(batch):
        raise ValueError("forward: a sequence appears twice in one batch")


def assemble(batch: list[tuple]) -> Rows:
    """The rows of ``StackModel.forward``'s entries ``(sequence, ids, last[, parents])``, each
    cache with room for its new ids."""
    check_distinct(batch)
    positions, owners, ids, picked, keeps, slots, parents = [], [], [], [], [], [], []
    trees = any(len(entry) > 3 and entry[3] is not None for entry in batch)
    for i, (seq, new, last, *tree) in enumerate(batch):
        start, m = seq.num_cached, len(new)
        seq.cache.reserve(start, start + m, seq.context_length)
        tree = tree[0] if tree else None
        if tree is None:
            positions += range(start, start + m)
            parents += [-1] * m if trees else []
        else:
            positions += [start + d for d in depths(tree)]
            parents += [-1 if up < 0 else len(ids) + up for up in tree]
        slots += range(start, start + m) if trees else []
        owners += [i] * m
        keeps.append(m if last is None else min(last, m))
        picked += range(len(ids) + m - keeps[-1], len(ids) + m)
        ids += new
    keys = [t for seq, *_ in batch for t in seq.cache.keys]
    values = [t for seq, *_ in batch for t in seq.cache.values]
    ids, positions, owners = (torch.tensor(v, dtype=torch.long) for v in (ids, positions, owners))
    return Rows(ids, positions, owners, keys, values, slots, parents, picked, keeps)


class StackModel:
    """A decoder on the C++ stack that holds several sequences (``new_sequence``) and runs rows of
    many in one ``forward``; ``extend``, ``crop``, ``reset``, ``donors``, ``adopt`` and
    ``keep_rows`` work on its own sequence, ``own``.

    A subclass has ``kernel``, ``arch``, ``description``, the cache's sizes (``n_layers``,
    ``kv_heads``, ``head_dim``), and ``decode(rows, head)``, the logits of ``rows.picked``.
    """

    sequences: weakref.WeakSet[Sequence]  # every live one
    own: Sequence
    kv_dtype: torch.dtype = torch.float32  # the KV caches' type (use_kv_dtype)

    def hold_sequences(self) -> None:
        self.sequences = weakref.WeakSet()
        self.own = self.new_sequence()

    def use_kv_dtype(self, dtype: torch.dtype) -> None:
        """KV caches of ``dtype`` (fp32 or fp16) from now on; the model's own sequence starts empty."""
        self.kv_dtype = dtype
        self.hold_sequences()

    @property
    def kv_bytes_per_token(self) -> int:
        """The bytes a cached token's keys and values take in one sequence's cache."""
        return 2 * self.n_layers * self.kv_heads * self.head_dim * self.kv_dtype.itemsize

    def new_sequence(self) -> Sequence:
        """Another sequence with its own (empty) KV cache."""
        seq = Sequence(self, KVCache(self.n_layers, self.kv_heads, self.head_dim, dtype=self.kv_dtype))
        self.sequences.add(seq)
        return seq

    @property
    def cached_ids(self) -> list[int]:
        return self.own.cached_ids

    @property
    def num_cached(self) -> int:
        return self.own.num_cached

    def reset(self) -> None:
        self.own.reset()

    def crop(self, n: int) -> None:
        self.own.crop(n)

    def donors(self) -> list[Sequence]:
        return self.own.donors()

    def adopt(self, donor: Sequence, n: int) -> None:
        self.own.adopt(donor, n)

    def extend(self, ids: list[int], last: int | None = None, head=None,
               parents: list[int] | None = None) -> torch.Tensor:
        """Append ``ids`` to the cache; fp32 logits ``[len(ids), V]`` (or of the ``last`` rows);
        ``parents``: the ids are a tree (``forward``)."""
        return self.own.extend(ids, last, head, parents)

    def keep_rows(self, start: int, rows: list[int]) -> None:
        self.own.keep_rows(start, rows)

    @torch.no_grad()  # not inference_mode: its tensors (caches, logits) could not be written later
    def forward(self, batch: list[tuple], head=None) -> list[torch.Tensor]:
        """Append each ``(sequence, ids, last)``'s ids to its sequence in one pass; for each, the fp32
        logits of its ids (or of its ``last`` rows), ``[rows, V]``. ``head``: the subclass's
        restricted head, where it has one (``model.RestrictedHead``).

        An entry ``(sequence, ids, last, parents)`` is a tree: ``parents[j]`` is the index in ``ids``
        of id j's parent (-1 for the first, which follows the cache). Each id then sits at the
        position after its parent and attends to its own ancestors only, so its logits are the same
        bits as for its branch alone; ``Sequence.keep_rows`` keeps one branch."""
        rows = assemble(batch)
        logits = self.decode(rows, head)
        for seq, new, *_ in batch:
            seq.cached_ids.extend(new)
        return [logits] if len(rows.keeps) == 1 else list(logits.split(rows.keeps))

    def run_stack(self, x: torch.Tensor, rows: Rows, layers: list) -> torch.Tensor:
        """The decoder stack over the embedded ``rows`` ``x``; the hidden states of the picked rows."""
        tables = [rotary.angles(rows.positions) for rotary in self.description.rotary]
        cos, sin = [c for c, _ in tables], [s for _, s in tables]
        x = self.kernel.decoder_forward(x, rows.positions, rows.owners, self.arch, layers, rows.keys,
                                        rows.values, cos, sin, rows.slots, rows.parents)
        picked = rows.picked
        if picked and picked == list(range(picked[0], picked[0] + len(picked))):
            return x[picked[0]:picked[0] + len(picked)]  # a view: a list index costs a copy and more
        return x[picked]
