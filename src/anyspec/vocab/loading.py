"""Load a tokenizer from a path: a folder, a ``.gguf`` file, a ``tokenizer.json``, a SentencePiece
``.model``, or a tiktoken-style rank file (``.tiktoken`` or Mistral's tekken JSON).

Everything comes back as a Hugging Face tokenizer. GGUF conversions are slow (tens of seconds
for a 262k vocabulary), so the converted tokenizer is kept under ``cache_dir()/tokenizers``,
keyed by the file's path, size and modification time. ``trust_remote_code`` stays off.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import re
import shutil
import struct
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from anyspec.errors import ConfigError
from anyspec.paths import cache_dir
from anyspec.vocab.bytes import bytes_to_unicode, tiktoken_ranks

_KINDS = ("a tokenizer folder, a .gguf file, a tokenizer.json, a SentencePiece .model "
          "or a tiktoken/tekken file")
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "vocab.txt",
                    "spiece.model", "sentencepiece.bpe.model", "tekken.json")
_CONVERSION_FORMAT = "5"


def load_tokenizer(path: str | os.PathLike) -> Any:
    """The Hugging Face tokenizer stored at ``path``; ConfigError (one line) when there is none."""
    p = Path(path).expanduser()
    if not p.exists():
        raise ConfigError(f"{p} does not exist; give {_KINDS}, or a built-in model name")
    if p.is_dir():
        return _from_folder(p)
    name = p.name.lower()
    if is_gguf_file(p):
        return _cached_conversion(p, _from_gguf)
    if name.endswith(".json"):
        head = _json_head(p)
        if '"token_bytes"' in head or '"config"' in head and '"vocab"' in head:
            return _cached_conversion(p, _from_tiktoken)
        return _quiet(lambda: _fast(tokenizer_file=str(p)), p)
    if name.endswith(".tiktoken"):
        return _cached_conversion(p, _from_tiktoken)
    if re.search(r"\.model(\.v\w+)?$", name):
        with tempfile.TemporaryDirectory(prefix="anyspec-spm-") as tmp:
            os.symlink(p.resolve(), Path(tmp) / "tokenizer.model")
            if _sentencepiece_is_bpe(p):
                # Without a class transformers drops SentencePiece's dummy prefix (" a" != "a").
                (Path(tmp) / "tokenizer_config.json").write_text('{"tokenizer_class": "LlamaTokenizer"}')
            return _from_folder(Path(tmp), source=p)
    raise ConfigError(f"{p} is not a tokenizer file; give {_KINDS}")


def is_gguf_file(p: Path) -> bool:
    """A file named ``.gguf`` (in any case), or one that begins with GGUF's magic number."""
    if p.name.lower().endswith(".gguf"):
        return True
    try:
        with open(p, "rb") as fh:
            return fh.read(4) == b"GGUF"
    except OSError:
        return False


def _sentencepiece_is_bpe(p: Path) -> bool:
    try:
        from sentencepiece import sentencepiece_model_pb2

        proto = sentencepiece_model_pb2.ModelProto()
        proto.ParseFromString(p.read_bytes())
    except Exception:
        return False
    return proto.trainer_spec.model_type == sentencepiece_model_pb2.TrainerSpec.BPE


def _json_head(p: Path) -> str:
    with open(p, encoding="utf-8", errors="replace") as fh:
        return fh.read(4096)


def _fast(**kwargs) -> Any:
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(**kwargs)


def _quiet(load, source: Path) -> Any:
    try:
        tok = load()
    except ConfigError:
        raise
    except Exception as exc:
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:160]
        raise ConfigError(f"{source} could not be read as a tokenizer ({reason}); give {_KINDS}") from None
    if tok is None or len(tok) == 0:
        raise ConfigError(f"{source} loaded as an empty tokenizer; give {_KINDS}")
    return tok


def _from_folder(folder: Path, source: Path | None = None) -> Any:
    from transformers import AutoTokenizer

    source = source or folder
    if not any((folder / f).exists() for f in _TOKENIZER_FILES):
        ggufs = sorted(folder.glob("*.gguf"))
        if len(ggufs) == 1:
            return load_tokenizer(ggufs[0])
        raise ConfigError(f"{source} has no tokenizer files (tokenizer.json, tokenizer.model, ...); "
                          f"give {_KINDS}")
    return _quiet(lambda: AutoTokenizer.from_pretrained(folder, trust_remote_code=False), source)


def _cached_conversion(p: Path, convert) -> Any:
    """Convert once, save as a tokenizer folder in the cache, and load that folder afterwards."""
    from transformers import AutoTokenizer

    st = p.stat()
    stamp = f"{_CONVERSION_FORMAT}:{p.resolve()}:{st.st_size}:{st.st_mtime_ns}"
    key = hashlib.sha256(stamp.encode()).hexdigest()
    root = cache_dir() / "tokenizers"
    out = root / f"{p.stem[:40]}-{key[:16]}"
    if (out / "tokenizer.json").is_file():
        try:
            if _intact(out):
                if (out / _NOTE).is_file():
                    print(f"anyspec: {(out / _NOTE).read_text(encoding='utf-8')}", file=sys.stderr)
                return AutoTokenizer.from_pretrained(out, trust_remote_code=False)
        except Exception:
            pass
        shutil.rmtree(out, ignore_errors=True)  # damaged: converted again
    tok = _quiet(lambda: convert(p), p)
    note = getattr(tok, "conversion_note", None)
    if note:
        print(f"anyspec: {note}", file=sys.stderr)
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=root, prefix=".partial-"))
    try:
        tok.save_pretrained(tmp)
        if note:
            (tmp / _NOTE).write_text(note, encoding="utf-8")
        (tmp / _MANIFEST).write_text(json.dumps(_hashes(tmp)))
        if out.exists():
            shutil.rmtree(out, ignore_errors=True)
        os.replace(tmp, out)
    except OSError:
        pass
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return tok


_MANIFEST = "anyspec-files.json"  # every saved file's sha256, written with the conversion
_NOTE = "anyspec-note.txt"  # what a conversion could not do as the model's own tokenizer does


def _hashes(folder: Path) -> dict[str, str]:
    return {f.name: hashlib.sha256(f.read_bytes()).hexdigest()
            for f in sorted(folder.iterdir()) if f.name != _MANIFEST}


def _intact(folder: Path) -> bool:
    """True when the cached conversion's files are exactly those its manifest lists."""
    try:
        return json.loads((folder / _MANIFEST).read_bytes()) == _hashes(folder)
    except (OSError, ValueError):
        return False


def gguf_metadata(p: Path) -> dict[str, Any]:
    """``read_gguf_metadata``, with a one-line ConfigError that says where a file is cut short."""
    try:
        return read_gguf_metadata(p)
    except (OSError, ValueError, struct.error, UnicodeDecodeError) as exc:
        raise ConfigError(f"{p} is not a readable GGUF file ({exc}); give {_KINDS}") from None


def _from_gguf(p: Path) -> Any:
    from transformers import AutoTokenizer

    fields = gguf_metadata(p)
    if "tokenizer.ggml.tokens" not in fields:
        raise ConfigError(f"{p} is a GGUF file without a tokenizer (no tokenizer.ggml.tokens); give {_KINDS}")
    kind = fields.get("tokenizer.ggml.model")
    if kind == "bert":
        return _wordpiece_from_gguf(fields)
    if _transformers_reads(fields):
        try:
            tokenizer = AutoTokenizer.from_pretrained(p.parent, gguf_file=p.name, trust_remote_code=False)
            if kind == "gpt2":  # transformers splits a kind outside its table as GPT-2's
                pre = fields.get("tokenizer.ggml.pre")
                tokenizer.conversion_note = _split_as(tokenizer.backend_tokenizer, pre)
            return tokenizer
        except Exception:
            if kind not in _METADATA_KINDS:
                raise
    if kind not in _METADATA_KINDS:
        raise ConfigError(f"{p} has a {kind!r} tokenizer, which anyspec cannot read; give {_KINDS}")
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


def _bpe_from_gguf(fields) -> Any:
    """A tokenizer from GGUF metadata alone, for architectures transformers does not load.

    Token ids, token strings, merges and special tokens are exactly the file's, so every token's
    bytes are right. Byte-level ("gpt2") vocabularies split text as the file's pre-tokenizer kind
    says (``_split_as``); SentencePiece-style ones use merges when the file has them, else the scores
    (Unigram).
    """
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers

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
    tokenizer = _fast(tokenizer_object=backend, **named)
    tokenizer.conversion_note = note  # said at each load of the conversion (_cached_conversion)
    return tokenizer


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
    return _fast(tokenizer_object=backend, unk_token=unk, cls_token=cls, sep_token=sep,
                 pad_token=token_at("tokenizer.ggml.padding_token_id"),
                 mask_token=token_at("tokenizer.ggml.mask_token_id"))


def _from_tiktoken(p: Path) -> Any:
    """A byte-level BPE tokenizer equivalent to a tiktoken rank file (merges rebuilt from ranks)."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

    ranks = tiktoken_ranks(p)
    config: dict = {}
    if _json_head(p).lstrip().startswith("{"):
        config = json.loads(p.read_text(encoding="utf-8")).get("config", {})
    n_special = int(config.get("default_num_special_tokens", 0))
    size = int(config.get("default_vocab_size", n_special + len(ranks)))
    ranks = ranks[: size - n_special]
    specials = ["<unk>", "<s>", "</s>", *(f"<SPECIAL_{i}>" for i in range(3, n_special))][:n_special]
    to_unicode = {b: ord(c) for b, c in bytes_to_unicode().items()}
    spelled = [r.decode("latin-1").translate(to_unicode) for r in ranks]
    vocab = {s: i for i, s in enumerate(specials)}
    vocab.update({s: n_special + i for i, s in enumerate(spelled)})
    rank_of = {r: i for i, r in enumerate(ranks)}
    merges = []
    for token, spell in zip(ranks, spelled, strict=True):
        found = []
        for cut in range(1, len(token)):
            left, right = rank_of.get(token[:cut]), rank_of.get(token[cut:])
            if left is not None and right is not None:
                found.append((left, right, cut))
        for _, _, cut in sorted(found):
            merges.append((spell[:cut], spell[cut:]))
    backend = Tokenizer(models.BPE(vocab, merges, ignore_merges=True))
    pattern = config.get("pattern") or (r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+"
                                         r"|\s+(?!\S)|\s+")
    backend.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    named = {k: v for k, v in (("unk_token", "<unk>"), ("bos_token", "<s>"), ("eos_token", "</s>"))
             if v in specials}
    return _fast(tokenizer_object=backend, **named)


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
