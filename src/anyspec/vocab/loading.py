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
import tempfile
from pathlib import Path
from typing import Any

from anyspec.errors import ConfigError
from anyspec.fetch import cache_dir
from anyspec.vocab.bytes import bytes_to_unicode, tiktoken_ranks

_KINDS = ("a tokenizer folder, a .gguf file, a tokenizer.json, a SentencePiece .model "
          "or a tiktoken/tekken file")
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "vocab.txt",
                    "spiece.model", "sentencepiece.bpe.model", "tekken.json")
_CONVERSION_FORMAT = "2"


def load_tokenizer(path: str | os.PathLike) -> Any:
    """The Hugging Face tokenizer stored at ``path``; ConfigError (one line) when there is none."""
    p = Path(path).expanduser()
    if not p.exists():
        raise ConfigError(f"{p} does not exist; give {_KINDS}, or a built-in model name")
    if p.is_dir():
        return _from_folder(p)
    name = p.name.lower()
    if name.endswith(".gguf"):
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
            return _from_folder(Path(tmp), source=p)
    raise ConfigError(f"{p} is not a tokenizer file; give {_KINDS}")


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
            return AutoTokenizer.from_pretrained(out, trust_remote_code=False)
        except Exception:
            shutil.rmtree(out, ignore_errors=True)
    tok = _quiet(lambda: convert(p), p)
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=root, prefix=".partial-"))
    try:
        tok.save_pretrained(tmp)
        if out.exists():
            shutil.rmtree(out, ignore_errors=True)
        os.replace(tmp, out)
    except OSError:
        pass
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return tok


def _from_gguf(p: Path) -> Any:
    from transformers import AutoTokenizer

    try:
        from gguf import GGUFReader

        fields = GGUFReader(p).fields
    except Exception as exc:
        raise ConfigError(f"{p} is not a readable GGUF file ({type(exc).__name__}); give {_KINDS}") from None
    if "tokenizer.ggml.tokens" not in fields:
        raise ConfigError(f"{p} is a GGUF file without a tokenizer (no tokenizer.ggml.tokens); give {_KINDS}")
    if fields["tokenizer.ggml.model"].contents() == "bert":
        return _wordpiece_from_gguf(fields)
    return AutoTokenizer.from_pretrained(p.parent, gguf_file=p.name, trust_remote_code=False)


def _wordpiece_from_gguf(fields) -> Any:
    """A BERT WordPiece tokenizer from GGUF metadata (transformers cannot load these)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    tokens = fields["tokenizer.ggml.tokens"].contents()
    types = fields["tokenizer.ggml.token_type"].contents() if "tokenizer.ggml.token_type" in fields else []

    def token_at(key: str) -> str | None:
        return tokens[int(fields[key].contents())] if key in fields else None

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
