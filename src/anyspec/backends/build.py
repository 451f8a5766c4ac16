"""Building anyspec's CPU kernel: its C++ sources (``csrc/``), compiled once per torch version,
source and flags into ``cache_dir()/kernels``, and the instruction-set level it runs at (``ANYSPEC_ISA``).

On x86 the kernel is built with AVX2, FMA and F16C, and picks AVX2, AVX-512 VNNI or AMX at run time; on any
other machine it is built without x86 flags and runs its plain C++ (level 0), which computes the same
bits (``csrc/vec8.h``).
"""

from __future__ import annotations

import hashlib
import os
import platform
import sys
import threading
from pathlib import Path

import torch

from anyspec.errors import ConfigError
from anyspec.paths import cache_dir, held

CSRC = Path(__file__).parent / "csrc"
SOURCES = sorted(CSRC.glob("*.cpp"))
X86_FLAGS = ["-mavx2", "-mfma", "-mf16c"]
COMPILE_NOTICE_S = 5.0  # a kernel load taking longer is a compile (first use, or sources changed)
ISA_LEVELS = {"0": 0, "plain": 0, "1": 1, "avx2": 1, "2": 2, "avx512": 2, "3": 3, "amx": 3}


def limit_isa(kernel) -> None:
    """``ANYSPEC_ISA`` caps the kernel's instruction-set level (0 or plain: the C++ reference, 1 or
    avx2, 2 or avx512: AVX-512 VNNI, 3 or amx: AMX tiles for passes of many rows), to run an AVX-512
    machine the way an AVX2-only one runs, or an AMX one without its tiles. Every level computes the
    same bits; a level the CPU (or the build) lacks gives its best one.

    Level 3 is taken only when asked for (``ANYSPEC_ISA=amx`` where the CPU and the OS grant the
    tiles): it takes a pass to the tiles from ``ANYSPEC_AMX_ROWS`` activation rows (default 8),
    fewer to the best vector level. ``ANYSPEC_AMX_STANDIN=1`` runs it on the tiles' plain C++ stand-in,
    on any CPU (slow; for tests and for checking the tiling code where AMX is missing)."""
    rows = os.environ.get("ANYSPEC_AMX_ROWS")
    if rows is not None:
        if not rows.strip().isdigit() or int(rows) < 1:
            raise ConfigError(f"ANYSPEC_AMX_ROWS must be a whole number of rows, 1 or more, got {rows!r}")
        kernel.set_amx_rows(int(rows))
    standin = os.environ.get("ANYSPEC_AMX_STANDIN")
    if standin is not None:
        if standin.strip() not in ("0", "1"):
            raise ConfigError(f"ANYSPEC_AMX_STANDIN must be 0 or 1, got {standin!r}")
        kernel.set_amx_standin(standin.strip() == "1")
        kernel.set_isa(3 if kernel.amx_standin() else kernel.cpu_isa())  # ANYSPEC_ISA may cap it below
    wanted = os.environ.get("ANYSPEC_ISA")
    if wanted is None:
        return
    if wanted.strip().lower() not in ISA_LEVELS:
        raise ConfigError(f"ANYSPEC_ISA must be 0, 1, 2 or 3 (plain, avx2, avx512, amx), got {wanted!r}")
    kernel.set_isa(ISA_LEVELS[wanted.strip().lower()])


def is_x86(machine: str | None = None) -> bool:
    return (machine or platform.machine()).lower() in ("x86_64", "amd64", "i386", "i686")


def kernel_flags(machine: str | None = None) -> list[str]:
    """The compiler flags of the kernel on ``machine`` (default: this one)."""
    # -ffp-contract=off: every multiply-add is written out, so each instruction-set path (and the
    # plain C++ reference) rounds the same way
    return ["-O3", *(X86_FLAGS if is_x86(machine) else []), "-ffp-contract=off", "-fopenmp"]


def compile_kernel(name: str, sources: list[Path], build: Path, include: Path,
                   flags: list[str] | None = None):
    """The kernel's C++ sources compiled (or loaded, if ``build`` has them) as module ``name``.

    torch marks a build in progress with a ``lock`` file and waits, without a word, for as long as
    it exists; a compile that was interrupted leaves it behind. Here a build holds ``build.flock``
    (released by the system when its process ends, however it ends), so a ``lock`` found while
    holding it belongs to no running build and is removed."""
    from torch.utils.cpp_extension import load

    waiting = f"waiting for another process to finish building the CPU kernel in {build}"
    with held(build / "build.flock", waiting):
        if (build / "lock").exists():
            print("anyspec: removing the lock of an interrupted kernel build", file=sys.stderr)
            (build / "lock").unlink()
        notice = threading.Timer(COMPILE_NOTICE_S, print, ("anyspec: compiling its CPU kernel (a minute or "
                                                           "two on 2 free cores) ...",), {"file": sys.stderr})
        notice.daemon = True
        notice.start()  # loading a built kernel takes a second; building it takes minutes
        try:
            return load(name, [str(s) for s in sources], build_directory=str(build),
                        extra_cflags=kernel_flags() if flags is None else flags,
                        extra_include_paths=[str(include)], verbose=False)
        finally:
            notice.cancel()


def build_folder(prefix: str, flags: list[str]) -> Path:
    """The cache folder of a build with ``flags``: one per torch version, flags, sources and their
    folder (torch's build files name the sources by path: two checkouts sharing one folder would
    each recompile after the other's build)."""
    digest = hashlib.sha256(f"{torch.__version__} {' '.join(flags)} {CSRC.resolve()}".encode())
    for path in sorted(CSRC.glob("*.[ch]*")):
        digest.update(path.read_bytes())
    build = cache_dir() / "kernels" / f"{prefix}-{digest.hexdigest()[:16]}"
    build.mkdir(parents=True, exist_ok=True)
    return build


def build_kernel():
    """The kernel, built on first use and then loaded from the cache; or why it could not be built."""
    build = build_folder("rowwise", kernel_flags())
    try:
        return compile_kernel("anyspec_rowwise", SOURCES, build, CSRC)
    except Exception as exc:  # no compiler, no ninja, ...: say why, the caller picks another kernel
        reason = f"anyspec's CPU kernel could not be built ({type(exc).__name__}: {str(exc).splitlines()[0]})"
        print(f"anyspec: warning: {reason}", file=sys.stderr)
        return reason
