"""anyspec: lossless speculative decoding between models whose tokenizers differ.

``anyspec.generate(prompt, target, draft)`` loads a pair and generates once; ``anyspec.load(target,
draft)`` gives an ``Engine`` that keeps them loaded (``generate``, ``stream``, ``generate_batch``,
``guide``) until its ``close`` (or the end of ``with anyspec.load(...) as engine:``).
``SpeculativeConfig`` holds the pair's settings, ``SamplingParams`` a request's; a
``GenerationResult`` holds the answer and its ``Stats``. Errors a caller can act on are
``anyspec.errors.AnyspecError``s.
"""

from typing import TYPE_CHECKING

__version__ = "0.1.0"

_EXPORTS = {"generate": "anyspec.pair", "load": "anyspec.pair", "Engine": "anyspec.engine",
            "GenerationResult": "anyspec.engine", "Stats": "anyspec.engine.stats",
            "SpeculativeConfig": "anyspec.config", "SamplingParams": "anyspec.config"}
__all__ = ["Engine", "GenerationResult", "SamplingParams", "SpeculativeConfig", "Stats", "generate", "load",
           "__version__"]

if TYPE_CHECKING:  # what static checkers and editors see; at run time __getattr__ imports them
    from anyspec.config import SamplingParams, SpeculativeConfig
    from anyspec.engine import Engine, GenerationResult
    from anyspec.engine.stats import Stats
    from anyspec.pair import generate, load


def __getattr__(name: str):
    """``anyspec.generate``, ``anyspec.load`` and the engine's classes, imported on first use (torch
    is heavy)."""
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'anyspec' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
