"""A GGUF file's header, read once per process with the ``gguf`` package, fast.

``gguf.GGUFReader`` builds a numpy view per metadata array element, each sliced from an
``np.memmap`` whose ``__getitem__`` and ``__array_finalize__`` run in Python, so a large vocabulary
(its tokens, merges and token types) dominates the start of every command. ``Reader`` is that
reader with two shortcuts that build the same fields and tensors (``test_gguf.py`` compares them
part by part): slices come from a plain ndarray over the same map, and an array of strings or
numbers is walked in one loop instead of one recursive call per element (docs/benchmarks.md,
"Start-up").
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np

from anyspec.errors import ConfigError


def read_gguf(path: Path):
    """The file's ``GGUFReader`` (memory-mapped); a one-line ConfigError for a truncated or foreign file.

    Checking a spec, resolving its dtype and loading it all need the header: a file is parsed once
    while its size and modification time stay the same.
    """
    path = Path(path)
    try:
        st = path.stat()
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror or exc}") from None
    return _read(str(path.resolve()), st.st_size, st.st_mtime_ns)


def forget_readers() -> None:
    """Drop the cached readers. Each holds its file's memory map, whose pages count as the process's
    resident memory once read; a model keeps the map of the rows it runs on by itself."""
    _read.cache_clear()


@functools.lru_cache(maxsize=4)
def _read(path: str, size: int, mtime_ns: int):
    try:
        reader = reader_class()(path, "r")
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror or exc}") from None
    except Exception:  # the reader raises ValueError, struct and numpy errors on bad bytes
        with open(path, "rb") as fh:
            magic = fh.read(4)
        if magic == b"GGUF":  # the reader's own words name numpy internals, not the file's fault
            size = Path(path).stat().st_size
            raise ConfigError(f"{path} is truncated or damaged ({size:,} bytes, its header or tensor table "
                              "cannot be read); fetch it again") from None
        raise ConfigError(f"{path} is not a readable GGUF file (it does not start with GGUF); "
                          "give a .gguf model file") from None
    if reader.byte_order != "I":
        raise ConfigError(f"{path} is a big-endian GGUF, which anyspec does not read; convert it with "
                          "gguf-py's gguf_convert_endian.py to little-endian")
    if (split := reader.fields.get("split.count")) is not None and int(split.parts[-1][0]) > 1:
        raise ConfigError(f"{path} is one part of a GGUF split into {int(split.parts[-1][0])} files; merge "
                          "them into one with llama.cpp's llama-gguf-split --merge")
    end = max((t.data_offset + t.n_bytes for t in reader.tensors), default=0)
    if end > size:
        raise ConfigError(f"{path} is truncated ({size:,} bytes, its tensors need {end:,}); fetch it again")
    return reader


@functools.cache
def reader_class():
    """``Reader``, defined on first use so that importing this module does not import ``gguf``."""
    from gguf import GGUFReader, GGUFValueType

    class Reader(GGUFReader):
        def _flat(self) -> np.ndarray:
            """The map as a plain ndarray: its slices skip np.memmap's Python-level hooks."""
            if "_plain" not in self.__dict__:
                self._plain = self.data.view(np.ndarray)
            return self._plain

        def _get(self, offset, dtype, count=1, override_order=None):
            count = int(count)
            arr = self._flat()[offset:offset + np.dtype(dtype).itemsize * count].view(dtype=dtype)[:count]
            order = self.byte_order if override_order is None else override_order
            return arr.view(arr.dtype.newbyteorder(order))

        def _get_field_parts(self, orig_offs, raw_type):
            if raw_type != GGUFValueType.ARRAY or self.byte_order != "I":
                return super()._get_field_parts(orig_offs, raw_type)
            raw_itype = self._get(orig_offs, np.uint32)
            count = self._get(orig_offs + 4, np.uint64)
            item, n, offs = GGUFValueType(raw_itype[0]), int(count[0]), orig_offs + 12
            scalar = self.gguf_scalar_to_np.get(item)
            if n == 0 or (item != GGUFValueType.STRING and scalar is None):
                return super()._get_field_parts(orig_offs, raw_type)
            flat = self._flat()
            size = 8 if scalar is None else np.dtype(scalar).itemsize  # a string takes 8 bytes or more
            if offs + n * size > len(flat):
                raise ValueError("an array runs past the end of the file")
            parts, idxs = [raw_itype, count], []
            if scalar is not None:
                values = flat[offs:offs + size * n].view(scalar)
                parts += [values[i:i + 1] for i in range(n)]
                idxs = list(range(2, 2 + n))
                offs += size * n
            else:
                raw = memoryview(flat)
                for i in range(n):
                    length = int.from_bytes(raw[offs:offs + 8], "little")
                    if offs + 8 + length > len(flat):
                        raise ValueError("a string runs past the end of the file")
                    parts += [flat[offs:offs + 8].view(np.uint64), flat[offs + 8:offs + 8 + length]]
                    idxs.append(3 + 2 * i)
                    offs += 8 + length
            return offs - orig_offs, parts, idxs, [GGUFValueType.ARRAY, item]

    return Reader
