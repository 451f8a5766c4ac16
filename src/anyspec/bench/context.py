"""What every bench method reads: the loaded pair and the run's settings, and what the methods start
on first use and keep for the run (anyspec engines, transformers copies, vLLM engines, one
``llama-server``)."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class BenchContext:
    target: object  # the loaded target and draft (anyspec models)
    draft: object
    k: int
    temperature: float  # for anyspec-sampled
    seed: int
    max_new_tokens: int
    eos: set[int]  # the ids that end a generation (every method's output is cut at the first)
    dtype_name: str  # canonical dtype names (gguf, bf16, fp16, fp32, int8)
    draft_dtype: str | None
    threads: int
    engine_options: dict = field(default_factory=dict)  # SpeculativeConfig settings of every engine
    hf_assistant: str = "default"  # hf-uag: transformers' adaptive default, or "k"
    target_spec: str = ""  # as given: a built-in name, a folder or a GGUF file
    draft_spec: str = ""
    target_path: Path | str = ""  # folders for vLLM (a built-in's converted folder)
    draft_path: Path | str = ""
    llama_cpp_gguf: Path | None = None  # the target's GGUF file, for llama.cpp
    llama_cpp_ctx: int = 4096
    vllm_python: str | Path | None = None  # vLLM in a subprocess of this python, else in-process
    vllm_max_model_len: int | None = None
    # started on first use, kept for the run
    engines: dict = field(default_factory=dict)  # (draft, sampled, algorithm) -> Engine
    hf_target: object | None = None
    hf_draft: object | None = None
    vllm: dict = field(default_factory=dict)  # speculative? -> VllmProcess or vllm.LLM
    vllm_info: dict = field(default_factory=dict)  # method -> what ran (version, python, dtype)
    llama_cpp_url: str | None = None
    llama_cpp_stack: contextlib.ExitStack | None = None
