"""Where anyspec keeps what it downloads and builds: one cache folder, found the same way by all."""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

from anyspec.errors import ConfigError


def cache_dir() -> Path:
    """Root of anyspec's on-disk cache: ``$ANYSPEC_CACHE_DIR`` or the per-user cache folder."""
    root = os.environ.get("ANYSPEC_CACHE_DIR") or platformdirs.user_cache_dir("anyspec")
    path = Path(root).expanduser()
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"cannot use {path} as anyspec's cache ({exc.strerror or exc}); "
                          "set ANYSPEC_CACHE_DIR to a writable folder") from None
    return path
