"""One way to load a model: resolve its dtype, check its path, then build the right backend.

A spec is a built-in name, a model folder, a ``.gguf`` file or (with ``allow_download``) a hub id.
On the CPU, ``--dtype auto`` runs GGUF models in their own block formats (``backends/gguf.py``),
draft and target; other models run through transformers with anyspec's row-wise kernels in their
linear layers and, for the Llama family, the lean forward (``backends/lean.py``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from anyspec.backends.linear import (
    kernels_off,
    onednn_available,
    rowwise_available,
    rowwise_possible,
    rowwise_problem,
    swap_linears,
)
from anyspec.backends.transformers import CANONICAL, DTYPES, TransformersModel, cpu_has_bf16, dtype_name
from anyspec.errors import ConfigError
from anyspec.vocab.gguf import is_gguf_file

NAMES = "auto, gguf, bf16, fp16, fp32, int8"


def builtin_names() -> tuple[str, ...]:
    from anyspec.models import MODELS

    return tuple(MODELS)


def native_builtin(spec: str) -> bool:
    from anyspec.models import MODELS

    return spec in MODELS and MODELS[spec].native


def gguf_source(spec: str) -> Path | None:
    """The GGUF file a spec names: the file (a name ending ``.gguf`` in any case, or GGUF's magic
    number), or a folder without ``config.json`` that holds one; else None (a built-in name too: it
    is fetched on load). A folder holding several is refused: which one runs is the user's choice."""
    path = Path(spec).expanduser()
    if path.is_file():
        return path if is_gguf_file(path) else None
    if path.is_dir() and not (path / "config.json").is_file():
        found = sorted(p for p in path.iterdir() if p.name.lower().endswith(".gguf") and p.is_file())
        if len(found) > 1:
            raise ConfigError(f"{spec} holds {len(found)} GGUF files ({', '.join(p.name for p in found[:4])}"
                              f"{', ...' if len(found) > 4 else ''}); give the path of the one to run")
        return found[0] if found else None
    return None


def known_context(spec: str) -> int | None:
    """The most tokens model ``spec`` reads, from its GGUF header or ``config.json``, before it loads
    (None where that is not known yet: a built-in model not fetched, a file that cannot be read)."""
    if spec in builtin_names():
        from anyspec.models import gguf_cached

        source = gguf_cached(spec) if native_builtin(spec) else None
    else:
        source = gguf_source(spec)
    if source is not None:
        from anyspec.backends.arch import context_of
        from anyspec.backends.gguf import read_gguf

        try:
            return context_of(read_gguf(source))[0]
        except (ConfigError, KeyError, TypeError, ValueError):
            return None
    try:
        config = folder_config(Path(spec).expanduser())
        n = (config.get("text_config") or config).get("max_position_embeddings")
    except (ConfigError, AttributeError):
        return None
    return n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else None


def is_gguf(spec: str) -> bool:
    return spec in builtin_names() or gguf_source(spec) is not None


def resolve_dtype(dtype: str | torch.dtype | None, draft: bool = False, spec: str | None = None) -> str:
    """The dtype's canonical name: ``gguf``, ``bf16``, ``fp16``, ``fp32`` or ``int8``.

    ``auto`` (or None) on the CPU is ``gguf`` for a GGUF model (the file's own formats) when anyspec's
    kernel can run it. Otherwise it is bf16 where the hardware has it or anyspec's AVX2 kernel can run
    it, else fp32; for a *draft* on the CPU it is int8, since the draft's numbers only change how much
    is accepted, never the output.
    """
    from anyspec.backends.gguf import check_consistent, dequantized_problem, gguf_problem, read_gguf

    if dtype is None or dtype == "auto":
        if spec is not None and is_gguf(spec) and not torch.cuda.is_available() and rowwise_possible():
            source = gguf_source(spec)
            if source is None and native_builtin(spec):
                return "gguf"
            if source is not None:
                check_consistent(source)
            problem = gguf_problem(source, read_gguf(source)) if source is not None else "its block types"
            if problem is None:
                return "gguf"
            if source is not None and (other := dequantized_problem(read_gguf(source))):
                raise ConfigError(f"{source.name} cannot run on anyspec's GGUF kernels ({problem}), nor "
                                  f"de-quantized ({other}); convert it to a supported architecture or type")
            print(f"anyspec: {source.name if source else spec} cannot run on the GGUF kernels ({problem}); "
                  "loading it de-quantized through transformers instead", file=sys.stderr)
        elif spec is not None and is_gguf(spec) and not torch.cuda.is_available():
            print(f"anyspec: {Path(spec).name} is a GGUF model and anyspec's kernels are off here "
                  f"({kernels_off()}); "
                  "loading it de-quantized through transformers instead", file=sys.stderr)
        if draft and not torch.cuda.is_available():
            return "int8"
        return "bf16" if cpu_has_bf16() or rowwise_possible() else "fp32"
    if isinstance(dtype, torch.dtype):
        dtype = dtype_name(dtype)
    if dtype == "gguf":
        if spec is not None and (not is_gguf(spec) or spec in builtin_names() and not native_builtin(spec)):
            raise ConfigError(f"dtype gguf runs a GGUF file's own formats, and {spec} is not a GGUF model; "
                              "give a .gguf file or a built-in name, or another dtype")
        if spec is not None and (source := gguf_source(spec)) is not None:
            check_consistent(source)
            problem = gguf_problem(source, read_gguf(source))
            if problem:
                name = "draft_dtype" if draft else "dtype"
                raise ConfigError(f"{source.name} cannot run on anyspec's GGUF kernels: {problem}; use "
                                  f"{name}='bf16' (--{name.replace('_', '-')} bf16) to run it de-quantized")
        return "gguf"
    if dtype not in DTYPES:
        raise ConfigError(f"unknown {'draft ' if draft else ''}dtype {dtype!r}; use one of {NAMES}")
    return CANONICAL.get(dtype, dtype)


KV_CACHE_DTYPES = {"fp32": torch.float32, "fp16": torch.float16}


def check_model_path(spec: str, allow_download: bool = False) -> None:
    """Fail before loading unless ``spec`` is an existing model path, a built-in name or an allowed hub id."""
    path = Path(spec).expanduser()
    if path.exists():
        source = gguf_source(spec)
        if path.is_dir() and not (path / "config.json").is_file() and source is None:
            raise ConfigError(f"{spec} is a folder without config.json or a .gguf file; "
                              "point at a model folder")
        if source is not None:
            from anyspec.backends.gguf import check_consistent

            check_consistent(source)  # a truncated, foreign or damaged file: one line now, not later
        elif path.is_file():
            raise ConfigError(f"{spec} is a file that is not a GGUF model; give a .gguf file or the model's "
                              "folder")
        elif path.is_dir():
            check_folder(path)
        return
    if spec in builtin_names():
        return
    looks_like_path = spec.endswith(".gguf") or spec.startswith((".", "/", "~")) or spec.count("/") != 1
    if looks_like_path or not allow_download:
        raise ConfigError(f"model {spec} not found: give a model folder, a .gguf file or a built-in name "
                          f"({', '.join(builtin_names())})")


def folder_config(path: Path) -> dict:
    """A model folder's ``config.json``, parsed."""
    try:
        return json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path / 'config.json'} cannot be read as JSON: {exc}") from None


def check_folder(path: Path) -> None:
    """A transformers model folder, read before anything loads: its ``config.json`` names a model
    type this transformers knows (or brings its own code), and each safetensors file's header holds
    together with the file's size."""
    from safetensors import SafetensorError, safe_open
    from transformers import CONFIG_MAPPING, __version__

    config = folder_config(path)
    kind = config.get("model_type") if isinstance(config, dict) else None
    if isinstance(config, dict) and "auto_map" not in config and kind not in CONFIG_MAPPING:
        raise ConfigError(f"{path}: model_type {kind!r} is not a model transformers {__version__} knows")
    for weights in sorted(path.glob("*.safetensors")):
        try:
            with safe_open(weights, "pt"):
                pass
        except (OSError, SafetensorError) as exc:
            raise ConfigError(f"{weights} is truncated or damaged ({str(exc).splitlines()[0]}); convert or "
                              "download it again") from None


def load_model(spec: str, dtype: str | torch.dtype | None = None, device: str = "cpu",
               trust_remote_code: bool = False, allow_download: bool = False, name: str = "model",
               kv_cache_dtype: str = "fp32"):
    """Load a built-in name, a model folder, a GGUF file or a hub id, with ``dtype`` (see
    resolve_dtype) and KV caches of ``kv_cache_dtype`` (KV_CACHE_DTYPES)."""
    check_model_path(spec, allow_download)
    dtype = resolve_dtype(dtype, spec=spec)
    check_kv_cache_dtype(kv_cache_dtype, dtype)
    if dtype == "gguf":
        if device != "cpu":
            raise ConfigError("dtype gguf (anyspec's GGUF kernels) runs on the CPU only; use bf16 on a GPU")
        from anyspec.backends.gguf import GGUFModel

        source = gguf_source(spec)
        if source is None:
            from anyspec.models import gguf_path

            source = gguf_path(spec)
        model = GGUFModel(source, name=name)
    else:
        model = load_transformers(spec, dtype, device, trust_remote_code, name)
    if len(model.tokenizer) > model.vocab_size:  # a prompt could hold ids the model has no row for
        raise ConfigError(f"{spec}: its tokenizer has {len(model.tokenizer):,} tokens and the model "
                          f"{model.vocab_size:,} embedding rows, so it is not this model's tokenizer")
    if kv_cache_dtype != "fp32":
        from anyspec.backends.stack import StackModel

        if not isinstance(model, StackModel):
            raise ConfigError(f"kv_cache_dtype {kv_cache_dtype} needs anyspec's decoder kernels, and "
                              f"{spec} runs on transformers at dtype {dtype}; leave the KV cache fp32",
                              "kv_cache_dtype")
        model.use_kv_dtype(KV_CACHE_DTYPES[kv_cache_dtype])
    return model


def check_context_cap(max_model_len: int, context: int | None) -> None:
    """``max_model_len`` within the target's own ``context`` (None: not known, so any)."""
    if context is not None and max_model_len > context:
        raise ConfigError(f"max_model_len {max_model_len} is more than the target's context of {context} "
                          f"tokens; give at most {context}, or leave it out", "max_model_len")


def check_kv_cache_dtype(kv_cache_dtype: str, dtype: str) -> None:
    """A KV cache type the kernels keep, for a model ``dtype`` that runs on them."""
    if kv_cache_dtype not in KV_CACHE_DTYPES:
        raise ConfigError(f"kv_cache_dtype must be {' or '.join(KV_CACHE_DTYPES)}, got {kv_cache_dtype!r}",
                          "kv_cache_dtype")
    if kv_cache_dtype != "fp32" and dtype not in ("gguf", "int8", "bf16"):
        raise ConfigError(f"kv_cache_dtype {kv_cache_dtype} needs anyspec's decoder kernels (dtype gguf, "
                          f"int8 or bf16), not dtype {dtype}", "kv_cache_dtype")


def load_transformers(spec: str, dtype: str, device: str, trust_remote_code: bool, name: str):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(spec).expanduser()
    if not path.exists() and spec in builtin_names():
        from anyspec.models import fetch_model

        path = fetch_model(spec)
    if dtype == "int8" and device != "cpu":
        raise ConfigError("dtype int8 (weight-only int8 linears) runs on the CPU only; use bf16 on a GPU")
    kwargs = dict(dtype=DTYPES[dtype], trust_remote_code=trust_remote_code)
    if device == "cpu" and dtype == "bf16" and rowwise_available():
        # torch's bf16 CPU attention rounds a query row differently when it comes with others (0.16
        # logits apart in Qwen2.5-1.5B, enough to flip a tie); anyspec's scores each row alone
        kwargs["attn_implementation"] = register_rowwise_attention()
    gguf = gguf_source(str(path))
    path = gguf or path
    try:
        if path.exists():
            from anyspec.vocab import load_tokenizer

            tokenizer = load_tokenizer(path)  # GGUF tokenizer conversions are cached
            if gguf is not None:
                source, kwargs["gguf_file"] = str(path.parent), path.name
            else:
                source = str(path)
            kwargs["local_files_only"] = True
        else:  # a hub id, only with allow_download
            source = spec
            tokenizer = AutoTokenizer.from_pretrained(spec, trust_remote_code=trust_remote_code)
        model = AutoModelForCausalLM.from_pretrained(source, **kwargs).to(device)
    except ConfigError:
        raise
    except Exception as exc:  # transformers' and safetensors' own errors on a folder or file they refuse
        first = (str(exc).strip().splitlines() or [""])[0]
        raise ConfigError(f"could not load model {spec}: {type(exc).__name__}: {first}") from None
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


def cpu_kernel(dtype: str) -> str | None:
    """The CPU linear kernel for ``dtype`` (None: torch's own).

    bf16 runs anyspec's row-wise kernel on every x86 CPU with AVX2, native-bf16 CPUs included:
    torch's native bf16 matmul rounds a row differently when other rows come with it.
    """
    if dtype == "int8":
        return "int8" if rowwise_available() else "int8-torch"
    if dtype == "bf16":
        problem = rowwise_problem()
        if problem is None:
            return "bf16"
        if not cpu_has_bf16():
            print(f"anyspec: warning: bf16 is emulated on this CPU and anyspec's kernel is unavailable "
                  f"({problem}); expect slow multi-token forwards, or use --dtype fp32", file=sys.stderr)
        return None
    if dtype == "fp32" and onednn_available():
        return "onednn"
    return None


def swap_cpu_kernels(model, dtype: str) -> str | None:
    """Put the CPU linear kernel for ``dtype`` into ``model``; returns its name (None: torch's)."""
    kernel = cpu_kernel(dtype)
    if kernel:
        swap_linears(model, kernel)
    return kernel
