"""anyspec: lossless speculative decoding between models whose tokenizers differ."""

__version__ = "0.1.0"

_EXPORTS = {"generate": "anyspec.pair", "load": "anyspec.pair", "Engine": "anyspec.engine",
            "GenerationResult": "anyspec.engine", "SpeculativeConfig": "anyspec.config",
            "SamplingParams": "anyspec.config"}


def __getattr__(name: str):
    """``anyspec.generate``, ``anyspec.load`` and the engine's classes, imported on first use (torch
    is heavy)."""
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'anyspec' has no attribute {name!r}")
