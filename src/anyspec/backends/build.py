"""Building anyspec's CPU kernel: its C++ sources (``csrc/``), compiled once per torch version and
source into ``cache_dir()/kernels``, and the instruction-set level it runs at (``ANYSPEC_ISA``)."""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

import torch

from anyspec.errors import ConfigError
from anyspec.paths import cache_dir

CSRC = Path(__file__).parent / "csrc"
SOURCES = [CSRC / "rowwise_linear.cpp", CSRC / "decoder.cpp", CSRC / "quant.cpp", CSRC / "x16.cpp"]
ISA_LEVELS = {"0": 0, "plain": 0, "1": 1, "avx2": 1, "2": 2, "avx512": 2}


def limit_isa(kernel) -> None:
    """``ANYSPEC_ISA`` caps the kernel's instruction-set level (0 or plain: the C++ reference, 1 or
    avx2, 2 or avx512: AVX-512 VNNI), to run an AVX-512 machine the way an AVX2-only one runs. Every
    level computes the same bits; a level the CPU lacks gives its best one."""
    wanted = os.environ.get("ANYSPEC_ISA")
    if wanted is None:
        return
    if wanted.strip().lower() not in ISA_LEVELS:
        raise ConfigError(f"ANYSPEC_ISA must be 0, 1 or 2 (plain, avx2, avx512), got {wanted!r}")
    kernel.set_isa(ISA_LEVELS[wanted.strip().lower()])


def compile_kernel(name: str, sources: list[Path], build: Path, include: Path):
    """The kernel's C++ sources compiled (or loaded, if ``build`` has them) as module ``name``."""
    from torch.utils.cpp_extension import load

    # -ffp-contract=off: every multiply-add is written out, so each instruction-set path (and the
    # plain C++ reference) rounds the same way
    return load(name, [str(s) for s in sources], build_directory=str(build),
                extra_cflags=["-O3", "-mavx2", "-mfma", "-mf16c", "-ffp-contract=off", "-fopenmp"],
                extra_include_paths=[str(include)], verbose=False)


def build_kernel():
    """The kernel, built on first use and then loaded from the cache; or why it could not be built."""
    digest = hashlib.sha256(torch.__version__.encode())
    for path in [*SOURCES, CSRC / "quant.h", CSRC / "stack.h"]:
        digest.update(path.read_bytes())
    build = cache_dir() / "kernels" / f"rowwise-{digest.hexdigest()[:16]}"
    build.mkdir(parents=True, exist_ok=True)
    if not list(build.glob("*.so")):
        print("anyspec: compiling its CPU kernel once (about a minute) ...", file=sys.stderr)
    try:
        return compile_kernel("anyspec_rowwise", SOURCES, build, CSRC)
    except Exception as exc:  # no compiler, no ninja, ...: say why, the caller picks another kernel
        reason = f"anyspec's CPU kernel could not be built ({type(exc).__name__}: {str(exc).splitlines()[0]})"
        print(f"anyspec: warning: {reason}", file=sys.stderr)
        return reason
