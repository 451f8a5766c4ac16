"""The bench's run: every check first, then the models, then every prompt through every method in
a rotating order, each greedy output compared with the target's (``anyspec.bench``)."""

from __future__ import annotations

import platform
import sys
import time
from pathlib import Path

from anyspec.bench.context import BenchContext
from anyspec.bench.hf import run_hf
from anyspec.bench.llama import (
    LlamaCppUnavailable,
    close_llama_cpp,
    llama_cpp_problem,
    run_llama_cpp,
    target_gguf,
)
from anyspec.bench.methods import METHODS, VLLM_METHODS
from anyspec.bench.prompts import load_prompts, prompt_ids
from anyspec.bench.report import summarize
from anyspec.bench.vllm import VllmUnavailable, close_all, run_vllm, unavailable, vllm_max_model_len
from anyspec.config import DRAFT_CONFIDENCE, NUM_SPECULATIVE_TOKENS, SpeculativeConfig
from anyspec.engine.prompt import end_ids
from anyspec.errors import ConfigError

UNAVAILABLE = (VllmUnavailable, LlamaCppUnavailable)


# ---- methods: each returns {"ids", "text", "seconds", "drafted", "accepted"} -------------------------

def run_anyspec(ctx: BenchContext, prompt, sampled: bool, draft: bool = True, algorithm: str = "tli") -> dict:
    from anyspec.engine import Engine, SamplingParams

    key = (draft, sampled, algorithm)
    if key not in ctx.engines:
        config = SpeculativeConfig(num_speculative_tokens=ctx.k, algorithm=algorithm,
                                   draft_sample_method="sample" if sampled else "greedy",
                                   prefix_cache=False,  # every run prefills its whole prompt, as HF's does
                                   **ctx.engine_options)
        ctx.engines[key] = Engine(ctx.target, ctx.draft if draft else None, config)
    params = SamplingParams(temperature=ctx.temperature if sampled else 0.0,
                            max_new_tokens=ctx.max_new_tokens, seed=ctx.seed if sampled else None)
    t = time.perf_counter()
    res = ctx.engines[key].generate(prompt, params)
    dt = time.perf_counter() - t
    return {"ids": list(res.token_ids), "text": res.text, "seconds": dt,
            "drafted": res.stats.drafted if draft else None,
            "accepted": res.stats.accepted if draft else None}


RUNNERS = {
    "target": lambda ctx, p: run_anyspec(ctx, p, sampled=False, draft=False),
    "anyspec-greedy": lambda ctx, p: run_anyspec(ctx, p, sampled=False),
    "anyspec-slem": lambda ctx, p: run_anyspec(ctx, p, sampled=False, algorithm="slem"),
    "anyspec-sampled": lambda ctx, p: run_anyspec(ctx, p, sampled=True),
    "hf-target": lambda ctx, p: run_hf(ctx, p, assisted=False),
    "hf-uag": lambda ctx, p: run_hf(ctx, p, assisted=True),
    "vllm-target": lambda ctx, p: run_vllm(ctx, prompt_ids(ctx.target.tokenizer, p), draft=False),
    "vllm": lambda ctx, p: run_vllm(ctx, prompt_ids(ctx.target.tokenizer, p)),
    "llama.cpp": lambda ctx, p: run_llama_cpp(ctx, prompt_ids(ctx.target.tokenizer, p)),
}


def available(methods: list[str], vllm_python: str | Path | None = None,
              target: str | None = None) -> tuple[list[str], dict[str, str]]:
    """The methods that can run here, and a note for each one skipped."""
    notes = {}
    if "llama.cpp" in methods and (note := llama_cpp_problem(target_gguf(target) or target)):
        notes["llama.cpp"] = note
    wanted = [m for m in methods if m in VLLM_METHODS]
    note = unavailable(vllm_python) if wanted else None
    if note:
        notes.update(dict.fromkeys(wanted, note))
    if any(m.startswith("anyspec") or m == "target" for m in methods):
        try:
            import anyspec.engine  # noqa: F401
        except ImportError as exc:
            for m in methods:
                if m.startswith("anyspec") or m == "target":
                    notes[m] = f"the anyspec engine does not import ({exc}); skipped"
    return [m for m in methods if m not in notes], notes


# ---- comparison ----------------------------------------------------------------------------------

def first_difference(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def logit_margin(target, prompt, ref: list[int], pos: int) -> float:
    """The target's top-1 minus top-2 logit for the token at ``pos`` after ``prompt + ref[:pos]``.

    Scored by anyspec's target (the reference's own forward: lean or transformers'), in fp32.
    """
    import torch

    ids = prompt_ids(target.tokenizer, prompt) + ref[:pos]
    target.reset()
    logits = target.extend(ids, last=1)[-1]
    target.reset()
    top = torch.topk(logits, 2).values
    return float(top[0] - top[1])


# ---- the run -------------------------------------------------------------------------------------

def run_bench(target: str, draft: str, prompt_files: list[Path], methods: list[str], max_new_tokens: int = 64,
              k: int = NUM_SPECULATIVE_TOKENS, dtype: str | None = None, temperature: float = 0.7,
              seed: int = 0,
              threads: int | None = None, limit: int | None = None, hf_assistant: str = "default",
              draft_dtype: str | None = None, adaptive_k: bool = False, vllm_python: str | Path | None = None,
              log=print, draft_confidence: float = DRAFT_CONFIDENCE, repeat: int = 1) -> dict:
    """Every check first (settings, methods, prompt files, the pair), then load and run."""
    import torch

    from anyspec.config import SamplingParams
    from anyspec.pair import check_pair, load_pair

    engine_options = {"adaptive_k": adaptive_k, "draft_confidence": draft_confidence}
    SpeculativeConfig(num_speculative_tokens=k, **engine_options)
    SamplingParams(temperature=temperature, max_new_tokens=max_new_tokens, seed=seed)
    for name, value in (("--repeat", repeat), ("--limit", 1 if limit is None else limit)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{name} must be an integer >= 1, got {value!r}")
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise ConfigError(f"unknown method(s) {', '.join(unknown)}; choose from {', '.join(METHODS)}")
    prompts = [p for f in prompt_files for p in load_prompts(f)[:limit]]
    plan = check_pair(target, draft, dtype, draft_dtype, threads)
    methods, notes = available(methods, vllm_python, target)
    t = time.perf_counter()
    tgt, drf, _ = load_pair(plan)
    dtype, draft_dtype = plan.dtype, plan.draft_dtype
    log(f"loaded {target} ({dtype}) + {draft} ({draft_dtype}) in {time.perf_counter() - t:.1f}s; "
        f"{torch.get_num_threads()} threads")
    from anyspec.models import MODELS, resolve_model

    ctx = BenchContext(target=tgt, draft=drf, k=k, temperature=temperature, seed=seed,
                       max_new_tokens=max_new_tokens, eos=end_ids(tgt), dtype_name=dtype,
                       draft_dtype=draft_dtype, threads=threads or torch.get_num_threads(),
                       engine_options=engine_options, hf_assistant=hf_assistant, target_spec=target,
                       draft_spec=draft, target_path=resolve_model(target) if target in MODELS else target,
                       draft_path=resolve_model(draft) if draft in MODELS else draft,
                       llama_cpp_gguf=target_gguf(target), vllm_python=vllm_python)
    if any(m in VLLM_METHODS for m in methods):
        ctx.vllm_max_model_len = vllm_max_model_len(
            [len(prompt_ids(tgt.tokenizer, p["prompt"])) for p in prompts], max_new_tokens, k)
    try:
        runs = _run_all(ctx, prompts * repeat, methods, notes, log)
    finally:
        close_all(ctx)
        close_llama_cpp(ctx)
    return {"config": {"target": target, "draft": draft, "dtype": dtype, "draft_dtype": draft_dtype, "k": k,
                       **engine_options, "repeat": repeat,
                       "max_new_tokens": max_new_tokens, "temperature": temperature, "seed": seed,
                       "threads": torch.get_num_threads(), "prompts": [str(f) for f in prompt_files],
                       "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
                       "torch": torch.__version__, "python": sys.version.split()[0],
                       "hf_uag": "transformers generate() defaults (adaptive number of assistant tokens)"
                       if hf_assistant == "default" else f"fixed {k} assistant tokens",
                       **({"vllm": ctx.vllm_info} if ctx.vllm_info else {})},
            "notes": notes, "runs": runs, "summary": summarize(runs)}


def _run_all(ctx: BenchContext, prompts: list[dict], methods: list[str], notes: dict, log) -> list[dict]:
    """Warm every method up, then every prompt through every method in an order that rotates from
    one prompt to the next (a prompt listed again, for ``--repeat``, gets its next rotation). A
    vLLM method that cannot run (or whose subprocess dies) is dropped with a note."""
    methods = list(methods)
    max_new_tokens, ctx.max_new_tokens = ctx.max_new_tokens, 4
    for m in list(methods):
        try:
            RUNNERS[m](ctx, [{"role": "user", "content": "Say hi."}])
        except UNAVAILABLE as exc:
            notes[m] = str(exc)
            methods.remove(m)
            log(f"  {m}: {exc}")
    ctx.max_new_tokens = max_new_tokens

    runs = []
    for i, p in enumerate(prompts):
        if not methods:
            break
        order = methods[i % len(methods):] + methods[:i % len(methods)]
        for m in order:
            try:
                r = RUNNERS[m](ctx, p["prompt"])
            except UNAVAILABLE as exc:
                notes[m] = str(exc)
                methods.remove(m)
                log(f"  {m}: {exc}")
                continue
            r.update(method=m, prompt=p["id"], set=p["set"], order=order.index(m),
                     repeat=sum(q["id"] == p["id"] for q in prompts[:i]))
            runs.append(r)
            log(f"  {p['set']}/{p['id']:<18} {m:<16} {len(r['ids']):>4} tok {r['seconds']:7.2f}s "
                f"{len(r['ids']) / r['seconds']:6.2f} tok/s")
        ref = next((r for r in runs if r["prompt"] == p["id"] and r["method"] == "target"), None)
        for r in runs:
            if r["prompt"] != p["id"] or r["method"] == "target" or r["method"] == "anyspec-sampled" \
                    or ref is None:
                continue
            pos = first_difference(ref["ids"], r["ids"])
            r["identical"] = pos is None
            if pos is not None:
                r["diff_pos"] = pos
                r["diff_margin"] = (logit_margin(ctx.target, p["prompt"], ref["ids"], pos)
                                    if pos < len(ref["ids"]) else None)
    return runs
