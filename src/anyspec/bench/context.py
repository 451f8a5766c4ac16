"""``BenchSettings``: what a bench run is asked for, checked when made. ``BenchContext``: what every
bench method reads, the loaded pair and the run's settings, and what the methods start on first use
and keep for the run (anyspec engines, transformers copies, vLLM engines, one ``llama-server``)."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path

from anyspec.bench.llama_spec import DEFAULT_LLAMA_SPEC, llama_spec_args
from anyspec.bench.methods import METHODS
from anyspec.config import NO_SEED, SamplingParams, SpeculativeConfig
from anyspec.errors import ConfigError


@dataclass
class BenchSettings:
    target: str  # a built-in name, a folder or a GGUF file
    draft: str
    prompt_files: list[Path]
    methods: list[str]
    max_new_tokens: int = 64
    speculative: SpeculativeConfig = field(default_factory=SpeculativeConfig)  # every anyspec method's
    #   engine starts from it (its ngram as run.lookup_setting says); a draft_confidence, tree or ngram
    #   of None is the engine's default (proposers.tuned_confidence, tuned_tree, lookup.start)
    dtype: str | None = None
    draft_dtype: str | None = None
    kv_cache_dtype: str = "fp32"  # anyspec's KV caches (the other engines keep their own)
    also_draft_dtypes: list[str] = field(default_factory=list)  # each draft method again, as METHOD@DTYPE
    temperature: float = 0.7  # for anyspec-sampled
    top_p: float = 1.0  # for anyspec-sampled
    penalties: tuple[float, float] = (0.0, 0.0)  # presence and frequency, anyspec's methods'
    seed: int = 0
    threads: int | None = None
    limit: int | None = None  # at most this many prompts from each file
    repeat: int = 1  # the whole rotation this many times
    hf_assistant: str = "default"  # hf-uag: transformers' adaptive default, or "k" (the same fixed k)
    vllm_python: str | Path | None = None  # vLLM in a subprocess of this python, else in-process
    llama_spec: str = DEFAULT_LLAMA_SPEC  # llama.cpp-ngram's llama-server arguments (llama_spec.py)

    def __post_init__(self):
        llama_spec_args(self.llama_spec)
        SamplingParams(temperature=self.temperature, top_p=self.top_p, max_new_tokens=self.max_new_tokens,
                       seed=self.seed, presence_penalty=self.penalties[0],
                       frequency_penalty=self.penalties[1])
        if self.seed == NO_SEED:
            raise ConfigError("--seed -1 would give anyspec-sampled and target-sampled a random seed each, "
                              "whose answers differ; give a seed from 0 to 2**64 - 1")
        for name, value in (("--repeat", self.repeat), ("--limit", 1 if self.limit is None else self.limit)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name} must be an integer >= 1, got {value!r}")
        unknown = [m for m in self.methods if m not in METHODS]
        if unknown:
            raise ConfigError(f"unknown method(s) {', '.join(unknown)}; choose from {', '.join(METHODS)}")
        others = [m for m in self.methods if not m.startswith(("target", "anyspec"))]
        if any(self.penalties) and others:
            raise ConfigError(f"--presence-penalty and --frequency-penalty apply to anyspec's methods only; "
                              f"leave out {', '.join(others)}")


@dataclass
class BenchContext:
    target: object  # the loaded target and draft (anyspec models)
    draft: object
    speculative: SpeculativeConfig  # BenchSettings.speculative
    temperature: float  # for anyspec-sampled
    seed: int
    max_new_tokens: int
    eos: set[int]  # the ids that end a generation (every method's output is cut at the first)
    dtype_name: str  # canonical dtype names (gguf, bf16, fp16, fp32, int8)
    draft_dtype: str | None
    threads: int
    top_p: float = 1.0  # for anyspec-sampled
    penalties: tuple[float, float] = (0.0, 0.0)  # presence and frequency
    hf_assistant: str = "default"  # hf-uag: transformers' adaptive default, or "k"
    target_spec: str = ""  # as given: a built-in name, a folder or a GGUF file
    draft_spec: str = ""
    target_path: Path | str = ""  # folders for vLLM (a built-in's converted folder)
    draft_path: Path | str = ""
    llama_cpp_gguf: Path | None = None  # the target's GGUF file, for llama.cpp
    llama_cpp_ctx: int = 4096
    llama_spec: tuple[str, ...] = ()  # llama.cpp-ngram's checked llama-server arguments
    vllm_python: str | Path | None = None  # vLLM in a subprocess of this python, else in-process
    vllm_max_model_len: int | None = None
    drafts: dict = field(default_factory=dict)  # dtype -> the draft again in that dtype (METHOD@DTYPE)
    prefix_cache: bool = False  # a conversation's later turn: keep the prefix the earlier turns cached
    schema: dict | None = None  # the request's JSON Schema (the json set), for anyspec's methods
    prediction: str | None = None  # the request's prediction (the edit set's), for the *-predicted methods
    grammars: object = None  # engine.grammar.Grammars over the target's tokenizer, made on first use
    # started on first use, kept for the run
    engines: dict = field(default_factory=dict)  # (draft, sampled, algorithm) -> Engine
    hf_target: object | None = None
    hf_draft: object | None = None
    vllm: dict = field(default_factory=dict)  # speculative? -> VllmProcess or vllm.LLM
    vllm_info: dict = field(default_factory=dict)  # method -> what ran (version, python, dtype)
    llama_cpp_url: str | None = None
    llama_cpp_stack: contextlib.ExitStack | None = None
    llama_cpp_args: tuple[str, ...] | None = None  # the running server's extra arguments

    @property
    def k(self) -> int:
        return self.speculative.num_speculative_tokens
