"""Random-weight models of each architecture, written to GGUF by llama.cpp's own converter.

transformers builds the model (``tiny_model``), ``convert_hf_to_gguf.py`` from the pinned
llama-cpp-python sdist (with its own ``gguf-py``) writes the file (``to_gguf``), so the file is laid
out exactly as the files users download, whatever anyspec believes about the format. The q and k
projections are scaled up so that attention is sharp: a wrong rotary angle or window then changes
the logits a lot instead of barely.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

from tokenizer_files import LLAMA_CPP, _registry

from anyspec.fetch import download_package, sha256_file
from anyspec.paths import cache_dir

SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
CONVERTER_PARTS = ("convert_hf_to_gguf.py", "conversion/", "gguf-py/")


def converter() -> Path:
    """llama.cpp's ``convert_hf_to_gguf.py``, unpacked once from the pinned sdist into the cache."""
    folder = cache_dir() / "test-files" / f"llama-convert-{LLAMA_CPP[1]}"
    script = folder / "convert_hf_to_gguf.py"
    if (folder / ".complete").is_file():
        return script
    archive = _registry(lambda: download_package(*LLAMA_CPP, sdist=True))
    if sha256_file(archive) != SDIST_SHA256:
        raise AssertionError(f"{archive} does not match its pinned sha256; delete it and fetch again")
    prefix = f"llama_cpp_python-{LLAMA_CPP[1]}/vendor/llama.cpp/"
    with tarfile.open(archive) as tar:
        members = []
        for m in tar.getmembers():
            rel = m.name[len(prefix):] if m.name.startswith(prefix) else None
            if rel and (rel.startswith(CONVERTER_PARTS[1:]) or rel == CONVERTER_PARTS[0]) and m.isfile():
                m.name = rel
                members.append(m)
        tar.extractall(folder, members=members, filter="data")
    (folder / ".complete").write_text("ok")
    return script


def to_gguf(folder: Path, out: Path, outtype: str = "f32") -> Path:
    """The transformers model in ``folder`` as a GGUF file (``outtype``: f32, f16, bf16 or q8_0)."""
    env = {k: v for k, v in os.environ.items() if k != "NO_LOCAL_GGUF"}
    proc = subprocess.run([sys.executable, str(converter()), str(folder), "--outtype", outtype,
                           "--outfile", str(out)], capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise AssertionError(f"convert_hf_to_gguf.py failed:\n{proc.stderr[-3000:]}")
    return out


CONFIGS = {
    "llama": "LlamaConfig", "qwen3": "Qwen3Config", "phi3": "Phi3Config", "gemma3": "Gemma3TextConfig",
    "gemma2": "Gemma2Config", "granite": "GraniteConfig", "smollm3": "SmolLM3Config", "qwen2": "Qwen2Config",
}
MODELS = {"gemma3": "Gemma3ForCausalLM"}


def tiny_model(arch: str, tokenizer, folder: Path, seed: int = 0, sharp: float = 4.0, layers: int = 2,
               spm: Path | None = None, **config):
    """A random-weight ``arch`` model with ``tokenizer``'s vocabulary, saved to ``folder``; returns it
    (fp32). ``spm``: the tokenizer's SentencePiece model, for converters that read only that."""
    import torch
    import transformers

    base = dict(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=1024,
                bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                tie_word_embeddings=False)
    base.update(config)
    base = {k: v for k, v in base.items() if v is not None}  # None: the config class's default
    cfg = getattr(transformers, CONFIGS[arch])(**base)
    torch.manual_seed(seed)
    model_class = getattr(transformers, MODELS.get(arch, "AutoModelForCausalLM"))
    model = (model_class(cfg) if arch in MODELS else model_class.from_config(cfg)).float().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if any(k in name for k in ("q_proj", "k_proj", "qkv_proj")) and name.endswith("weight"):
                p.mul_(sharp)
            elif "norm" in name and arch.startswith("gemma"):  # (1 + w) norms: spread them around 1
                p.normal_(0.0, 0.2)
            elif "norm" in name:
                p.normal_(1.0, 0.2)
    folder = Path(folder)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    if spm is not None:
        shutil.copyfile(spm, folder / "tokenizer.model")
    if arch == "phi3":  # the converter reads a byte-level BPE vocabulary as Phi-4's (GPT2Tokenizer)
        config_file = folder / "tokenizer_config.json"
        settings = json.loads(config_file.read_text())
        settings["tokenizer_class"] = "GPT2Tokenizer"
        config_file.write_text(json.dumps(settings))
    return model
