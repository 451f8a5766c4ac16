"""A causal LM from transformers with a KV cache that is extended and cropped, never re-prefilled.

``extend(ids)`` appends tokens to the cache and returns their logits; ``crop(n)`` keeps the first
``n`` cached tokens (after a rejection). The engine drives both the draft and the target with
these two calls.
"""

from __future__ import annotations

import inspect

import torch

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


def dtype_name(dtype: torch.dtype) -> str:
    name = str(dtype).split(".")[-1]
    return CANONICAL.get(name, name)


def cache_argument(model) -> str:
    """The name of ``model.forward``'s KV cache argument: transformers 5.24 renamed past_key_values
    to cache (the old name goes in 5.40)."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


class Pretrained:
    """A transformers model and its tokenizer, without a cache: its name, dtype, vocabulary size,
    context length, device and end-of-sequence ids."""

    def __init__(self, model, tokenizer, name: str = "model", dtype: str | None = None):
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.name = name
        self.dtype = dtype or dtype_name(next(model.parameters()).dtype)
        self.vocab_size = int(model.config.get_text_config().vocab_size)
        self.context_length = getattr(model.config.get_text_config(), "max_position_embeddings", None)
        self.device = next(model.parameters()).device

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


class TransformersModel(Pretrained):
    """One model, its tokenizer and its KV cache. ``cached_ids`` are the tokens in the cache."""

    def __init__(self, model, tokenizer, name: str = "model", dtype: str | None = None):
        from transformers import DynamicCache

        super().__init__(model, tokenizer, name=name, dtype=dtype)
        self._new_cache = lambda: DynamicCache(config=model.config)
        self.cache = self._new_cache()
        self.cached_ids: list[int] = []
        self._cache_arg = cache_argument(model)

    row_invariant = False  # transformers' forward: rows may round differently in different batches
    tree_attention = False
    kernel_level = None  # torch's products, not anyspec's kernels

    @property
    def num_cached(self) -> int:
        return len(self.cached_ids)

    def reset(self) -> None:
        self.cache = self._new_cache()
        self.cached_ids = []

    @torch.no_grad()  # not inference_mode: its tensors (caches, logits) could not be written later
    def extend(self, ids: list[int], last: int | None = None) -> torch.Tensor:
        """Append ``ids`` to the cache; return float32 logits ``[len(ids), V]`` (or the ``last`` rows)."""
        input_ids = torch.tensor([ids], dtype=torch.long, device=self.device)
        keep = len(ids) if last is None else last
        out = self.model(input_ids=input_ids, use_cache=True, logits_to_keep=keep,
                         **{self._cache_arg: self.cache})
        self.cache = getattr(out, self._cache_arg)
        self.cached_ids.extend(ids)
        return out.logits[0].float().cpu()  # the algorithms run on the CPU, whatever the device

    def crop(self, n: int) -> None:
        """Keep the first ``n`` cached tokens."""
        if n < self.num_cached:
            self.cache.crop(n - self.num_cached)
            del self.cached_ids[n:]
