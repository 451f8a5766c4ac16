"""Text as a tokenizer's ids, exactly: the byte-level helpers the draft's context and SLEM share.

A token may end in the middle of a UTF-8 character (byte-fallback tokens), and SentencePiece
tokenizers add a dummy-prefix "▁" to text encoded alone; ``encode_exact`` finds ids whose bytes are
exactly the wanted bytes, or says there are none.
"""

from __future__ import annotations

ANCHOR = "\n"


def incomplete_utf8_tail(data: bytes | bytearray) -> int:
    """Length of an unfinished UTF-8 sequence at the end of ``data`` (0 when it ends cleanly)."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte & 0xC0 == 0x80:  # continuation byte: keep looking for the lead byte
            continue
        need = 2 if byte & 0xE0 == 0xC0 else 3 if byte & 0xF0 == 0xE0 else 4 if byte & 0xF8 == 0xF0 else 1
        return back if need > back else 0
    return 0


def encode_exact(tokenizer, text: str, want: bytes, token_bytes: list[bytes],
                 anchor_ids: list[int]) -> list[int] | None:
    """Ids of ``tokenizer`` whose bytes (``token_bytes``) are exactly ``want``, or None.

    Tries the plain encoding of ``text``, then ``ANCHOR + text`` with the anchor's ids
    (``anchor_ids``, the tokenizer's encoding of ANCHOR) cut off: that drops the dummy-prefix "▁"
    SentencePiece tokenizers add to text encoded alone.
    """
    ids = tokenizer.encode(text, add_special_tokens=False)
    if b"".join(token_bytes[i] for i in ids) == want:
        return ids
    ids = tokenizer.encode(ANCHOR + text, add_special_tokens=False)
    if ids[: len(anchor_ids)] == anchor_ids:
        ids = ids[len(anchor_ids):]
        if b"".join(token_bytes[i] for i in ids) == want:
            return ids
    return None
