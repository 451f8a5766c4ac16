"""A causal LM from transformers with a KV cache that is extended and cropped, never re-prefilled.

``extend(ids)`` appends tokens to the cache and returns their logits; ``crop(n)`` keeps the first
``n`` cached tokens (after a rejection). The engine drives both the draft and the target with
these two calls.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from anyspec.backends.linear import (
    onednn_available,
    rowwise_available,
    rowwise_possible,
    rowwise_problem,
    swap_linears,
)
from anyspec.errors import ConfigError

DTYPES = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp16": torch.float16,
          "float16": torch.float16, "fp32": torch.float32, "float32": torch.float32,
          "int8": torch.float32}  # int8: weight-only int8 linears, fp32 elsewhere (backends/linear.py)
CANONICAL = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}


def cpu_has_bf16() -> bool:
    """True when this CPU computes bf16 natively (AVX-512 BF16 or AMX); else bf16 is emulated and slow."""
    if torch.cuda.is_available():
        return torch.cuda.is_bf16_supported()
    if torch.backends.cpu.get_cpu_capability() == "AVX512_BF16":
        return True
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("flags"):
                    flags = line.split()
                    return "avx512_bf16" in flags or "amx_bf16" in flags
    except OSError:
        pass
    return False


def resolve_dtype(dtype: str | torch.dtype | None, draft: bool = False) -> str:
    """The dtype's canonical name: ``bf16``, ``fp16``, ``fp32`` or ``int8``.

    ``auto`` (or None) is bf16 where the hardware has it or anyspec's AVX2 kernel can run it, else
    fp32; for a *draft* on the CPU it is int8, since the draft's numbers only change how much is
    accepted, never the output.
    """
    if dtype is None or dtype == "auto":
        if draft and not torch.cuda.is_available():
            return "int8"
        return "bf16" if cpu_has_bf16() or rowwise_possible() else "fp32"
    if isinstance(dtype, torch.dtype):
        dtype = str(dtype).split(".")[-1]
    if dtype not in DTYPES:
        raise ConfigError(f"unknown dtype {dtype!r}; use one of auto, bf16, fp16, fp32, int8")
    return CANONICAL.get(dtype, dtype)


class TransformersModel:
    """One model, its tokenizer and its KV cache. ``cached_ids`` are the tokens in the cache."""

    def __init__(self, model, tokenizer, name: str = "model", dtype: str | None = None):
        from transformers import DynamicCache

        self.model = model.eval()
        self.tokenizer = tokenizer
        self.name = name
        self.dtype = dtype or resolve_dtype(next(model.parameters()).dtype)
        self.vocab_size = int(model.config.get_text_config().vocab_size)
        self.device = next(model.parameters()).device
        self._new_cache = lambda: DynamicCache(config=model.config)
        self.cache = self._new_cache()
        self.cached_ids: list[int] = []

    row_invariant = False  # transformers' forward: rows may round differently in different batches

    @property
    def num_cached(self) -> int:
        return len(self.cached_ids)

    def reset(self) -> None:
        self.cache = self._new_cache()
        self.cached_ids = []

    @torch.inference_mode()
    def extend(self, ids: list[int], last: int | None = None) -> torch.Tensor:
        """Append ``ids`` to the cache; return float32 logits ``[len(ids), V]`` (or the ``last`` rows)."""
        input_ids = torch.tensor([ids], dtype=torch.long, device=self.device)
        keep = len(ids) if last is None else last
        out = self.model(input_ids=input_ids, past_key_values=self.cache, use_cache=True,
                         logits_to_keep=keep)
        self.cache = out.past_key_values
        self.cached_ids.extend(ids)
        return out.logits[0].float().cpu()  # the algorithms run on the CPU, whatever the device

    def crop(self, n: int) -> None:
        """Keep the first ``n`` cached tokens."""
        if n < self.num_cached:
            self.cache.crop(n - self.num_cached)
            del self.cached_ids[n:]

    def eos_ids(self) -> set[int]:
        """End-of-sequence ids from the generation config and the tokenizer."""
        ids: set[int] = set()
        gen = getattr(self.model, "generation_config", None)
        for value in (getattr(gen, "eos_token_id", None), getattr(self.tokenizer, "eos_token_id", None)):
            if isinstance(value, int):
                ids.add(value)
            elif value is not None:
                ids.update(int(v) for v in value)
        return ids


def check_model_path(spec: str, allow_download: bool = False) -> None:
    """Fail before loading unless ``spec`` is an existing model path, a built-in name or an allowed hub id."""
    path = Path(spec).expanduser()
    if path.exists():
        if path.is_dir() and not (path / "config.json").is_file() and not list(path.glob("*.gguf")):
            raise ConfigError(f"{spec} is a folder without config.json or a .gguf file; "
                              "point at a model folder")
        return
    try:
        from anyspec.models import MODELS
    except ImportError:
        MODELS = {}
    if spec in MODELS:
        return
    looks_like_path = spec.endswith(".gguf") or spec.startswith((".", "/", "~")) or spec.count("/") != 1
    if looks_like_path or not allow_download:
        builtin = f" or a built-in name ({', '.join(MODELS)})" if MODELS else ""
        raise ConfigError(f"model {spec} not found: give a model folder, a .gguf file{builtin}")


def load_model(spec: str, dtype: str | torch.dtype | None = None, device: str = "cpu",
               trust_remote_code: bool = False, allow_download: bool = False,
               name: str = "model") -> TransformersModel:
    """Load a model folder, a GGUF file (de-quantized by transformers), a built-in name or a hub id."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    check_model_path(spec, allow_download)
    path = Path(spec).expanduser()
    if not path.exists():
        path = _resolve_builtin(spec) or path
    dtype = resolve_dtype(dtype)
    if dtype == "int8" and device != "cpu":
        raise ConfigError("dtype int8 (weight-only int8 linears) runs on the CPU only; use bf16 on a GPU")
    kwargs = dict(dtype=DTYPES[dtype], trust_remote_code=trust_remote_code)
    if device == "cpu" and dtype == "bf16" and rowwise_available():
        # torch's bf16 CPU attention rounds a query row differently when it comes with others (0.16
        # logits apart in Qwen2.5-1.5B, enough to flip a tie); anyspec's scores each row alone. Also
        # on CPUs with native bf16, whose attention was not measured for this
        kwargs["attn_implementation"] = register_rowwise_attention()
    if path.is_dir() and not (path / "config.json").is_file():
        path = sorted(path.glob("*.gguf"))[0]
    try:
        if path.exists():
            from anyspec.vocab import load_tokenizer

            tokenizer = load_tokenizer(path)  # GGUF tokenizer conversions are cached
            if path.suffix == ".gguf":
                source, kwargs["gguf_file"] = str(path.parent), path.name
            else:
                source = str(path)
            kwargs["local_files_only"] = True
        else:  # a hub id, only with allow_download
            source = spec
            tokenizer = AutoTokenizer.from_pretrained(spec, trust_remote_code=trust_remote_code)
        model = AutoModelForCausalLM.from_pretrained(source, **kwargs).to(device)
    except OSError as exc:
        raise ConfigError(f"could not load model {spec}: {str(exc).splitlines()[0]}") from None
    if device == "cpu" and swap_cpu_kernels(model, dtype) in ("int8", "bf16"):
        from anyspec.backends.lean import LeanModel, lean_unsupported

        if lean_unsupported(model) is None:  # the row-wise kernel's models skip transformers' Python
            return LeanModel(model, tokenizer, name=name, dtype=dtype)
    return TransformersModel(model, tokenizer, name=name, dtype=dtype)


def register_rowwise_attention() -> str:
    from transformers import AttentionInterface

    from anyspec.backends.linear import rowwise_attention

    AttentionInterface.register("anyspec_rowwise", rowwise_attention)
    return "anyspec_rowwise"


def swap_cpu_kernels(model, dtype: str) -> str | None:
    """Put the fastest CPU linear kernel for ``dtype`` into ``model``; returns its name (None: torch's)."""
    kernel = None
    if dtype == "int8":
        kernel = "int8" if rowwise_available() else "int8-torch"
    elif dtype == "bf16" and not cpu_has_bf16():
        problem = rowwise_problem()
        if problem is None:
            kernel = "bf16"
        else:
            print(f"anyspec: warning: bf16 is emulated on this CPU and anyspec's kernel is unavailable "
                  f"({problem}); expect slow multi-token forwards, or use --dtype fp32", file=sys.stderr)
    elif dtype == "fp32" and onednn_available():
        kernel = "onednn"
    if kernel:
        swap_linears(model, kernel)
    return kernel


def _resolve_builtin(spec: str) -> Path | None:
    try:
        from anyspec.models import MODELS, resolve_model
    except ImportError:
        return None
    return Path(resolve_model(spec)) if spec in MODELS else None
