"""Errors a user can act on. The CLI prints them as one line; the server turns them into 400s."""


class AnyspecError(Exception):
    """Base class: the message says what is wrong and what to do."""


class ConfigError(AnyspecError, ValueError):
    """A setting, path, model or request that cannot work. Raised before any heavy work starts."""
