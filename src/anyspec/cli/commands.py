"""The ``anyspec`` command line: thin sub-commands over the library."""

from __future__ import annotations

import argparse
import os
import sys

from anyspec.cli import analyze, bench, demo, generate, models, serve
from anyspec.cli.options import check_cache_dir
from anyspec.errors import AnyspecError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="anyspec", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for command in (analyze, generate, models, bench, demo, serve):
        command.add_parser(sub)  # each sets func=run(args)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        check_cache_dir()
        return args.func(args) or 0
    except AnyspecError as exc:
        print(f"anyspec {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # the reader of stdout went away (``| head``): stop quietly
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # so that the exit's flush does not fail again
        return 1
