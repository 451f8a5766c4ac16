"""The ``anyspec`` command line: thin sub-commands over the library."""

from __future__ import annotations

import argparse
import sys


class UsageError(Exception):
    """A problem with the user's input: printed as one line, exit status 2."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="anyspec", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    # Each sub-command module adds its parser here: add_arguments(sub) -> sets func=run(args)
    from anyspec.vocab import analyze

    analyze.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args) or 0
    except UsageError as exc:
        print(f"anyspec {args.command}: error: {exc}", file=sys.stderr)
        return 2
