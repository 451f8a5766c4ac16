"""What the commands share: the engine options, the model pair, and checks on paths and prompts.

Every check here runs before any model loads and fails with a ``ConfigError``: one line.
"""

from __future__ import annotations

import argparse
import codecs
import contextlib
import dataclasses
import os
import sys
import tempfile
import threading
from pathlib import Path

from anyspec.config import SamplingParams, SpeculativeConfig, check_alone, check_text, flags_of
from anyspec.errors import ConfigError
from anyspec.pair import PairPlan, check_pair


def add_model_options(p: argparse.ArgumentParser, no_draft: bool = True, chat_template: bool = True) -> None:
    from anyspec.models import DEFAULT_DRAFT, DEFAULT_TARGET

    p.add_argument("--target", default=DEFAULT_TARGET,
                   help="target model: a folder, a .gguf file or a built-in name (default %(default)s)")
    drafts = p.add_mutually_exclusive_group() if no_draft else p  # --draft X --no-draft: an error
    drafts.add_argument("--draft", default=DEFAULT_DRAFT,
                        help="draft model: a folder, a .gguf file or a built-in name (default %(default)s)")
    if no_draft:
        drafts.add_argument("--no-draft", action="store_true",
                            help="decode with the target alone (the baseline)")
    if chat_template:
        p.add_argument("--chat-template", default=None, metavar="FILE",
                       help="the target's chat template (a Jinja file, or its text) instead of the "
                        "model's own (the default)")


def add_sampling_options(p: argparse.ArgumentParser, max_new_tokens: int = 128,
                         seed_shown: str | None = None) -> None:
    """How each answer is sampled: ``SamplingParams``' flags (``sampling_params``); ``seed_shown``:
    where the command reports the seed a sampled answer chose (None: nowhere)."""
    p.add_argument("--max-new-tokens", type=int, default=max_new_tokens, metavar="N",
                   help=f"the most tokens an answer may have (default {max_new_tokens})")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-p", type=float, default=1.0,
                   help="nucleus sampling: the likeliest tokens whose probabilities add up to P "
                        "(1 = off, default)")
    p.add_argument("--top-k", type=int, default=0, help="the K likeliest tokens alone (0 = off, default)")
    p.add_argument("--min-p", type=float, default=0.0, help="0 = off (default)")
    p.add_argument("--typical-p", type=float, default=1.0, help="locally typical sampling (1 = off, default)")
    p.add_argument("--top-n-sigma", type=float, default=0.0,
                   help="keep the logits within N standard deviations of the largest (0 = off, default)")
    p.add_argument("--presence-penalty", type=float, default=0.0,
                   help="OpenAI's, from -2 to 2 (0 = off, default)")
    p.add_argument("--frequency-penalty", type=float, default=0.0,
                   help="OpenAI's, from -2 to 2 (0 = off, default)")
    p.add_argument("--repetition-penalty", type=float, default=1.0,
                   help="vLLM's: a seen token's logit divided by it where positive, else times it "
                        "(1 = off, default)")
    p.add_argument("--seed", type=int, default=None,
                   help="a sampled answer's seed, 0 to 2**64 - 1: the same seed, the same answer, with or "
                        "without the draft (default, or -1: a fresh random one for each answer, "
                        + (seed_shown or "not shown") + ")")
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable; default: none)")
    p.add_argument("--min-tokens", type=int, default=0,
                   help="the end-of-sequence tokens and stop strings wait for this many tokens (default 0)")
    p.add_argument("--ignore-eos", action="store_true",
                   help="never choose an end-of-sequence token (--max-new-tokens or a stop string ends)")


def check_max_new_tokens(value: int) -> None:
    """A command's answers have at least one token (the library's 0 only reads the prompt)."""
    if value < 1:
        raise ConfigError(f"--max-new-tokens must be at least 1, got {value}")


def sampling_params(args, **more) -> SamplingParams:
    """The checked ``SamplingParams`` of ``add_sampling_options``' flags, and ``more`` fields."""
    check_max_new_tokens(args.max_new_tokens)
    return SamplingParams(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
                          min_p=args.min_p, typical_p=args.typical_p, top_n_sigma=args.top_n_sigma,
                          presence_penalty=args.presence_penalty,
                          frequency_penalty=args.frequency_penalty,
                          repetition_penalty=args.repetition_penalty, max_new_tokens=args.max_new_tokens,
                          min_tokens=args.min_tokens, ignore_eos=args.ignore_eos, seed=args.seed,
                          stop=args.stop, **more)


def in_flags(exc: ConfigError, parser: argparse.ArgumentParser) -> str:
    """A setting's error as the command line gives it: a message that opens with its field
    (``top_p must be ...``) opens with the command's option for it (``--top-p must be ...``)."""
    message, field = str(exc), exc.field
    if not field or not message.startswith(field + " "):
        return message
    known = [o for o in flags_of(field) if o.startswith("--") and o in parser._option_string_actions]
    if not known or known[0] in message:  # a message that names the option already says it
        return message
    return known[0] + message[len(field):]


def add_flags(p: argparse.ArgumentParser, settings: type, fixed: tuple[str, ...] = ()) -> None:
    """A flag for each field of the dataclass ``settings`` that has a help text but the command's
    ``fixed`` ones (``SpeculativeConfig``'s, the server's ``Settings``), spelled (``--field-name``
    unless its metadata says), typed and explained by the field's metadata (``config.flag``); a
    bool field is a switch away from its default."""
    for f in dataclasses.fields(settings):
        if f.name in fixed or "help" not in f.metadata:
            continue
        options = dict(f.metadata)
        options.pop("flags", None)
        flags = flags_of(f.name, settings)
        alias = options.pop("alias", None)
        if isinstance(f.default, bool):
            options["action"] = "store_false" if f.default else "store_true"
        elif f.default is not None:
            options.setdefault("type", type(f.default))
        p.add_argument(*flags, dest=f.name, default=f.default, **options)
        if alias:
            p.add_argument(alias, dest=f.name, type=options["type"], default=argparse.SUPPRESS,
                           help=argparse.SUPPRESS)


def add_engine_options(p: argparse.ArgumentParser, fixed: tuple[str, ...] = (), context: bool = True) -> None:
    """The ``SpeculativeConfig`` flags (``add_flags``), the dtypes, ``--max-model-len`` (unless not
    ``context``) and threads."""
    add_flags(p, SpeculativeConfig, fixed)
    p.add_argument("--dtype", default="auto",
                   help="target: auto (a GGUF model: gguf where anyspec's kernels run its blocks, else "
                        "de-quantized; a folder: bf16, or fp32 on a CPU without AVX2; the default) | gguf "
                        "(the file's own blocks) | bf16 | fp16 | fp32 | int8 (weight-only int8 linears)")
    p.add_argument("--draft-dtype", default="auto",
                   help="draft: auto (as --dtype for a GGUF model; a folder: int8 on the CPU, since the "
                        "draft's numbers never change the output; the default) | gguf | bf16 | fp16 | fp32 "
                        "| int8")
    p.add_argument("--kv-cache-dtype", default="fp32", choices=("fp32", "fp16"),
                   help="both models' KV caches: fp32 (default) or fp16 (half the memory, and half the "
                        "bytes a token reads on a long context; each key and value rounded once); "
                        "anyspec's kernels only (dtype gguf, int8 or bf16)")
    if context:
        p.add_argument("--max-model-len", type=int, default=None, metavar="N",
                       help="the most tokens a prompt and its answer may hold together, at most the "
                            "target's own context (default: that context); each KV cache grows to at most "
                            "this")
    p.add_argument("--threads", type=int, default=None, metavar="N",
                   help="torch CPU threads, at most the CPU count (default: torch's choice, one per "
                        "physical core)")


def speculative_config(args, **fixed) -> SpeculativeConfig:
    """The config from ``add_flags``' flags and the command's ``fixed`` settings."""
    flagged = {f.name: getattr(args, f.name) for f in dataclasses.fields(SpeculativeConfig)
               if hasattr(args, f.name)}
    return SpeculativeConfig(**(flagged | fixed))


def pair_plan(args) -> PairPlan:
    """The checked pair from ``--target``, ``--draft`` (unless ``--no-draft``, which no setting of the
    draft's may come with), the dtypes and threads."""
    alone = getattr(args, "no_draft", False)
    if alone:
        check_alone(speculative_config(args))
    return check_pair(args.target, None if alone else args.draft, args.dtype, args.draft_dtype,
                      args.threads, getattr(args, "allow_download", False),
                      getattr(args, "trust_remote_code", False), getattr(args, "chat_template", None),
                      getattr(args, "kv_cache_dtype", "fp32"), getattr(args, "max_model_len", None))


def check_prompt_text(text: str, option: str = "--prompt") -> None:
    """A prompt from the command line (``option``): not blank, and valid UTF-8 (the shell may pass
    any bytes)."""
    if not text.strip():
        raise ConfigError(f"the prompt is empty; pass some text with {option}" if option == "--prompt"
                          else f"{option} is empty; pass some text or leave it out")
    check_text(text, "the prompt" if option == "--prompt" else option)


MAX_TEXT = 64 << 20  # bytes of a text file an option names: prompts, samples, schemas, grammars


def read_text(path: str | Path, option: str) -> str:
    """The UTF-8 text of the file ``option`` names (``-``: standard input), at most ``MAX_TEXT``
    bytes, read without trusting the file's size (``/dev/zero`` is refused at the limit).

    The read runs on a thread of its own while the main thread waits in short steps: a FIFO or a
    terminal can block it for ever, and a Ctrl-C that lands on another thread (OpenBLAS starts
    some) then still reaches the main thread's handler."""
    done: dict = {}

    def read():
        try:
            if str(path) == "-":
                done["data"] = sys.stdin.buffer.read(MAX_TEXT + 1)
            else:
                with open(path, "rb") as fh:
                    done["data"] = fh.read(MAX_TEXT + 1)
        except OSError as exc:
            done["error"] = exc

    reader = threading.Thread(target=read, name=f"read {option}", daemon=True)
    reader.start()
    while reader.is_alive():
        reader.join(0.1)
    name = "standard input" if str(path) == "-" else path
    if "error" in done:
        raise ConfigError(f"{option}: cannot read {name}: {done['error'].strerror or done['error']}")
    if len(done["data"]) > MAX_TEXT:
        raise ConfigError(f"{option}: {name} is larger than {MAX_TEXT >> 20} MiB")
    data = done["data"]
    if data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        raise ConfigError(f"{option}: {name} is UTF-16 text (it starts with UTF-16's byte order mark); "
                          "save it as UTF-8")
    try:
        return data.decode("utf-8-sig")  # a byte order mark some editors write is no part of the text
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{option}: {name} is not valid UTF-8 text ({exc.reason} at byte "
                          f"{exc.start})") from None


def output_path(path: Path, option: str) -> Path:
    """The file ``path`` names, through any symlinks: a regular file, or none yet."""
    real = path.expanduser().resolve()
    if real.is_dir():
        raise ConfigError(f"{option} {path} is a folder; give a file name")
    if real.exists() and not real.is_file():
        raise ConfigError(f"{option} {path} is not a regular file; give a file name")
    return real


def check_output(path: Path | None, option: str) -> None:
    """A file the command will write at the end (``write_atomically``): its folder must exist and
    take a new file now, and the file, if it exists, must be a regular file that opens for writing.
    Nothing is changed."""
    if path is None:
        return
    real = output_path(path, option)
    folder = real.parent
    if not folder.is_dir():
        raise ConfigError(f"{option} {path}: the folder {folder} does not exist; create it first")
    try:
        if real.exists():
            with open(real, "a"):  # appends nothing: the file stays as it is
                pass
        with tempfile.NamedTemporaryFile(dir=folder, prefix=f".{real.name}.", suffix=".tmp"):
            pass
    except OSError as exc:
        raise ConfigError(f"{option} {path} cannot be written ({exc.strerror or exc}); "
                          "give a writable file") from None


@contextlib.contextmanager
def write_atomically(path: Path, option: str = "output"):
    """Yields a temporary path beside the file ``path`` names (through symlinks; same suffix) to
    write; it replaces that file at once when the block ends without an error, so a reader never
    sees half a file. Anything there but a regular file is refused."""
    path = output_path(path, option)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=path.suffix)
    os.close(fd)
    try:
        yield Path(tmp)
        path = output_path(path, option)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, path.stat().st_mode & 0o777 if path.exists() else 0o666 & ~umask)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def check_cache_dir() -> None:
    """anyspec's cache (``$ANYSPEC_CACHE_DIR`` or the per-user cache folder) must be a writable folder."""
    from anyspec.paths import cache_dir

    where = os.environ.get("ANYSPEC_CACHE_DIR") or "the cache folder"
    try:
        with tempfile.TemporaryFile(dir=cache_dir()):
            pass
    except OSError as exc:
        raise ConfigError(f"cannot use {where} as anyspec's cache ({exc.strerror or exc}); "
                          "set ANYSPEC_CACHE_DIR to a writable folder") from None


SWITCHES = ("ANYSPEC_KERNELS", "ANYSPEC_LEAN", "ANYSPEC_ONEDNN")  # 0 turns each off


def check_switches() -> None:
    """The environment's on/off switches hold 0 or 1: ``off`` or ``false`` would leave them on."""
    for name in SWITCHES:
        value = os.environ.get(name)
        if value is not None and value.strip() not in ("0", "1"):
            raise ConfigError(f"{name} must be 0 (off) or 1 (on), got {value!r}")
