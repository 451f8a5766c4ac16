"""What the engine asks of a model, as ``typing.Protocol`` s: the loop, the batch and the server's
scheduler check these instead of probing for attributes one by one.

- ``Model``: one KV cache the engine extends, crops and resets (every backend, and each
  ``stack.Sequence`` of a model that holds several), and what the model can do, declared by each
  backend: ``row_invariant``, ``tree_attention``, ``context_length`` and ``kernel_level``;
- ``PrefixSharing``: a cache whose prefix can be copied from another sequence of the same model
  (``donors``, ``adopt``), on a row-invariant model;
- ``RestrictedHead``: a model that can compute the logits of some vocabulary rows only
  (``restricted_head``), for TLI's draft, which reads only the intersection's;
- ``MultiSequence``: a model that holds several caches (``new_sequence``) and runs rows of many in one
  ``forward``, as anyspec's GGUF and lean models do (``stack.StackModel``); generations can then
  be batched.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable


@runtime_checkable
class Model(Protocol):
    row_invariant: bool  # a row's numbers do not depend on the rows computed with it
    tree_attention: bool  # forward takes a tree of rows, each attending to its own ancestors
    context_length: int | None  # the most tokens it reads (None: not known)
    kernel_level: int | None  # where its rows run on anyspec's kernels, their instruction level
    #                           (``isa()``: 0 plain, 1 AVX2, 2 AVX-512, 3 AMX); else None

    @property
    def num_cached(self) -> int: ...

    def extend(self, ids: list[int], last: int | None = None): ...

    def crop(self, n: int) -> None: ...

    def reset(self) -> None: ...


@runtime_checkable
class PrefixSharing(Model, Protocol):
    def donors(self) -> list: ...

    def adopt(self, donor, n: int) -> None: ...


@runtime_checkable
class RestrictedHead(Protocol):
    def restricted_head(self, ids): ...


@runtime_checkable
class MultiSequence(Protocol):
    sequences: object  # every live sequence
    kv_bytes_per_token: int  # a cached token's keys and values, in one sequence's cache

    def new_sequence(self): ...

    def forward(self, batch: list[tuple], head=None) -> list: ...  # head: RestrictedHead's, or all rows
