"""The bytes each token id adds to the generated text, as a list indexed by id.

Built on the vocabulary bridge's token table, so the engine and the intersection agree on what a
token's bytes are. Special tokens (BOS, EOS, chat markers) add no text: b"". Padded embedding
rows past the tokenizer's end add none either.
"""

from __future__ import annotations


def text_bytes_table(table, vocab_size: int) -> list[bytes]:
    """``out[id]`` for a ``TokenTable``: its bytes, b"" for special, absent and padded ids."""
    special = table.special.tolist()
    present = table.present.tolist()
    out = [b"" if s or not ok else p for p, s, ok in zip(table.pieces, special, present, strict=True)]
    return out[:vocab_size] + [b""] * (vocab_size - len(out))


def token_bytes_table(tokenizer, vocab_size: int) -> list[bytes]:
    from anyspec.vocab import token_table

    return text_bytes_table(token_table(tokenizer), vocab_size)
