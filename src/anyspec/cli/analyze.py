"""``anyspec analyze``: how well a draft and a target tokenizer fit, before any model is run."""

from __future__ import annotations

import json
import threading
from pathlib import Path

from anyspec.errors import ConfigError


def add_parser(sub) -> None:
    parser = sub.add_parser(
        "analyze", help="how well a draft and a target tokenizer fit for TLI",
        description="Compare two vocabularies by the bytes of each token: shared tokens, what "
                    "string matching would find, and coverage of a sample text.")
    where = "tokenizer folder, .gguf file, or built-in model name"
    parser.add_argument("--target", required=True, help=where)
    parser.add_argument("--draft", required=True, help=where)
    parser.add_argument("--text", help="UTF-8 text file for the coverage (default: a code+prose sample)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.set_defaults(func=run)


MAX_TEXT = 64 << 20  # bytes of --text: a sample's coverage needs far less


def read_sample(path: Path) -> str:
    """``--text``: at most ``MAX_TEXT`` bytes of UTF-8, read without trusting the file's size.

    The read runs on a thread of its own while the main thread waits in short steps: a FIFO or a
    terminal can block it for ever, and a Ctrl-C that lands on another thread (OpenBLAS starts
    some) then still reaches the main thread's handler."""
    done: dict = {}

    def read():
        try:
            with open(path, "rb") as fh:
                done["data"] = fh.read(MAX_TEXT + 1)
        except OSError as exc:
            done["error"] = exc

    reader = threading.Thread(target=read, name="read --text", daemon=True)
    reader.start()
    while reader.is_alive():
        reader.join(0.1)
    try:
        if "error" in done:
            raise done["error"]
        data = done["data"]
        if len(data) > MAX_TEXT:
            raise ConfigError(f"--text {path} is larger than {MAX_TEXT >> 20} MiB; give a shorter sample")
        return data.decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read --text {path} ({type(exc).__name__}); "
                          "give a UTF-8 text file") from None


def resolve_tokenizer(spec: str):
    """A tokenizer from a path (folder, .gguf, tokenizer file) or a built-in model name.

    For a built-in model only its tokenizer is needed: the converted folder is used when it is
    already there, else the pinned GGUF (fetched and checked) without converting the weights.
    """
    from anyspec import models
    from anyspec.vocab.loading import load_tokenizer

    if Path(spec).expanduser().exists():
        return load_tokenizer(spec)
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
        text, name = read_sample(path), str(path)
    else:
        text, name = default_sample(), "the built-in sample (code + prose)"
    report = analyze_pair(resolve_tokenizer(args.target), resolve_tokenizer(args.draft), text, name,
                          names=(args.target, args.draft))
    print(json.dumps(report, indent=2) if args.json else format_report(report))
    return 0
