"""The ``anyspec`` command line: ``commands.py`` builds the parser, ``options.py`` holds what the
commands share (engine options, the model pair, output paths), and each command has its module."""


def main(argv: list[str] | None = None) -> int:
    from anyspec.cli.commands import main as run

    return run(argv)
