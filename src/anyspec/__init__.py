"""anyspec: lossless speculative decoding between models whose tokenizers differ."""

__version__ = "0.1.0"

_ENGINE_EXPORTS = ("generate", "Engine", "SpeculativeConfig", "SamplingParams", "GenerationResult")


def __getattr__(name: str):
    """``anyspec.generate`` and the engine's classes, imported on first use (torch is heavy)."""
    if name in _ENGINE_EXPORTS:
        from anyspec import engine

        return getattr(engine, name)
    raise AttributeError(f"module 'anyspec' has no attribute {name!r}")
