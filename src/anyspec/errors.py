"""Errors a user can act on. The CLI prints them as one line; the server turns them into 400s."""


class AnyspecError(Exception):
    """Base class: the message says what is wrong and what to do."""


class ConfigError(AnyspecError, ValueError):
    """A setting, path, model or request that cannot work. Raised before any heavy work starts.
    ``field``: the setting it is about, where it is one (the server's ``param``)."""

    def __init__(self, message: str, field: str | None = None):
        super().__init__(message)
        self.field = field


class EngineBusy(AnyspecError, RuntimeError):
    """An ``Engine`` asked for a generation on its own KV caches (``generate``, ``stream``) while
    another one is under way: retry once it ends, or run several with ``generate_batch``."""
