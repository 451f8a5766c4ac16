"""The bytes each token id stands for, as a list indexed by id (b"" for special and unused ids).

The engine streams text and re-encodes the draft's context in bytes, so it needs this for the
target even without a draft. When ``anyspec.vocab`` offers its own table it is used instead, so
the engine and the intersection agree on what a token's bytes are.
"""

from __future__ import annotations

import re

_BYTE_PIECE = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


def _byte_level_decoder() -> dict[str, int]:
    """GPT-2's printable stand-ins for raw bytes, inverted: char -> byte."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    chars, n = {}, 0
    for b in range(256):
        if b in keep:
            chars[chr(b)] = b
        else:
            chars[chr(256 + n)] = b
            n += 1
    return chars


def _is_byte_level(tokenizer) -> bool:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return False
    return "ByteLevel" in repr(backend.decoder) or "ByteLevel" in repr(backend.pre_tokenizer)


def token_bytes_table(tokenizer, vocab_size: int | None = None) -> list[bytes]:
    """``table[id]`` = the bytes token ``id`` adds to the text."""
    try:  # the vocab bridge's table, when it has one
        from anyspec.vocab import token_bytes as vocab_token_bytes
    except ImportError:
        vocab_token_bytes = None
    if vocab_token_bytes is not None:
        table = list(vocab_token_bytes(tokenizer))
    else:
        table = _own_table(tokenizer)
    size = max(vocab_size or 0, len(table))
    return table + [b""] * (size - len(table))


def _own_table(tokenizer) -> list[bytes]:
    n = len(tokenizer)
    pieces = tokenizer.convert_ids_to_tokens(list(range(n)))
    special = set(getattr(tokenizer, "all_special_ids", []))
    special |= {i for i, tok in getattr(tokenizer, "added_tokens_decoder", {}).items() if tok.special}
    table: list[bytes] = []
    if _is_byte_level(tokenizer):
        decode = _byte_level_decoder()
        for i, piece in enumerate(pieces):
            if i in special or piece is None:
                table.append(b"")
            elif all(c in decode for c in piece):
                table.append(bytes(decode[c] for c in piece))
            else:  # an added token stored as plain text
                table.append(piece.encode("utf-8"))
        return table
    for i, piece in enumerate(pieces):
        if i in special or piece is None:
            table.append(b"")
        elif m := _BYTE_PIECE.match(piece):
            table.append(bytes([int(m.group(1), 16)]))
        else:
            table.append(piece.replace("▁", " ").encode("utf-8"))
    return table
