"""llama.cpp's own lookup speculation: the ``llama-server`` arguments that turn it on, checked.

The ``llama.cpp-ngram`` method and ``benchmarks/llama_ngram_sweep.py`` start ``llama-server`` with
one ``--spec-type`` of llama.cpp's draftless (n-gram) kinds and that kind's ``--spec-ngram-*``
sizes, given as one string, e.g. ``"--spec-type ngram-map-k --spec-ngram-map-k-size-n 3"``.
:func:`llama_spec_args` checks the string before any model work and returns the arguments.
"""

from __future__ import annotations

import shlex

from anyspec.errors import ConfigError

NGRAM_TYPES = ("ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache")
# option -> (the spec type it sizes, its smallest value)
SIZE_OPTIONS = {
    "--spec-ngram-simple-size-n": ("ngram-simple", 1),
    "--spec-ngram-simple-size-m": ("ngram-simple", 1),
    "--spec-ngram-simple-min-hits": ("ngram-simple", 1),
    "--spec-ngram-map-k-size-n": ("ngram-map-k", 1),
    "--spec-ngram-map-k-size-m": ("ngram-map-k", 1),
    "--spec-ngram-map-k-min-hits": ("ngram-map-k", 1),
    "--spec-ngram-map-k4v-size-n": ("ngram-map-k4v", 1),
    "--spec-ngram-map-k4v-size-m": ("ngram-map-k4v", 1),
    "--spec-ngram-map-k4v-min-hits": ("ngram-map-k4v", 1),
    "--spec-ngram-mod-n-match": ("ngram-mod", 1),
    "--spec-ngram-mod-n-min": ("ngram-mod", 0),
    "--spec-ngram-mod-n-max": ("ngram-mod", 1),
}
# the fastest setting of benchmarks/llama_ngram_sweep.py on the edit set (docs/benchmarks.md)
DEFAULT_LLAMA_SPEC = ("--spec-type ngram-mod --spec-ngram-mod-n-match 8 --spec-ngram-mod-n-min 1 "
                      "--spec-ngram-mod-n-max 16")


def _pairs(text: str, option: str) -> list[tuple[str, str]]:
    try:
        words = shlex.split(text)
    except ValueError as exc:
        raise ConfigError(f"{option} {text!r} cannot be split into arguments ({exc})") from None
    pairs, i = [], 0
    while i < len(words):
        name, eq, value = words[i].partition("=")
        if not eq:
            if i + 1 >= len(words) or words[i + 1].startswith("--"):
                raise ConfigError(f"{option}: {name} needs a value")
            value, i = words[i + 1], i + 1
        pairs.append((name, value))
        i += 1
    return pairs


def _spec_types(value: str, option: str) -> list[str]:
    types = value.split(",")
    unknown = [t for t in types if t not in NGRAM_TYPES + ("none",)]
    if unknown or (len(types) > 1 and "none" in types):
        raise ConfigError(f"{option}: --spec-type {value!r} is not one or more of {', '.join(NGRAM_TYPES)} "
                          "(or none alone)")
    return types


def llama_spec_args(text: str, option: str = "--llama-spec") -> list[str]:
    """The ``llama-server`` arguments in ``text``: exactly one ``--spec-type`` (n-gram kinds, comma-
    separated, or ``none``) and the ``--spec-ngram-*`` options of the kinds it lists, each once with
    an integer value; anything else is a one-line ``ConfigError`` naming ``option``."""
    if not isinstance(text, str) or not text.strip():
        raise ConfigError(f"{option} is empty; give e.g. {DEFAULT_LLAMA_SPEC!r}")
    pairs = _pairs(text, option)
    names = [n for n, _ in pairs]
    if names.count("--spec-type") != 1:
        raise ConfigError(f"{option} must name --spec-type exactly once, got {text!r}")
    types = _spec_types(dict(pairs)["--spec-type"], option)
    args = []
    for name, value in pairs:
        if name != "--spec-type":
            if name not in SIZE_OPTIONS:
                raise ConfigError(f"{option}: unknown option {name}; use --spec-type and "
                                  f"{', '.join(SIZE_OPTIONS)}")
            if names.count(name) > 1:
                raise ConfigError(f"{option}: {name} is given more than once")
            kind, least = SIZE_OPTIONS[name]
            if kind not in types:
                raise ConfigError(f"{option}: {name} sizes {kind}, which --spec-type does not list")
            if not value.isdigit() or int(value) < least:
                raise ConfigError(f"{option}: {name} must be an integer >= {least}, got {value!r}")
            value = str(int(value))
        args += [name, value]
    return args
