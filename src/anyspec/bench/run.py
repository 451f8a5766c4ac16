"""The bench's run: every check first, then the models, then every prompt through every method in
a rotating order, each greedy output compared with the target's (``anyspec.bench``)."""

from __future__ import annotations

import platform
import sys
import time
from dataclasses import replace
from pathlib import Path

from anyspec.bench.context import BenchContext, BenchSettings
from anyspec.bench.hf import run_hf
from anyspec.bench.llama import (
    LlamaCppUnavailable,
    close_llama_cpp,
    llama_cpp_bin,
    llama_cpp_problem,
    run_llama_cpp,
    target_gguf,
)
from anyspec.bench.llama_spec import llama_spec_args
from anyspec.bench.methods import DRAFT_METHODS, LLAMA_CPP_METHODS, PREDICTED, VLLM_METHODS, base
from anyspec.bench.prompts import conversation, load_prompts, longest_request, prompt_ids
from anyspec.bench.report import summarize
from anyspec.bench.timing import engine_timings
from anyspec.bench.vllm import VllmUnavailable, close_all, run_vllm, unavailable, vllm_max_model_len
from anyspec.config import AUTO_NGRAM
from anyspec.engine.prompt import end_ids
from anyspec.errors import ConfigError

UNAVAILABLE = (VllmUnavailable, LlamaCppUnavailable)


# ---- methods: each returns {"ids", "text", "seconds", "drafted", "accepted"} -------------------------

def run_anyspec(ctx: BenchContext, prompt, sampled: bool, draft: bool = True, algorithm: str = "tli",
                draft_dtype: str | None = None, ngram: bool = False, chain: bool = False,
                predicted: bool = False) -> dict:
    """``draft_dtype``: one of ``ctx.drafts``, the draft loaded again in that dtype (else the pair's);
    ``ngram``: with prompt lookup always (``lookup_setting``); ``chain``: no branches beside the
    chain (tree=0); ``predicted``: with the prompt's prediction (``ctx.prediction``). The prefix
    cache is on only where ``ctx.prefix_cache`` says (a conversation's later turns)."""
    from anyspec.engine import Engine, SamplingParams

    key = (draft, sampled, algorithm, draft_dtype, ngram, chain, ctx.prefix_cache, predicted)
    if key not in ctx.engines:
        chained = {"tree": 0} if chain else {}
        config = replace(ctx.speculative, algorithm=algorithm,
                         draft_sample_method="sample" if sampled else "greedy",
                         prefix_cache=ctx.prefix_cache,  # else the whole prompt, as HF's
                         ngram=lookup_setting(ctx.speculative.ngram, draft or predicted, ngram), **chained)
        model = ctx.drafts[draft_dtype] if draft_dtype else ctx.draft
        ctx.engines[key] = Engine(ctx.target, model if draft else None, config)
    params = SamplingParams(temperature=ctx.temperature if sampled else 0.0,
                            top_p=ctx.top_p if sampled else 1.0, max_new_tokens=ctx.max_new_tokens,
                            presence_penalty=ctx.penalties[0], frequency_penalty=ctx.penalties[1],
                            seed=ctx.seed if sampled else None,
                            grammar=schema_grammar(ctx) if ctx.schema is not None else None,
                            prediction=ctx.prediction if predicted else None)
    t = time.perf_counter()
    res = ctx.engines[key].generate(prompt, params)
    dt = time.perf_counter() - t
    return {"ids": list(res.token_ids), "text": res.text, "seconds": dt,
            "drafted": res.stats.drafted if draft else None,
            "accepted": res.stats.accepted if draft else None,
            "draft_seconds": res.stats.draft_seconds if draft else None,
            **{key: getattr(res.stats, key) for key in ROUND_STATS}, **engine_timings(res.stats)}


def lookup_setting(configured: int | None, draft: bool, forced: bool) -> int | None:
    """A method's ``ngram``: the *-ngram methods' lookup on every prompt (``--ngram``, else
    ``AUTO_NGRAM``), the other draft methods' and the predicted ones' as configured (None: the
    engine's default, on long prompts and on a prediction), and none for the target alone."""
    if forced:
        return configured or AUTO_NGRAM
    return configured if draft else 0


ROUND_STATS = ("rounds", "ended_by", "rejected_at", "ngram_proposed", "ngram_accepted", "branch_rows",
               "branch_rounds", "forced", "grammar_seconds", "prediction_tokens", "prediction_accepted")


def schema_grammar(ctx: BenchContext):
    """The compiled grammar of the request's schema, against the target's tokenizer (cached)."""
    from anyspec.engine.grammar import Grammars

    if ctx.grammars is None:
        ctx.grammars = Grammars(ctx.target.tokenizer, ctx.target.vocab_size, ctx.eos)
    return ctx.grammars.json(ctx.schema, "schema")
RUNNERS = {
    "target": lambda ctx, p, d=None: run_anyspec(ctx, p, sampled=False, draft=False),
    "target-ngram": lambda ctx, p, d=None: run_anyspec(ctx, p, sampled=False, draft=False, ngram=True),
    "anyspec-slem-ngram": lambda ctx, p, d=None: run_anyspec(ctx, p, sampled=False, algorithm="slem",
                                                             draft_dtype=d, ngram=True),
    "target-predicted": lambda ctx, p, d=None: run_anyspec(ctx, p, sampled=False, draft=False,
                                                           predicted=True),
    "anyspec-slem-predicted": lambda ctx, p, d=None: run_anyspec(ctx, p, sampled=False, algorithm="slem",
                                                                 draft_dtype=d, predicted=True),
    "anyspec-slem-chain": lambda ctx, p, d=None: run_anyspec(ctx, p, sampled=False, algorithm="slem",
                                                             draft_dtype=d, chain=True),
    "anyspec-greedy": lambda ctx, p, d=None: run_anyspec(ctx, p, sampled=False, draft_dtype=d),
    "anyspec-slem": lambda ctx, p, d=None: run_anyspec(ctx, p, sampled=False, algorithm="slem",
                                                       draft_dtype=d),
    "target-sampled": lambda ctx, p, d=None: run_anyspec(ctx, p, sampled=True, draft=False),
    "anyspec-sampled": lambda ctx, p, d=None: run_anyspec(ctx, p, sampled=True, algorithm="auto",
                                                          draft_dtype=d),
    "hf-target": lambda ctx, p: run_hf(ctx, p, assisted=False),
    "hf-uag": lambda ctx, p: run_hf(ctx, p, assisted=True),
    "vllm-target": lambda ctx, p: run_vllm(ctx, prompt_ids(ctx.target.tokenizer, p), draft=False),
    "vllm": lambda ctx, p: run_vllm(ctx, prompt_ids(ctx.target.tokenizer, p)),
    "llama.cpp": lambda ctx, p: run_llama_cpp(ctx, prompt_ids(ctx.target.tokenizer, p)),
    "llama.cpp-ngram": lambda ctx, p: run_llama_cpp(ctx, prompt_ids(ctx.target.tokenizer, p), ctx.llama_spec),
}


def run_method(ctx: BenchContext, method: str, prompt) -> dict:
    """One prompt through ``method``, or through a draft-dtype variant ``METHOD@DTYPE``."""
    name, _, dtype = method.partition("@")
    return RUNNERS[name](ctx, prompt, dtype) if dtype else RUNNERS[name](ctx, prompt)


def with_draft_dtypes(methods: list[str], dtypes: list[str]) -> list[str]:
    """Each draft method followed by its variants ``METHOD@DTYPE``, one per dtype."""
    return [v for m in methods for v in [m] + ([f"{m}@{d}" for d in dtypes] if m in DRAFT_METHODS else [])]


def guided(method: str) -> bool:
    """Whether the method generates under a prompt's JSON schema (anyspec's engine does)."""
    return method.startswith(("target", "anyspec"))


def check_guided(methods: list[str], prompts: list[dict]) -> None:
    """Prompts that carry a JSON schema (the ``json`` set) only with methods that follow it; the
    predicted methods only on prompts that carry a prediction."""
    others = [m for m in methods if not guided(m)]
    if others and any(p.get("schema") is not None for p in prompts):
        raise ConfigError(f"{', '.join(others)} cannot follow the JSON schemas these prompts carry; for "
                          "them choose anyspec's methods (--methods target anyspec-slem)")
    predicted = [m for m in methods if base(m) in PREDICTED]
    if predicted and any(p.get("prediction") is None for p in prompts):
        raise ConfigError(f"{', '.join(predicted)} need prompts that carry a 'prediction' (the edit set's)")


def available(methods: list[str], vllm_python: str | Path | None = None,
              target: str | None = None) -> tuple[list[str], dict[str, str]]:
    """The methods that can run here, and a note for each one skipped."""
    notes = {}
    wanted = [m for m in methods if m in LLAMA_CPP_METHODS]
    if wanted and (note := llama_cpp_problem(target_gguf(target) or target)):
        notes.update(dict.fromkeys(wanted, note))
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

def run_bench(settings: BenchSettings, log=print) -> dict:
    """Every check first (the settings when made, then the prompt files and the pair), then load
    and run every prompt through every method."""
    import torch

    from anyspec.backends.load import load_model
    from anyspec.engine.proposers import tuned_confidence, tuned_tree
    from anyspec.pair import check_pair, load_pair

    s = settings
    spec, k = s.speculative, s.speculative.num_speculative_tokens
    prompts = [p for f in s.prompt_files for p in load_prompts(f)[:s.limit]]
    plan = check_pair(s.target, s.draft, s.dtype, s.draft_dtype, s.threads, kv_cache_dtype=s.kv_cache_dtype)
    also = [check_pair(s.target, s.draft, s.dtype, d, s.threads).draft_dtype for d in s.also_draft_dtypes]
    check_guided(s.methods, prompts)
    methods, notes = available(s.methods, s.vllm_python, s.target)
    methods = with_draft_dtypes(methods, also)
    t = time.perf_counter()
    tgt, drf, _ = load_pair(plan)
    log(f"loaded {s.target} ({plan.dtype}) + {s.draft} ({plan.draft_dtype}) in "
        f"{time.perf_counter() - t:.1f}s; {torch.get_num_threads()} threads")
    ctx = context(s, plan, tgt, drf)
    confidence = tuned_confidence(tgt) if spec.draft_confidence is None else spec.draft_confidence
    branches = tuned_tree(tgt) if spec.tree is None else spec.tree
    for d in also:
        t = time.perf_counter()
        ctx.drafts[d] = load_model(s.draft, dtype=d, name=f"draft ({d})", kv_cache_dtype=s.kv_cache_dtype)
        log(f"loaded {s.draft} again ({d}) in {time.perf_counter() - t:.1f}s")
    if any(m in VLLM_METHODS for m in methods):
        ctx.vllm_max_model_len = vllm_max_model_len(
            [longest_request(tgt.tokenizer, p, s.max_new_tokens) for p in prompts], s.max_new_tokens, k)
    try:
        runs = _run_all(ctx, prompts * s.repeat, methods, notes, log)
    finally:
        close_all(ctx)
        close_llama_cpp(ctx)
    return {"config": {"target": s.target, "draft": s.draft, "dtype": plan.dtype,
                       "kv_cache_dtype": s.kv_cache_dtype, "draft_dtype": plan.draft_dtype,
                       "also_draft_dtypes": also, "k": k,
                       "ngram": spec.ngram, "adaptive_k": spec.adaptive_k, "draft_confidence": confidence,
                       "tree": branches, "repeat": s.repeat,
                       "max_new_tokens": s.max_new_tokens, "temperature": s.temperature, "top_p": s.top_p,
                       "presence_penalty": s.penalties[0], "frequency_penalty": s.penalties[1],
                       "seed": s.seed,
                       "threads": torch.get_num_threads(), "prompts": [str(f) for f in s.prompt_files],
                       "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
                       "torch": torch.__version__, "python": sys.version.split()[0],
                       **({"llama_spec": s.llama_spec} if "llama.cpp-ngram" in methods else {}),
                       **({"llama_cpp": str(llama_cpp_bin("llama-server"))}
                          if any(m in LLAMA_CPP_METHODS and m not in notes for m in methods) else {}),
                       "hf_uag": "transformers generate() defaults (adaptive number of assistant tokens)"
                       if s.hf_assistant == "default" else f"fixed {k} assistant tokens",
                       **({"vllm": ctx.vllm_info} if ctx.vllm_info else {})},
            "notes": notes, "runs": runs, "summary": summarize(runs)}


def context(s: BenchSettings, plan, target, draft) -> BenchContext:
    """What the methods read, for the loaded ``target`` and ``draft`` of the checked ``plan``."""
    import torch

    from anyspec.models import MODELS, resolve_model

    return BenchContext(target=target, draft=draft, speculative=s.speculative, temperature=s.temperature,
                        top_p=s.top_p, penalties=s.penalties, seed=s.seed, max_new_tokens=s.max_new_tokens,
                        eos=end_ids(target),
                        dtype_name=plan.dtype, draft_dtype=plan.draft_dtype,
                        threads=s.threads or torch.get_num_threads(), hf_assistant=s.hf_assistant,
                        target_spec=s.target, draft_spec=s.draft,
                        target_path=resolve_model(s.target) if s.target in MODELS else s.target,
                        draft_path=resolve_model(s.draft) if s.draft in MODELS else s.draft,
                        llama_cpp_gguf=target_gguf(s.target), llama_spec=tuple(llama_spec_args(s.llama_spec)),
                        vllm_python=s.vllm_python)


def failure(exc: BaseException) -> str:
    """An exception in one line: its type and the first line of its message, cut at 200 characters."""
    lines = str(exc).strip().splitlines()
    text = lines[0] if lines else ""
    text = text if len(text) <= 200 else text[:199] + "…"
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def drop_failed(method: str, where: str, exc: Exception, methods: list[str], notes: dict, log) -> None:
    """A method that raised leaves the rotation with a note; the rows it and the others wrote stay."""
    notes[method] = f"failed on {where}: {failure(exc)}; skipped"
    methods.remove(method)
    log(f"  {method} {notes[method]}")


def _run_all(ctx: BenchContext, prompts: list[dict], methods: list[str], notes: dict, log) -> list[dict]:
    """Warm every method up, then every prompt through every method in an order that rotates from
    one prompt to the next (a prompt listed again, for ``--repeat``, gets its next rotation); a
    conversation's turns run one after another in each method. A vLLM method that cannot run (or
    whose subprocess dies), or any method that raises, is dropped with a note."""
    methods = list(methods)
    max_new_tokens, ctx.max_new_tokens = ctx.max_new_tokens, 4
    for m in list(methods):
        try:
            run_method(ctx, m, [{"role": "user", "content": "Say hi."}])
        except UNAVAILABLE as exc:
            notes[m] = str(exc)
            methods.remove(m)
            log(f"  {m}: {exc}")
        except Exception as exc:
            drop_failed(m, "the warm-up", exc, methods, notes, log)
    ctx.max_new_tokens = max_new_tokens

    runs, asked = [], {}  # asked: (method, request id) -> its messages
    for i, p in enumerate(prompts):
        if not methods:
            break
        order = methods[i % len(methods):] + methods[:i % len(methods)]
        for m in order:
            try:
                for rid, prompt, r in conversation(p, lambda q, m=m, p=p: run_turn(ctx, m, q, p)):
                    asked[m, rid] = prompt
                    r.update(method=m, prompt=rid, set=p["set"], order=order.index(m),
                             repeat=sum(q["id"] == p["id"] for q in prompts[:i]))
                    if "turns" in p:
                        r.update(conversation=p["id"], turn=int(rid.rpartition("/")[2]))
                    runs.append(r)
                    log(f"  {p['set']}/{rid:<18} {m:<16} {len(r['ids']):>4} tok {r['seconds']:7.2f}s "
                        f"{len(r['ids']) / r['seconds']:6.2f} tok/s")
            except UNAVAILABLE as exc:
                notes[m] = str(exc)
                methods.remove(m)
                log(f"  {m}: {exc}")
            except Exception as exc:
                drop_failed(m, f"{p['set']}/{p['id']}", exc, methods, notes, log)
            finally:
                ctx.prefix_cache = False
        compare(ctx, [r for r in runs if r["prompt"] == p["id"] or r.get("conversation") == p["id"]], asked)
    return runs


def run_turn(ctx: BenchContext, method: str, prompt, p: dict) -> dict:
    """One request of the bench row ``p``: a conversation's first turn starts on an empty cache,
    its later ones keep the prefix the earlier turns left (``ctx.prefix_cache``)."""
    ctx.prefix_cache = "turns" in p and len(prompt) > len(p["prompt"])
    ctx.schema, ctx.prediction = p.get("schema"), p.get("prediction")
    if ctx.schema is not None and not guided(method):  # check_guided refused it before the load
        raise ConfigError(f"{method} cannot follow a prompt's JSON schema; only anyspec's methods do")
    try:
        return run_method(ctx, method, prompt)
    finally:
        ctx.schema = ctx.prediction = None


def compare(ctx: BenchContext, runs: list[dict], asked: dict) -> None:
    """Mark each run ``identical`` to its reference (the target alone, or sampled alone with the same
    seed) on the same request, else where they part and the target's logit margin there; and
    ``llama.cpp-ngram`` ``identical_llama_cpp`` where its answer equals ``llama.cpp``'s."""
    for r in runs:
        if r["method"] == "llama.cpp-ngram":
            plain = next((x for x in runs if x["prompt"] == r["prompt"] and x["method"] == "llama.cpp"), None)
            if plain is not None:
                r["identical_llama_cpp"] = plain["ids"] == r["ids"]
        # a sampled answer is the target alone's for the same seed (algorithms/gumbel.py)
        ref_method = "target-sampled" if base(r["method"]) == "anyspec-sampled" else "target"
        ref = next((x for x in runs if x["prompt"] == r["prompt"] and x["method"] == ref_method), None)
        if r["method"] in ("target", "target-sampled") or ref is None:
            continue
        pos = first_difference(ref["ids"], r["ids"])
        r["identical"] = pos is None
        if pos is not None:
            r["diff_pos"] = pos
            r["diff_margin"] = (logit_margin(ctx.target, asked[ref_method, ref["prompt"]], ref["ids"], pos)
                                if pos < len(ref["ids"]) else None)
