"""Every token of a tokenizer, mapped to the exact bytes it stands for.

Tokenizers spell bytes differently: byte-level BPE (GPT-2, Qwen, Llama-3, SmolLM2) writes each
byte as a printable stand-in (newline is ``Ċ``, ``é`` is ``Ã©``); SentencePiece writes a space
as ``▁`` and bytes it cannot spell as ``<0x0A>``; WordPiece marks word continuations with
``##``; tiktoken rank files store raw bytes. Comparing token *strings* across families is
therefore wrong in both directions; comparing the bytes each token decodes to is exact.

The family is read from the tokenizer's own pipeline (``vocab/family.py``), never from its name.
"""

from __future__ import annotations

import base64
import json
import re
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import numpy as np

from anyspec.vocab.family import BYTE_LEVEL, METASPACE, WORDPIECE, Family, backend_of, detect_family

END_OF_TURN_MARKERS = ("<|im_end|>", "<end_of_turn>", "<|eot_id|>", "<|eom_id|>", "<|end|>",
                       "<|endoftext|>", "<|end_of_text|>")
_BYTE_FALLBACK = re.compile(r"<0x([0-9A-Fa-f]{2})>")
# Added tokens that hold a reserved slot even when the tokenizer does not flag them special.
_PLACEHOLDER = re.compile(r"<\|[^|\s]*\|>|<unused\d+>|\[(?:PAD|pad|unused|UNUSED)\d+\]|<SPECIAL_\d+>"
                          r"|<extra_id_\d+>|<pad_?\d*>")


@cache
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's table: each byte value to the printable character byte-level BPE writes for it."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


@cache
def _byte_level_decode_table() -> dict[int, int]:
    return {ord(ch): b for b, ch in bytes_to_unicode().items()}


@dataclass(frozen=True, eq=False)
class TokenTable:
    """One tokenizer's vocabulary as bytes: token ``i`` is ``blob[offsets[i]:offsets[i + 1]]``.

    ``present`` is False for ids the tokenizer has no token for; ``special`` marks BOS, EOS, PAD,
    chat markers and unused slots, which never join the intersection; ``fallback`` marks
    SentencePiece byte pieces (``<0x41>``), which stand in for a byte the model spells otherwise.
    Indexing past the end gives ``b""`` (padded embedding rows stand for no text).
    """

    blob: bytes
    offsets: np.ndarray
    present: np.ndarray
    special: np.ndarray
    fallback: np.ndarray
    _pieces: list = field(default=None, repr=False, compare=False)

    def __len__(self) -> int:
        return len(self.present)

    def __getitem__(self, token_id: int) -> bytes:
        token_id = int(token_id)
        if token_id < 0:
            raise IndexError(f"token id {token_id} is negative")
        if token_id >= len(self.present):
            return b""
        return self.blob[self.offsets[token_id]:self.offsets[token_id + 1]]

    @property
    def pieces(self) -> list[bytes]:
        """Every id's bytes as a list (b"" where absent), built once."""
        if self._pieces is None:
            blob, off = self.blob, self.offsets.tolist()
            object.__setattr__(self, "_pieces", [blob[a:b] for a, b in zip(off[:-1], off[1:], strict=True)])
        return self._pieces

    def as_list(self) -> list[bytes | None]:
        return [p if ok else None for p, ok in zip(self.pieces, self.present.tolist(), strict=True)]

    @classmethod
    def from_list(cls, pieces: list[bytes | None], special: np.ndarray | None = None,
                  fallback: np.ndarray | None = None) -> TokenTable:
        n = len(pieces)
        present = np.fromiter((p is not None for p in pieces), dtype=bool, count=n)
        filled = [p if p is not None else b"" for p in pieces]
        offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(np.fromiter(map(len, filled), dtype=np.int64, count=n), out=offsets[1:])
        special = np.zeros(n, dtype=bool) if special is None else np.asarray(special, dtype=bool)
        fallback = np.zeros(n, dtype=bool) if fallback is None else np.asarray(fallback, dtype=bool)
        return cls(b"".join(filled), offsets, present, special, fallback, filled)


def token_strings(tokenizer: Any) -> list[str | None]:
    """Every id's token string, in id order (None where an id has no token)."""
    backend = backend_of(tokenizer)
    if backend is not None:
        n = backend.get_vocab_size(with_added_tokens=True)
        return list(map(backend.id_to_token, range(n)))
    vocab = tokenizer.get_vocab()
    strings: list[str | None] = [None] * (max(vocab.values(), default=-1) + 1)
    for piece, idx in vocab.items():
        strings[idx] = piece
    return strings


def special_ids(tokenizer: Any, n: int) -> np.ndarray:
    """Mask of special and control ids: added tokens flagged special or holding a reserved slot
    (``<|...|>``, ``<unusedN>``, ``[PADN]``, ...), plus the tokenizer's own special ids."""
    special = np.zeros(n, dtype=bool)
    backend = backend_of(tokenizer)
    if backend is not None:
        for idx, added in backend.get_added_tokens_decoder().items():
            if (added.special or _PLACEHOLDER.fullmatch(added.content)) and 0 <= idx < n:
                special[idx] = True
    for idx in getattr(tokenizer, "all_special_ids", None) or []:
        if idx is not None and 0 <= idx < n:
            special[idx] = True
    return special


def strings_to_bytes(strings: list[str | None], family: Family,
                     byte_pieces: dict[int, int] | None = None) -> list[bytes | None]:
    """Decode each token string to bytes the way the family's decoder does, one token at a time.

    This is the reference the array path of :func:`token_table` is checked against.
    ``byte_pieces`` maps the ids of ``<0xNN>`` pieces to their byte (found by scanning when None).
    """
    if family.kind == BYTE_LEVEL:
        table, foreign = _byte_level_decode_table(), _not_byte_level()
        return [None if s is None else s.encode("utf-8", "surrogatepass") if foreign.search(s)
                else s.translate(table).encode("latin-1") for s in strings]
    if family.kind == METASPACE:
        space = family.space
        out = [None if s is None else (s.replace(space, " ") if space else s).encode("utf-8", "surrogatepass")
               for s in strings]
        if family.byte_fallback:
            if byte_pieces is None:
                byte_pieces = _scan_byte_pieces(strings)
            for idx, value in byte_pieces.items():
                out[idx] = bytes([value])
        return out
    if family.kind == WORDPIECE:
        prefix = family.continuing_prefix or "##"
        cut = len(prefix)
        return [None if s is None else (s[cut:] if s.startswith(prefix) and len(s) > cut else s)
                .encode("utf-8", "surrogatepass") for s in strings]
    suffix = family.word_suffix
    if suffix:
        return [None if s is None else (s[:-len(suffix)] + " " if s.endswith(suffix) else s)
                .encode("utf-8", "surrogatepass") for s in strings]
    return [None if s is None else s.encode("utf-8", "surrogatepass") for s in strings]


@cache
def _not_byte_level() -> re.Pattern:
    """A character byte-level BPE does not use: its decoder then passes the token through as UTF-8."""
    return re.compile("[^" + re.escape("".join(sorted(bytes_to_unicode().values()))) + "]")


@cache
def _byte_level_lut() -> np.ndarray:
    """Code point -> byte for byte-level characters, −1 for any other code point below the cap."""
    top = max(map(ord, bytes_to_unicode().values())) + 2
    lut = np.full(top, -1, dtype=np.int16)
    for b, ch in bytes_to_unicode().items():
        lut[ord(ch)] = b
    return lut


def _code_points(text: str) -> np.ndarray:
    return np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)


def _cumulative(lengths: np.ndarray) -> np.ndarray:
    out = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=out[1:])
    return out


def _splice(blob: bytes, offsets: np.ndarray, replace: dict[int, bytes]) -> tuple[bytes, np.ndarray]:
    """Replace the bytes of a few tokens in a (blob, offsets) vocabulary."""
    if not replace:
        return blob, offsets
    lengths = np.diff(offsets)
    off = offsets.tolist()
    parts, prev = [], 0
    for idx in sorted(replace):
        parts += [blob[prev:off[idx]], replace[idx]]
        prev = off[idx + 1]
        lengths[idx] = len(replace[idx])
    parts.append(blob[prev:])
    return b"".join(parts), _cumulative(lengths)


def _array_bytes(strings: list[str], family: Family, byte_pieces: dict[int, int]) -> tuple[bytes, np.ndarray]:
    """(blob, offsets) for a byte-level or SentencePiece vocabulary, with C-level string and array ops.

    The whole vocabulary is joined into one string; code points give per-token byte lengths.
    """
    char_offsets = _cumulative(np.fromiter(map(len, strings), dtype=np.int64, count=len(strings)))
    joined = "".join(strings)
    if family.kind == BYTE_LEVEL:
        lut = _byte_level_lut()
        codes = _code_points(joined)
        mapped = lut[np.minimum(codes, len(lut) - 1)]
        foreign = _cumulative(mapped < 0)
        outside = np.flatnonzero(foreign[char_offsets[1:]] > foreign[char_offsets[:-1]])
        blob = np.where(mapped < 0, 0, mapped).astype(np.uint8).tobytes()
        replace = {i: strings[i].encode("utf-8", "surrogatepass") for i in outside.tolist()}
        return _splice(blob, char_offsets, replace)
    if family.space:
        joined = joined.replace(family.space, " ")
    codes = _code_points(joined)
    utf8_len = 1 + (codes >= 0x80).astype(np.int64) + (codes >= 0x800) + (codes >= 0x10000)
    offsets = _cumulative(utf8_len)[char_offsets]
    blob = joined.encode("utf-8", "surrogatepass")
    return _splice(blob, offsets, {i: bytes([v]) for i, v in byte_pieces.items()})


def _scan_byte_pieces(strings: list[str | None]) -> dict[int, int]:
    found = {}
    for idx, s in enumerate(strings):
        if s is not None and len(s) == 6 and s[:3] == "<0x" and (m := _BYTE_FALLBACK.fullmatch(s)):
            found[idx] = int(m.group(1), 16)
    return found


def byte_piece_ids(tokenizer: Any, strings: list[str | None] | None = None) -> dict[int, int]:
    """Ids of SentencePiece byte pieces ``<0xNN>`` mapped to their byte value."""
    backend = backend_of(tokenizer)
    if backend is None:
        return _scan_byte_pieces(strings if strings is not None else token_strings(tokenizer))
    found = {}
    for value in range(256):
        for spelled in (f"<0x{value:02X}>", f"<0x{value:02x}>"):
            idx = backend.token_to_id(spelled)
            if idx is not None:
                found[idx] = value
    return found


def token_table(tokenizer: Any, family: Family | None = None) -> TokenTable:
    """The bytes every token of ``tokenizer`` stands for, plus which ids are special."""
    family = family or detect_family(tokenizer)
    strings = token_strings(tokenizer)
    n = len(strings)
    pieces_of_bytes = byte_piece_ids(tokenizer, strings) if family.byte_fallback else {}
    fallback = np.zeros(n, dtype=bool)
    fallback[[i for i in pieces_of_bytes if i < n]] = True
    special = special_ids(tokenizer, n)
    single_char_space = family.space is None or len(family.space) == 1
    if family.kind not in (BYTE_LEVEL, METASPACE) or not single_char_space:
        return TokenTable.from_list(strings_to_bytes(strings, family, pieces_of_bytes), special, fallback)
    present = np.ones(n, dtype=bool)
    if None in strings:
        present = np.fromiter((s is not None for s in strings), dtype=bool, count=n)
        strings = [s if s is not None else "" for s in strings]
    blob, offsets = _array_bytes(strings, family, pieces_of_bytes)
    return TokenTable(blob, offsets, present, special, fallback)


def token_bytes(tokenizer: Any) -> list[bytes | None]:
    """The bytes each token id stands for, in id order (None where an id has no token)."""
    return token_table(tokenizer).as_list()


def tiktoken_ranks(path) -> list[bytes]:
    """Raw token bytes in rank order from a tiktoken-style file (``.tiktoken`` or tekken JSON)."""
    with open(path, "rb") as fh:
        head = fh.read(1)
        fh.seek(0)
        if head == b"{":
            data = json.load(fh)
            ranked = sorted(data["vocab"], key=lambda v: v["rank"])
            return [base64.b64decode(v["token_bytes"]) for v in ranked]
        pairs = []
        for line in fh:
            if line.strip():
                token, rank = line.split()
                pairs.append((int(rank), base64.b64decode(token)))
    pairs.sort()
    return [token for _, token in pairs]


def eos_ids(tokenizer: Any) -> tuple[int, ...]:
    """The tokenizer's EOS id plus end-of-turn markers it has as special tokens."""
    found: list[int] = []
    eos = getattr(tokenizer, "eos_token_id", None)
    if isinstance(eos, int):
        found.append(eos)
    elif isinstance(eos, (list, tuple)):
        found.extend(int(e) for e in eos)
    backend = backend_of(tokenizer)
    if backend is not None:
        found.extend(i for i in map(backend.token_to_id, END_OF_TURN_MARKERS) if i is not None)
    else:
        vocab = tokenizer.get_vocab()
        found.extend(vocab[m] for m in END_OF_TURN_MARKERS if m in vocab)
    return tuple(sorted(set(found)))
