"""The ``anyspec`` command line: thin sub-commands over the library."""

from __future__ import annotations

import argparse
import sys

from anyspec import defaults
from anyspec.errors import AnyspecError


def add_engine_options(p: argparse.ArgumentParser, algorithm: bool = True) -> None:
    """The options every engine-running command shares: dtypes, adaptive k and (optionally) the algorithm."""
    if algorithm:
        p.add_argument("--algorithm", default="auto", choices=("auto", "tli", "slem"),
                       help="auto (default): slem when greedy, tli when sampling | tli: the draft keeps to "
                            "the shared tokens | slem: the draft writes freely, its text is re-encoded")
    p.add_argument("--adaptive-k", action="store_true",
                   help="choose k (0 = target alone) each round from measured acceptance and speed")
    p.add_argument("--draft-confidence", type=float, default=defaults.DRAFT_CONFIDENCE, metavar="P",
                   help="end a round's draft after a token the draft gives probability below P "
                        "(0 = always draft k; default: %(default)s)")
    p.add_argument("--dtype", default="auto",
                   help="target: auto (bf16: natively, or on anyspec's AVX2 kernel; fp32 where neither "
                        "runs) | bf16 | fp16 | fp32 | int8 (weight-only int8 linears: a quantized target)")
    p.add_argument("--draft-dtype", default="auto",
                   help="draft: auto (int8 on the CPU, with anyspec's lean forward for Llama-family "
                        "models: the draft's numbers never change the output) | bf16 | fp16 | fp32")
    p.add_argument("--threads", type=int, default=None, metavar="N",
                   help="torch CPU threads (default: torch's choice, one per physical core)")


def engine_options(args) -> dict:
    """``SpeculativeConfig`` keyword arguments from ``add_engine_options``' flags."""
    return {"adaptive_k": args.adaptive_k, "draft_confidence": args.draft_confidence}


def set_threads(args) -> None:
    """Apply ``--threads`` (before any model loads); a count below 1 is a one-line error."""
    if args.threads is None:
        return
    if args.threads < 1:
        from anyspec.errors import ConfigError

        raise ConfigError(f"--threads must be >= 1, got {args.threads}")
    import torch

    torch.set_num_threads(args.threads)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="anyspec", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    # Each sub-command's module adds its parser with add_parser(sub), setting func=run(args).
    from anyspec.vocab import analyze

    analyze.add_parser(sub)
    from anyspec import cli_generate

    cli_generate.add_parser(sub)
    from anyspec import bench, demo, models

    models.add_parser(sub)
    bench.add_parser(sub)
    demo.add_parser(sub)
    from anyspec import server

    server.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args) or 0
    except AnyspecError as exc:
        print(f"anyspec {args.command}: error: {exc}", file=sys.stderr)
        return 2
