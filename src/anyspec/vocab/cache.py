"""On-disk cache of built vocabulary mappings, under ``cache_dir()/vocab/``.

The key is a content fingerprint of both tokenizers plus :data:`MAPPING_VERSION`. Reading a
whole 262k vocabulary out of a tokenizer costs about as much as building the mapping (it is one
Python call per token), so the fingerprint hashes the parts that are cheap to read and decide
the result: the pipeline (model type, decoder, pre-tokenizer, normalizer), the vocabulary size,
every added token with its special flag, the special and EOS ids, the token strings at a stride
through the whole vocabulary, and the path, size and mtime of the file the tokenizer came from
(when it came from one). On a hit, :func:`verify_sample` re-decodes a further random spread of
ids and compares them with the cached bytes. A tokenizer built in memory that differs from a
cached one only in a few ordinary tokens between the samples could still be served the cached
mapping; pass ``cache=False`` to ``VocabMapping`` for such tokenizers.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from anyspec.paths import cache_dir
from anyspec.vocab.bytes import TokenTable, byte_piece_ids, strings_to_bytes
from anyspec.vocab.family import backend_of, detect_family

MAPPING_VERSION = "tli-bytes-1"
_STRIDE = 64
_VERIFY = 1024


def vocab_cache_dir() -> Path:
    path = cache_dir() / "vocab"
    path.mkdir(parents=True, exist_ok=True)
    return path


def fingerprint(tokenizer: Any) -> str:
    """A content hash of a tokenizer's vocabulary that is cheap to compute (see module doc)."""
    h = hashlib.sha256()
    backend = backend_of(tokenizer)
    if backend is None:
        items = sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])
        h.update(repr(items).encode())
        h.update(repr(sorted(getattr(tokenizer, "all_special_ids", []) or [])).encode())
        h.update(repr(getattr(tokenizer, "eos_token_id", None)).encode())
        return h.hexdigest()
    n = backend.get_vocab_size(with_added_tokens=True)
    model = backend.model
    h.update(repr((type(model).__name__, n, getattr(model, "byte_fallback", None),
                   getattr(model, "unk_token", None), getattr(model, "continuing_subword_prefix", None),
                   getattr(model, "end_of_word_suffix", None))).encode())
    for part in (backend.decoder, backend.pre_tokenizer, backend.normalizer):
        h.update(part.__getstate__() if part is not None else b"-")
        h.update(b"\x00")
    added = backend.get_added_tokens_decoder()
    ids = sorted(added)
    h.update(np.array(ids, dtype=np.int64).tobytes())
    h.update(bytes(added[i].special for i in ids))
    h.update("\x00".join(added[i].content for i in ids).encode("utf-8", "surrogatepass"))
    h.update(repr((sorted(getattr(tokenizer, "all_special_ids", []) or []),
                   getattr(tokenizer, "eos_token_id", None),
                   getattr(tokenizer, "unk_token_id", None))).encode())
    h.update(_source_stamp(tokenizer).encode())
    sample = [*range(0, n, _STRIDE), *range(max(0, n - 512), n)]
    h.update("\x00".join(map(str, map(backend.id_to_token, sample))).encode("utf-8", "surrogatepass"))
    return h.hexdigest()


def _source_stamp(tokenizer: Any) -> str:
    """Path, size and mtime of the file the tokenizer was loaded from, when there is one.

    Two tokenizers that agree on every sampled token but came from different (or since edited)
    files then get different keys; a miss only costs a rebuild.
    """
    kwargs = getattr(tokenizer, "init_kwargs", None) or {}
    folder = Path(str(getattr(tokenizer, "name_or_path", "") or "."))
    candidates = [kwargs.get("tokenizer_file"), folder / "tokenizer.json", folder / "tokenizer.model",
                  kwargs.get("vocab_file")]
    for candidate in candidates:
        if not candidate:
            continue
        try:
            path = Path(candidate)
            if path.is_file():
                st = path.stat()
                return f"{path.resolve()}:{st.st_size}:{st.st_mtime_ns}"
        except (OSError, TypeError, ValueError):
            continue
    return "-"


def mapping_key(target: Any, draft: Any, target_vocab_size: int, draft_vocab_size: int) -> str:
    h = hashlib.sha256(MAPPING_VERSION.encode())
    h.update(fingerprint(target).encode())
    h.update(fingerprint(draft).encode())
    h.update(f"{target_vocab_size}:{draft_vocab_size}".encode())
    return h.hexdigest()


def _table_arrays(prefix: str, table: TokenTable) -> dict[str, np.ndarray]:
    return {f"{prefix}_blob": np.frombuffer(table.blob, dtype=np.uint8), f"{prefix}_offsets": table.offsets,
            f"{prefix}_present": table.present, f"{prefix}_special": table.special,
            f"{prefix}_fallback": table.fallback}


def _table_from(prefix: str, arrays: dict[str, np.ndarray]) -> TokenTable:
    return TokenTable(arrays[f"{prefix}_blob"].tobytes(), arrays[f"{prefix}_offsets"],
                      arrays[f"{prefix}_present"], arrays[f"{prefix}_special"], arrays[f"{prefix}_fallback"])


_MAGIC = b"ANYSPEC-VOCAB\n"


def _write_arrays(fh, arrays: dict[str, np.ndarray]) -> None:
    """A JSON header line (name, dtype, shape, byte offset) followed by the raw array bytes."""
    header, offset = [], 0
    for name, array in arrays.items():
        array = np.ascontiguousarray(array)
        header.append([name, array.dtype.str, list(array.shape), offset])
        offset += array.nbytes
    fh.write(_MAGIC + json.dumps(header).encode() + b"\n")
    for array in arrays.values():
        fh.write(np.ascontiguousarray(array).data)


def _read_arrays(data: bytes) -> dict[str, np.ndarray]:
    if not data.startswith(_MAGIC):
        raise ValueError("not an anyspec vocabulary cache file")
    end = data.index(b"\n", len(_MAGIC))
    base = end + 1
    arrays = {}
    for name, dtype, shape, offset in json.loads(data[len(_MAGIC):end]):
        dt = np.dtype(dtype)
        count = int(np.prod(shape)) if shape else 1
        arrays[name] = np.frombuffer(data, dtype=dt, count=count, offset=base + offset).reshape(shape)
    return arrays


def save(key: str, target: TokenTable, draft: TokenTable, draft_to_target: np.ndarray,
         target_to_draft: np.ndarray) -> Path:
    """Write one built mapping atomically (temporary file in the same folder, then rename)."""
    folder = vocab_cache_dir()
    out = folder / f"{key}.bin"
    arrays = {**_table_arrays("target", target), **_table_arrays("draft", draft),
              "draft_to_target": draft_to_target, "target_to_draft": target_to_draft}
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".partial-", suffix=".bin")
    try:
        with os.fdopen(fd, "wb") as fh:
            _write_arrays(fh, arrays)
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return out


def load(key: str) -> tuple[TokenTable, TokenTable, np.ndarray, np.ndarray] | None:
    """The cached mapping for ``key``, or None when absent or unreadable."""
    path = vocab_cache_dir() / f"{key}.bin"
    try:
        arrays = _read_arrays(path.read_bytes())
        return (_table_from("target", arrays), _table_from("draft", arrays),
                arrays["draft_to_target"].copy(), arrays["target_to_draft"].copy())
    except (OSError, ValueError, KeyError, TypeError):
        return None


def verify_sample(tokenizer: Any, table: TokenTable, salt: int = 0) -> bool:
    """Whether a spread of ids (off the fingerprint's stride) decode to the cached bytes."""
    backend = backend_of(tokenizer)
    if backend is None:
        return True
    n = len(table)
    rng = np.random.default_rng(n + salt)
    ids = np.unique(rng.integers(0, n, size=min(_VERIFY, n))).tolist()
    strings = [backend.id_to_token(i) for i in ids]
    family = detect_family(tokenizer)
    byte_pieces = {}
    if family.byte_fallback:
        of_id = byte_piece_ids(tokenizer)
        byte_pieces = {k: of_id[i] for k, i in enumerate(ids) if i in of_id}
    fresh = strings_to_bytes(strings, family, byte_pieces)
    blob, off = table.blob, table.offsets
    return all((f is None and not table.present[i]) or (f is not None and table.present[i]
               and f == blob[off[i]:off[i + 1]]) for i, f in zip(ids, fresh, strict=True))
