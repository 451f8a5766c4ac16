"""The ``anyspec`` command line: thin sub-commands over the library."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import warnings

from anyspec import __version__
from anyspec.cli import analyze, bench, chat, demo, generate, models, serve
from anyspec.cli.options import check_cache_dir, check_switches, in_flags
from anyspec.errors import AnyspecError, ConfigError


class Parser(argparse.ArgumentParser):
    """argparse's parser whose errors are one line, as the commands' own are: the command, the
    error and where to read more, without the usage."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="anyspec", description=__doc__)
    parser.add_argument("--version", action="version", version=f"anyspec {__version__}")
    commands = (analyze, generate, chat, models, bench, demo, serve)
    named = "{" + ",".join(c.__name__.rsplit(".", 1)[1] for c in commands) + "}"
    sub = parser.add_subparsers(dest="command", required=True, metavar=named)  # named: not "command"
    for command in commands:
        command.add_parser(sub)  # each sets func=run(args)
    parser.commands = sub.choices
    return parser


class OutputError(AnyspecError):
    """stdout took no more (a full disk, an I/O error)."""


class Stdout:
    """``sys.stdout`` whose failed writes, but a reader gone away, are an ``OutputError``."""

    def __init__(self, stream):
        self.stream = stream
        self.open_line = False  # the last text written did not end its line

    def _guard(self, call, *args):
        try:
            return call(*args)
        except BrokenPipeError:
            raise
        except OSError as exc:
            raise OutputError(f"cannot write to stdout ({exc.strerror or exc})") from None

    def write(self, text: str) -> int:
        if text:
            self.open_line = not text.endswith("\n")
        return self._guard(self.stream.write, text)

    def flush(self) -> None:
        self._guard(self.stream.flush)

    def __getattr__(self, name):
        return getattr(self.stream, name)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # named by the command they were given to, as its other errors are
        parser.commands[args.command].error(f"unrecognized arguments: {' '.join(unknown)}")
    stdout, sys.stdout = sys.stdout, Stdout(sys.stdout)
    shown, warnings.showwarning = warnings.showwarning, _one_line_warning
    try:
        check_switches()
        check_cache_dir()
        code = args.func(args) or 0
        sys.stdout.flush()
        return code
    except KeyboardInterrupt:
        after_text = "\n" if sys.stdout.open_line else ""  # not on the line of an answer cut short
        print(f"{after_text}anyspec {args.command}: interrupted", file=sys.stderr)
        return 130
    except AnyspecError as exc:
        said = in_flags(exc, parser.commands[args.command]) if isinstance(exc, ConfigError) else exc
        print(f"anyspec {args.command}: error: {said}", file=sys.stderr)
        if isinstance(exc, OutputError):
            _drop_stdout(stdout)
        return 2
    except BrokenPipeError:  # the reader of stdout went away (``| head``): stop quietly, with the
        _drop_stdout(stdout)  # status of a command that SIGPIPE ended, as the shell's tools give
        return 128 + signal.SIGPIPE
    finally:
        sys.stdout, warnings.showwarning = stdout, shown


def _one_line_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """A warning as one line of what it says, not Python's source path and line."""
    print(f"anyspec: warning: {message}", file=file or sys.stderr)


def _drop_stdout(stream) -> None:
    """Point stdout at /dev/null, so that the exit's flush of what is left does not fail again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, stream.fileno())
    except (OSError, ValueError):  # a stream with no file descriptor (a test's capture)
        pass
    finally:
        os.close(devnull)
