"""Load a tokenizer from a path: a folder, a ``.gguf`` file, a ``tokenizer.json``, a SentencePiece
``.model``, or a tiktoken-style rank file (``.tiktoken`` or Mistral's tekken JSON).

Everything comes back as a Hugging Face tokenizer. GGUF conversions are slow (tens of seconds
for a 262k vocabulary), so the converted tokenizer is kept under ``cache_dir()/tokenizers``,
keyed by the file's path, size and modification time. ``trust_remote_code`` stays off.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from anyspec.errors import ConfigError
from anyspec.paths import cache_dir
from anyspec.vocab.bytes import bytes_to_unicode, tiktoken_ranks
from anyspec.vocab.gguf import is_gguf_file, tokenizer_from_gguf

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
        return _cached_conversion(p, tokenizer_from_gguf)
    if name.endswith(".json"):
        head = _json_head(p)
        if '"token_bytes"' in head or '"config"' in head and '"vocab"' in head:
            return _cached_conversion(p, _from_tiktoken)
        return _nonempty(_quiet(lambda: _fast(tokenizer_file=str(p)), p), p)
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
    """What ``load()`` returns; a ConfigError (one line) for any error on the way."""
    try:
        return load()
    except ConfigError:
        raise
    except Exception as exc:
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:160]
        raise ConfigError(f"{source} could not be read as a tokenizer ({reason}); give {_KINDS}") from None


def _nonempty(tok, source: Path) -> Any:
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
    return _nonempty(_quiet(lambda: AutoTokenizer.from_pretrained(folder, trust_remote_code=False), source),
                     source)


def _cached_conversion(p: Path, convert) -> Any:
    """Convert once, save as a tokenizer folder in the cache, and load that folder afterwards.
    ``convert(p)`` gives the tokenizer and a note of what it could not do as the model's own
    tokenizer does (None: nothing), said at each load."""
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
    tok, note = _quiet(lambda: convert(p), p)
    _nonempty(tok, p)
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


def _from_tiktoken(p: Path) -> tuple[Any, None]:
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
    return _fast(tokenizer_object=backend, **named), None

