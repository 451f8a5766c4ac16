"""The ``anyspec`` command line: thin sub-commands over the library."""

from __future__ import annotations

import argparse
import sys

from anyspec.errors import AnyspecError


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
