"""anyspec: lossless speculative decoding between models whose tokenizers differ."""

__version__ = "0.1.0"
