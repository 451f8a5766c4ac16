"""Which way a tokenizer spells bytes, read from its own pipeline (model, decoder, pre-tokenizer,
normalizer), never from its name. A tokenizer without a ``tokenizers`` backend falls back to
:func:`detect_space_prefix`, a string-level probe.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

BYTE_LEVEL = "byte-level"
METASPACE = "metaspace"
WORDPIECE = "wordpiece"
PLAIN = "plain"


@dataclass(frozen=True)
class Family:
    """How a tokenizer spells bytes: ``kind`` plus the markers its decoder undoes."""

    kind: str
    space: str | None = None
    byte_fallback: bool = False
    continuing_prefix: str | None = None
    word_suffix: str | None = None


def backend_of(tokenizer: Any):
    """The ``tokenizers.Tokenizer`` behind an HF tokenizer, or None for a slow tokenizer."""
    if hasattr(tokenizer, "id_to_token") and hasattr(tokenizer, "get_added_tokens_decoder"):
        return tokenizer
    return getattr(tokenizer, "backend_tokenizer", None)


def _components(part: Any) -> list[dict]:
    """The component and every component nested in it (Sequence), as their JSON dicts."""
    if part is None:
        return []
    state = json.loads(part.__getstate__())
    found: list[dict] = []
    stack = [state]
    while stack:
        node = stack.pop()
        if not isinstance(node, dict):
            continue
        found.append(node)
        for key in ("decoders", "pretokenizers", "normalizers"):
            stack.extend(reversed(node.get(key) or []))
    return found


def detect_family(tokenizer: Any) -> Family:
    """Which spelling the tokenizer uses, read from its model, decoder, pre-tokenizer, normalizer."""
    backend = backend_of(tokenizer)
    if backend is None:
        return _family_from_probe(tokenizer)
    model_type = type(backend.model).__name__
    decoder = _components(backend.decoder)
    pre = _components(backend.pre_tokenizer)
    norm = _components(backend.normalizer)
    types = {c.get("type") for c in decoder + pre}
    byte_fallback = bool(getattr(backend.model, "byte_fallback", False)) or any(
        c.get("type") == "ByteFallback" for c in decoder)
    if "ByteLevel" in types:
        return Family(BYTE_LEVEL)
    if model_type == "WordPiece" or any(c.get("type") == "WordPiece" for c in decoder):
        prefix = next((c.get("prefix") for c in decoder if c.get("type") == "WordPiece"), None)
        if prefix is None:
            prefix = getattr(backend.model, "continuing_subword_prefix", None) or "##"
        return Family(WORDPIECE, continuing_prefix=prefix)
    space = _metaspace_marker(decoder + pre + norm)
    if space is not None or byte_fallback:
        return Family(METASPACE, space=space, byte_fallback=byte_fallback)
    suffix = next((c.get("suffix") for c in decoder if c.get("type") == "BPEDecoder"), None)
    if suffix is None:
        suffix = getattr(backend.model, "end_of_word_suffix", None)
    return Family(PLAIN, word_suffix=suffix or None)


def _metaspace_marker(components: list[dict]) -> str | None:
    for c in components:
        kind = c.get("type")
        if kind == "Metaspace":
            return c.get("replacement") or "▁"
        if kind == "Replace":
            pattern = (c.get("pattern") or {}).get("String")
            if c.get("content") == " " and pattern:
                return pattern
            if pattern == " " and c.get("content"):
                return c["content"]
        if kind == "Prepend" and c.get("prepend"):
            return c["prepend"]
    return None


def detect_space_prefix(tokenizer: Any) -> tuple[str, ...]:
    """The marker(s) a tokenizer writes for a leading space, probed by encoding ``" a"``.

    This is the seed's string-level heuristic, kept as the fallback for tokenizers without a
    ``tokenizers`` backend and for the string-matching comparison in ``anyspec analyze``.
    Returns ``("Ġ", "▁")`` when the probe is inconclusive; never raises.
    """
    try:
        ids = tokenizer.encode(" a", add_special_tokens=False)
        pieces = [p for p in tokenizer.convert_ids_to_tokens(list(ids)) if p]
    except Exception:
        pieces = []
    for piece in pieces:
        marker = piece[:-1] if piece.endswith("a") else piece
        if marker in ("Ġ", "▁"):
            return (marker,)
    return ("Ġ", "▁")


def _family_from_probe(tokenizer: Any) -> Family:
    markers = detect_space_prefix(tokenizer)
    if markers == ("Ġ",):
        return Family(BYTE_LEVEL)
    return Family(METASPACE, space="▁", byte_fallback=True)
