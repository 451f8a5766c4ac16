"""The vocabulary bridge: each token as the bytes it stands for, and the draft/target intersection.

Heavy modules (torch, transformers) load on first use, so ``anyspec --help`` stays fast.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "VocabMapping": "anyspec.vocab.mapping",
    "match_tables": "anyspec.vocab.mapping",
    "token_bytes": "anyspec.vocab.bytes",
    "token_table": "anyspec.vocab.bytes",
    "detect_family": "anyspec.vocab.family",
    "detect_space_prefix": "anyspec.vocab.family",
    "TokenTable": "anyspec.vocab.bytes",
    "load_tokenizer": "anyspec.vocab.loading",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'anyspec.vocab' has no attribute {name!r}")
