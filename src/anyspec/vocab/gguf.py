"""GGUF files' tokenizers: the key/value metadata read directly, and a Hugging Face tokenizer built
from it, by transformers where it reads the architecture, else from the metadata alone."""

from __future__ import annotations

import mmap
import re
import struct
from pathlib import Path
from typing import Any

import numpy as np

from anyspec.errors import ConfigError

_INSTEAD = "give the model's tokenizer folder or tokenizer.json instead"


def is_gguf_file(p: Path) -> bool:
    """A file named ``.gguf`` (in any case), or one that begins with GGUF's magic number."""
    if p.name.lower().endswith(".gguf"):
        return True
    try:
        with open(p, "rb") as fh:
            return fh.read(4) == b"GGUF"
    except OSError:
        return False


def gguf_metadata(p: Path) -> dict[str, Any]:
    """``read_gguf_metadata``, with a one-line ConfigError that says where a file is cut short."""
    try:
        return read_gguf_metadata(p)
    except (OSError, ValueError, struct.error, UnicodeDecodeError) as exc:
        raise ConfigError(f"{p} is not a readable GGUF file ({exc})") from None


def tokenizer_from_gguf(p: Path) -> tuple[Any, str | None]:
    """The Hugging Face tokenizer of a GGUF file (transformers' where it reads the architecture, else
    one built from the metadata alone), and a note where it cannot split text as the model's own."""
    from transformers import AutoTokenizer

    fields = gguf_metadata(p)
    if "tokenizer.ggml.tokens" not in fields:
        raise ConfigError(f"{p} is a GGUF file without a tokenizer (no tokenizer.ggml.tokens); {_INSTEAD}")
    kind = fields.get("tokenizer.ggml.model")
    if kind == "bert":
        return _wordpiece_from_gguf(fields), None
    if _transformers_reads(fields):
        try:
            tokenizer = AutoTokenizer.from_pretrained(p.parent, gguf_file=p.name, trust_remote_code=False)
            if kind == "gpt2":  # transformers splits a kind outside its table as GPT-2's
                pre = fields.get("tokenizer.ggml.pre")
                return tokenizer, _split_as(tokenizer.backend_tokenizer, pre)
            return tokenizer, None
        except Exception:
            if kind not in _METADATA_KINDS:
                raise
    if kind not in _METADATA_KINDS:
        raise ConfigError(f"{p} has a {kind!r} tokenizer, which anyspec cannot read; {_INSTEAD}")
    return _bpe_from_gguf(fields)


_METADATA_KINDS = ("gpt2", "llama", "gemma4")


def _transformers_reads(fields) -> bool:
    """Whether transformers supports this GGUF's architecture (it refuses the file otherwise)."""
    try:
        from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES
    except ImportError:
        return True
    arch = str(fields.get("general.architecture", ""))
    return arch in GGUF_SUPPORTED_ARCHITECTURES or arch.replace("-", "_") in GGUF_SUPPORTED_ARCHITECTURES


def _bpe_from_gguf(fields) -> tuple[Any, str | None]:
    """A tokenizer from GGUF metadata alone, for architectures transformers does not load.

    Token ids, token strings, merges and special tokens are exactly the file's, so every token's
    bytes are right. Byte-level ("gpt2") vocabularies split text as the file's pre-tokenizer kind
    says (``_split_as``); SentencePiece-style ones use merges when the file has them, else the scores
    (Unigram). With it comes ``_split_as``'s note (None: the split is the file's own kind's).
    """
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers
    from transformers import PreTrainedTokenizerFast

    value = fields.get
    note = None
    tokens = value("tokenizer.ggml.tokens")
    types = value("tokenizer.ggml.token_type") or [1] * len(tokens)
    merges = [tuple(m.split(" ", 1)) for m in value("tokenizer.ggml.merges") or []]
    unk_id = value("tokenizer.ggml.unknown_token_id")
    unk = tokens[int(unk_id)] if unk_id is not None else None
    vocab = {t: i for i, t in enumerate(tokens)}
    if value("tokenizer.ggml.model") == "gpt2":
        backend = Tokenizer(models.BPE(vocab, merges, unk_token=unk, ignore_merges=True))
        note = _split_as(backend, value("tokenizer.ggml.pre"))
        backend.decoder = decoders.ByteLevel()
    else:
        if merges:
            model = models.BPE(vocab, merges, unk_token=unk, byte_fallback=True)
        else:
            scores = value("tokenizer.ggml.scores") or [0.0] * len(tokens)
            model = models.Unigram(list(zip(tokens, map(float, scores), strict=True)), int(unk_id or 0), True)
        backend = Tokenizer(model)
        llama = value("tokenizer.ggml.model") == "llama"
        space_prefix = bool(value("tokenizer.ggml.add_space_prefix", llama))
        steps = [normalizers.Prepend("\u2581")] if space_prefix else []
        backend.normalizer = normalizers.Sequence([*steps, normalizers.Replace(" ", "\u2581")])
        strip = [decoders.Strip(" ", 1, 0)] if space_prefix else []
        backend.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(),
                                             decoders.Fuse(), *strip])
    backend.add_tokens([AddedToken(tokens[i], special=False, normalized=False)
                        for i, kind in enumerate(types) if kind == 4])
    backend.add_special_tokens([AddedToken(tokens[i], special=True, normalized=False)
                                for i, kind in enumerate(types) if kind in (2, 3, 5)])
    named = {}
    for name, key in (("bos_token", "bos"), ("eos_token", "eos"), ("unk_token", "unknown"),
                      ("pad_token", "padding")):
        idx = value(f"tokenizer.ggml.{key}_token_id")
        if idx is not None and int(idx) < len(tokens):
            named[name] = tokens[int(idx)]
    return PreTrainedTokenizerFast(tokenizer_object=backend, **named), note


# ``tokenizer.ggml.pre`` kinds that transformers' table leaves out: llama.cpp splits these by GPT-2's
# regex, and the second kind first splits off each digit alone
GPT2_SPLITS = (None, "gpt-2", "gpt2", "phi-2", "mpt", "olmo", "jais", "trillion", "granite-docling")
DIGIT_SPLITS = ("smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva-7b")


def _split_regex(pre: str | None) -> str | None:
    """The regex that splits text before a byte-level BPE of pre-tokenizer ``pre`` (a GGUF's
    ``tokenizer.ggml.pre``) merges it, from transformers' table of them; None: not in that table
    (``GPT2_SPLITS``, ``DIGIT_SPLITS``, else GPT-2's: ``_split_as``)."""
    try:
        from transformers.integrations.gguf.gguf_tokenizer_mapping import GGUF_PRE_TOKENIZER_SPLITS
    except ImportError:
        return None
    return GGUF_PRE_TOKENIZER_SPLITS.get(pre)


def _split_as(backend, pre: str | None) -> str | None:
    """Make ``backend`` (a byte-level BPE's ``tokenizers.Tokenizer``) split text before its merges as
    a GGUF's pre-tokenizer kind ``pre`` does; where no table names the kind, it splits as GPT-2's
    and the note returned says so."""
    from tokenizers import Regex, pre_tokenizers

    split = _split_regex(pre)
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=split is None)
    if split is not None:
        backend.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(split), behavior="isolated"), byte_level])
    elif pre in DIGIT_SPLITS:
        backend.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True), byte_level])
    else:
        backend.pre_tokenizer = byte_level
    if split is None and pre not in GPT2_SPLITS + DIGIT_SPLITS:
        return (f"the GGUF's pre-tokenizer {pre!r} is not one anyspec knows; its text is split as GPT-2's, "
                "so some prompts may be tokenized otherwise than by the model's own tokenizer")
    return None


def _wordpiece_from_gguf(fields) -> Any:
    """A BERT WordPiece tokenizer from GGUF metadata (transformers cannot load these)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    tokens = fields["tokenizer.ggml.tokens"]
    types = fields.get("tokenizer.ggml.token_type", [])

    def token_at(key: str) -> str | None:
        return tokens[int(fields[key])] if key in fields else None

    control = {i for i, kind in enumerate(types) if kind in (2, 3, 5)}
    control |= {i for i, t in enumerate(tokens) if re.fullmatch(r"\[unused\d+\]", t)}
    # llama.cpp stores word-initial pieces as "▁word" and continuations bare; WordPiece wants
    # "word" and "##piece".
    tokens = [t if i in control else t[1:] if t.startswith("\u2581") else "##" + t
              for i, t in enumerate(tokens)]
    unk = token_at("tokenizer.ggml.unknown_token_id") or "[UNK]"
    backend = Tokenizer(models.WordPiece({t: i for i, t in enumerate(tokens)}, unk_token=unk,
                                         continuing_subword_prefix="##"))
    backend.normalizer = normalizers.BertNormalizer(lowercase=True)
    backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    backend.decoder = decoders.WordPiece(prefix="##")
    backend.add_special_tokens([AddedToken(tokens[i], special=True, normalized=False)
                                for i in sorted(control)])
    cls, sep = token_at("tokenizer.ggml.cls_token_id"), token_at("tokenizer.ggml.seperator_token_id")
    if cls and sep:
        backend.post_processor = processors.BertProcessing((sep, tokens.index(sep)), (cls, tokens.index(cls)))
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token=unk, cls_token=cls, sep_token=sep,
                 pad_token=token_at("tokenizer.ggml.padding_token_id"),
                 mask_token=token_at("tokenizer.ggml.mask_token_id"))


_GGUF_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q",
                 12: "<d"}
_GGUF_ARRAYS = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "?", 10: "<u8",
                11: "<i8", 12: "<f8"}


def read_gguf_metadata(path: Path) -> dict[str, Any]:
    """The key/value metadata of a GGUF file (v2 or v3), without its tensors.

    ``gguf.GGUFReader`` builds a numpy view per array element and takes about a minute on a
    256k-token vocabulary; reading the few keys a tokenizer needs directly takes well under a second.
    """
    if path.stat().st_size == 0:
        raise ValueError("the file is empty")
    with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        if buf[:4] != b"GGUF":
            raise ValueError("it does not start with GGUF's magic number")
        try:
            version, _, n_kv = struct.unpack_from("<IQQ", buf, 4)
            if version > 0xFFFF and not version & 0xFFFF:
                raise ValueError("it is a big-endian GGUF, which anyspec does not read; convert it with "
                                 "gguf-py's gguf_convert_endian.py to little-endian")
            if version < 2:
                raise ValueError(f"GGUF version {version} is too old")
            pos, out = 24, {}
            for _ in range(n_kv):
                key, pos = _gguf_string(buf, pos)
                (kind,), pos = struct.unpack_from("<I", buf, pos), pos + 4
                out[key], pos = _gguf_value(buf, pos, kind)
        except struct.error:
            raise ValueError(f"it ends after {len(buf):,} bytes, inside its metadata: the file is cut "
                             "short (an interrupted download or copy?)") from None
        return out


def _gguf_string(buf, pos: int) -> tuple[str, int]:
    (n,) = struct.unpack_from("<Q", buf, pos)
    if pos + 8 + n > len(buf):
        raise struct.error("a string past the end of the file")
    raw = buf[pos + 8:pos + 8 + n]
    try:
        return raw.decode("utf-8"), pos + 8 + n
    except UnicodeDecodeError:
        return raw.decode("utf-8", "surrogateescape"), pos + 8 + n


def _gguf_value(buf, pos: int, kind: int) -> tuple[Any, int]:
    if kind in _GGUF_SCALARS:
        fmt = _GGUF_SCALARS[kind]
        return struct.unpack_from(fmt, buf, pos)[0], pos + struct.calcsize(fmt)
    if kind == 8:
        return _gguf_string(buf, pos)
    if kind != 9:
        raise ValueError(f"unknown GGUF value type {kind}")
    item, count = struct.unpack_from("<IQ", buf, pos)
    pos += 12
    if item in _GGUF_ARRAYS:
        dtype = np.dtype(_GGUF_ARRAYS[item])
        if pos + dtype.itemsize * count > len(buf):
            raise struct.error("an array past the end of the file")
        values = np.frombuffer(buf, dtype=dtype, count=count, offset=pos).tolist()
        return values, pos + dtype.itemsize * count
    values = []
    for _ in range(count):
        value, pos = _gguf_value(buf, pos, item)
        values.append(value)
    return values, pos
