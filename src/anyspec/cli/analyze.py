"""``anyspec analyze``: how well a draft and a target tokenizer fit, before any model is run."""

from __future__ import annotations

import json
from pathlib import Path

from anyspec.cli.options import read_text
from anyspec.errors import ConfigError


def add_parser(sub) -> None:
    parser = sub.add_parser(
        "analyze", help="how well a draft and a target tokenizer fit for TLI",
        description="Compare two vocabularies by the bytes of each token: shared tokens, what "
                    "string matching would find, and coverage of a sample text.")
    from anyspec.models import DEFAULT_DRAFT, DEFAULT_TARGET

    where = "tokenizer folder, .gguf file, or built-in model name (default %(default)s)"
    parser.add_argument("--target", default=DEFAULT_TARGET, help=where)
    parser.add_argument("--draft", default=DEFAULT_DRAFT, help=where)
    parser.add_argument("--text", help="UTF-8 text file for the coverage (default: a code+prose sample)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.set_defaults(func=run)


def resolve_tokenizer(spec: str):
    """A tokenizer from a path (folder, .gguf, tokenizer file) or a built-in model name.

    For a built-in model only its tokenizer is needed: the converted folder is used when it is
    already there, else the pinned GGUF (fetched and checked) without converting the weights.
    """
    from anyspec import models
    from anyspec.backends.gguf_file import read_gguf
    from anyspec.backends.load import gguf_source
    from anyspec.vocab.gguf import gguf_metadata
    from anyspec.vocab.loading import load_tokenizer

    if Path(spec).expanduser().exists():
        if (source := gguf_source(spec)) is not None:
            gguf_metadata(source)  # cut short in its metadata: says where
            read_gguf(source)  # cut short in its tensors, or damaged: refused as generate refuses it
        return load_tokenizer(source or spec)
    if spec in models.MODELS and models.is_cached(spec):
        return load_tokenizer(models.model_dir(spec))
    return load_tokenizer(models.resolve_model(spec))  # a built-in name: its GGUF file


def run(args) -> int:
    from anyspec.vocab.analyze import analyze_pair, default_sample, format_report

    for option, spec in (("--target", args.target), ("--draft", args.draft)):
        if not spec.strip():
            raise ConfigError(f"{option} is empty; give a tokenizer folder or file, or a built-in model name")
    if args.text:
        path = Path(args.text).expanduser()
        text, name = read_text(path, "--text"), str(path)
    else:
        text, name = default_sample(), "the built-in sample (code + prose)"
    report = analyze_pair(resolve_tokenizer(args.target), resolve_tokenizer(args.draft), text, name,
                          names=(args.target, args.draft))
    print(json.dumps(report, indent=2) if args.json else format_report(report))
    return 0
