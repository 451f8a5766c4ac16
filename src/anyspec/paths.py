"""Where anyspec keeps what it downloads and builds: one cache folder, found the same way by all."""

from __future__ import annotations

import contextlib
import os
import sys
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


@contextlib.contextmanager
def held(path: Path, waiting: str = ""):
    """An exclusive advisory lock on ``path`` for the ``with`` block; the system releases it when the
    process ends, however it ends. ``waiting`` is said on stderr if another process holds it. Without
    advisory locks (Windows) the block runs unlocked."""
    try:
        import fcntl
    except ImportError:
        yield
        return
    with open(path, "w") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if waiting:
                print(f"anyspec: {waiting}", file=sys.stderr)
            fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)
