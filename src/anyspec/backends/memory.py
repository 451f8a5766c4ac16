"""Giving the memory of freed models back to the system.

A model's weights, KV caches and vocabulary tables are many allocations; once they are freed,
glibc's malloc keeps the pages for the process's next allocations, so the process stays as large as
it was. ``release_memory`` drops what anyspec caches of the files it read, collects reference
cycles (transformers' modules hold some) and hands malloc's free pages back (``trim_heap``).
"""

from __future__ import annotations

import ctypes
import gc

from anyspec.backends.gguf_file import forget_readers


def trim_heap() -> bool:
    """Return the free pages malloc keeps to the system (glibc's ``malloc_trim(0)``). False, having
    done nothing, where the C library has no ``malloc_trim`` (not glibc): there malloc's own policy
    decides."""
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError, TypeError):  # no malloc_trim, or no C library to open by None
        return False
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    trim(0)
    return True


def release_memory() -> None:
    """Free what no one holds any more and give it back: the GGUF readers' memory maps (the header
    cache, ``gguf_file.forget_readers``), objects kept only by reference cycles, then malloc's free
    pages (``trim_heap``)."""
    forget_readers()
    gc.collect()
    trim_heap()
