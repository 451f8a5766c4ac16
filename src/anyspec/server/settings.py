"""The server's settings: one checked dataclass, whose fields make ``anyspec serve``'s flags
(``cli/serve.py``), as ``SpeculativeConfig``'s make the engine's. It imports nothing heavy, so the
command line can read it before anything loads."""

from __future__ import annotations

import re
from dataclasses import dataclass

from anyspec.config import MAX_BATCH, flag
from anyspec.errors import ConfigError


@dataclass
class Settings:
    """The server's limits, checked here (a ``ConfigError`` names the ``anyspec serve`` option)."""

    model_name: str  # --served-model-name, or the target's name (cli/serve.py)
    model_aliases: tuple[str, ...] = ()  # other ids a request may name it by: the --target as given
    queue_size: int = flag(16, "requests that may wait; more answer 429 (default %(default)s)", metavar="N")
    queue_timeout: float = flag(60.0, "seconds a request may wait; then 503 (default %(default)s)",
                                 metavar="S")
    generation_timeout: float = flag(
        300.0, "seconds a generation may run once its prompt is read; then it ends with what it wrote, "
        "finish_reason 'length' (default %(default)s)", metavar="S")
    max_body_bytes: int = flag(1_000_000, "a request body larger than this is a 400 (default %(default)s)",
                                metavar="N")
    default_max_tokens: int = flag(256, "max_tokens where a request sets none (default %(default)s)",
                                    metavar="N")
    max_batch: int = flag(MAX_BATCH, "generations run together (each keeps a KV cache of the target and the "
                           "draft; default %(default)s)", metavar="N")
    max_prompt_tokens: int | None = flag(
        None, "refuse (400) a request whose prompt has more than N tokens (default: the context)",
        metavar="N", type=int)
    worker_thread: bool = True  # False: the caller runs app.state.scheduler.run() itself
    close_engine: bool = True  # the app's shutdown closes the engine (False: the caller's, to close itself)
    body_timeout: float = flag(
        30.0, "seconds a request's body may take to arrive; then 408 (slow or stalled clients; default "
        "%(default)s)", metavar="S")
    api_key: str | None = flag(
        None, "requests need 'Authorization: Bearer KEY' (all routes but /health and /metrics); default: "
        "$ANYSPEC_API_KEY, else none", metavar="KEY")
    allowed_origins: list[str] | None = flag(
        None, "answer CORS requests from this browser origin (repeatable; '*': any; default: none)",
        metavar="ORIGIN", action="append")
    shutdown_timeout: float = flag(
        30.0, "seconds the requests under way may take to finish after SIGTERM or Ctrl-C, new ones refused; "
        "then they end with a 503 (a second signal ends them at once; 0: at once; default %(default)s)",
        metavar="S")
    responses_store: int = flag(
        1024, "Responses API responses kept in memory, the most recent, for previous_response_id and GET "
        "/v1/responses/{id} (0: none; default %(default)s)", metavar="N")

    @property
    def model_ids(self) -> tuple[str, ...]:
        """The ids a request may name the model by, the one it is answered by first."""
        return (self.model_name, *self.model_aliases)

    def __post_init__(self):
        for name, least in (("queue_size", 1), ("max_body_bytes", 1), ("default_max_tokens", 1),
                            ("max_batch", 1), ("max_prompt_tokens", 1), ("responses_store", 0)):
            value = getattr(self, name)
            if value is None and name == "max_prompt_tokens":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ConfigError(f"--{name.replace('_', '-')} must be >= {least}, got {value!r}")
        for name in ("queue_timeout", "generation_timeout", "body_timeout"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ConfigError(f"--{name.replace('_', '-')} must be > 0 seconds, got {value!r}")
        wait = self.shutdown_timeout
        if isinstance(wait, bool) or not isinstance(wait, (int, float)) or not 0 <= wait < float("inf"):
            raise ConfigError(f"--shutdown-timeout must be >= 0 seconds, got {wait!r}")
        if self.api_key is not None and (not self.api_key or not self.api_key.isprintable()
                                         or not self.api_key.isascii() or " " in self.api_key):
            raise ConfigError("--api-key must be printable ASCII without spaces (an HTTP header holds it)")
        for origin in self.allowed_origins or ():  # as a browser's Origin header gives it, to match
            if origin != "*" and not re.fullmatch(r"[A-Za-z][A-Za-z0-9+.-]*://[^/?#\s]+", origin):
                raise ConfigError(f"--allowed-origins takes '*' or an origin, a scheme and a host without a "
                                  f"path (http://localhost:3000), got {origin!r}")
