"""``anyspec bench``: anyspec against the target alone and Hugging Face's assisted generation.

On the same loaded models, dtype and prompts it runs, per prompt and in an order that rotates from
prompt to prompt (so slow drift of the machine falls on every method alike):

- ``target``: the target alone, on anyspec's own loop (k = 0), greedy: the reference output;
- ``anyspec-greedy`` / ``anyspec-sampled``: TLI speculative decoding, greedy and sampled;
- ``anyspec-slem``: SLEM (string-level exact match), greedy;
- ``hf-target`` / ``hf-uag``: transformers ``generate`` alone and with ``assistant_model=`` +
  ``assistant_tokenizer=`` (Universal Assisted Generation), each against its own baseline;
- ``vllm``: vLLM's own speculative decoding with the same pair (``method="draft_model"``,
  ``use_heterogeneous_vocab=True``), greedy; ``vllm-target`` (opt-in): vLLM with the target alone
  (``bench_vllm.py``: in this process, or in a subprocess of ``--vllm-python``).

Greedy outputs are compared token by token with ``target``; where they differ, the position and
the target's top-1 minus top-2 logit at that position are reported (a near-tie there means the
difference is numerical, not a bug). Writes JSON, a Markdown table and optionally a PNG plot.
"""

from __future__ import annotations

import json
import platform
import sys
import time
from pathlib import Path

from anyspec.bench_hf import run_hf
from anyspec.bench_llama import (
    LlamaCppUnavailable,
    close_llama_cpp,
    llama_cpp_problem,
    run_llama_cpp,
    target_gguf,
)
from anyspec.bench_vllm import VllmUnavailable, close_all, run_vllm, unavailable, vllm_max_model_len
from anyspec.config import DRAFT_CONFIDENCE, NUM_SPECULATIVE_TOKENS, SpeculativeConfig
from anyspec.engine.prompt import encode_prompt, end_ids
from anyspec.errors import ConfigError

PROMPTS_DIR = Path(__file__).resolve().with_name("data") / "prompts"  # package data
DEFAULT_PROMPTS = [PROMPTS_DIR / "code.jsonl", PROMPTS_DIR / "prose.jsonl"]
METHODS = ("target", "anyspec-greedy", "anyspec-slem", "anyspec-sampled", "llama.cpp", "hf-target", "hf-uag",
           "vllm-target", "vllm")
DEFAULT_METHODS = [m for m in METHODS if m != "vllm-target"]  # a second vLLM instance: opt-in (memory)
BASELINE = {"anyspec-greedy": "target", "anyspec-slem": "target", "anyspec-sampled": "target",
            "hf-uag": "hf-target", "hf-target": "target", "vllm-target": "target", "vllm": "target",
            "llama.cpp": "target"}
# vLLM's own speedup, when vllm-target ran too; anyspec against llama.cpp's target alone
SECOND_BASELINE = {"vllm": "vllm-target", "anyspec-greedy": "llama.cpp", "anyspec-slem": "llama.cpp",
                   "target": "llama.cpp", "hf-uag": "llama.cpp"}
UNAVAILABLE = (VllmUnavailable, LlamaCppUnavailable)
VLLM_METHODS = ("vllm", "vllm-target")


def load_prompts(path: Path) -> list[dict]:
    """JSONL: one ``{"id": ..., "messages": [{"role": "user", "content": ...}]}`` (or ``"prompt"``) a line."""
    if not path.is_file():
        raise ConfigError(f"prompt file {path} does not exist")
    rows = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            raise ConfigError(f"{path}:{n} is not valid JSON") from None
        if "messages" not in row and "prompt" not in row:
            raise ConfigError(f"{path}:{n} has neither 'messages' nor 'prompt'")
        rows.append({"id": row.get("id", f"{path.stem}-{n}"), "set": path.stem,
                     "prompt": row.get("messages") or row["prompt"]})
    if not rows:
        raise ConfigError(f"prompt file {path} has no prompts")
    return rows


# ---- methods: each returns {"ids", "text", "seconds", "drafted", "accepted"} -------------------------

def prompt_ids(tok, prompt) -> list[int]:
    """The target's prompt tokens exactly as the engine builds them."""
    return encode_prompt(tok, prompt)[0]


def run_anyspec(ctx: dict, prompt, sampled: bool, draft: bool = True, algorithm: str = "tli") -> dict:
    from anyspec.engine import Engine, SamplingParams

    key = ("engine", draft, sampled, algorithm)
    if key not in ctx:
        config = SpeculativeConfig(num_speculative_tokens=ctx["k"], algorithm=algorithm,
                                   draft_sample_method="sample" if sampled else "greedy",
                                   prefix_cache=False,  # every run prefills its whole prompt, as HF's does
                                   **ctx["engine_options"])
        ctx[key] = Engine(ctx["target"], ctx["draft"] if draft else None, config)
    params = SamplingParams(temperature=ctx["temperature"] if sampled else 0.0,
                            max_new_tokens=ctx["max_new_tokens"], seed=ctx["seed"] if sampled else None)
    t = time.perf_counter()
    res = ctx[key].generate(prompt, params)
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
    "vllm-target": lambda ctx, p: run_vllm(ctx, prompt_ids(ctx["target"].tokenizer, p), draft=False),
    "vllm": lambda ctx, p: run_vllm(ctx, prompt_ids(ctx["target"].tokenizer, p)),
    "llama.cpp": lambda ctx, p: run_llama_cpp(ctx, prompt_ids(ctx["target"].tokenizer, p)),
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


def logit_margin(ctx: dict, prompt, ref: list[int], pos: int) -> float:
    """The target's top-1 minus top-2 logit for the token at ``pos`` after ``prompt + ref[:pos]``.

    Scored by anyspec's target (the reference's own forward: lean or transformers'), in fp32.
    """
    import torch

    target = ctx["target"]
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

    ctx = {"target": tgt, "draft": drf, "k": k, "temperature": temperature, "seed": seed,
           "engine_options": engine_options, "hf_assistant": hf_assistant,
           "max_new_tokens": max_new_tokens, "eos": end_ids(tgt),
           "dtype_name": dtype, "draft_dtype": draft_dtype, "threads": threads or torch.get_num_threads(),
           "vllm_python": vllm_python, "target_spec": target, "draft_spec": draft,
           "llama_cpp_gguf": target_gguf(target),
           "target_path": resolve_model(target) if target in MODELS else target,
           "draft_path": resolve_model(draft) if draft in MODELS else draft}

    if any(m in VLLM_METHODS for m in methods):
        ctx["vllm_max_model_len"] = vllm_max_model_len(
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
                       **({"vllm": ctx["vllm_info"]} if ctx.get("vllm_info") else {})},
            "notes": notes, "runs": runs, "summary": summarize(runs)}


def _run_all(ctx: dict, prompts: list[dict], methods: list[str], notes: dict, log) -> list[dict]:
    """Warm every method up, then every prompt through every method in an order that rotates from
    one prompt to the next (a prompt listed again, for ``--repeat``, gets its next rotation). A
    vLLM method that cannot run (or whose subprocess dies) is dropped with a note."""
    methods = list(methods)
    warm = {"max_new_tokens": ctx["max_new_tokens"]}
    ctx["max_new_tokens"] = 4
    for m in list(methods):
        try:
            RUNNERS[m](ctx, [{"role": "user", "content": "Say hi."}])
        except UNAVAILABLE as exc:
            notes[m] = str(exc)
            methods.remove(m)
            log(f"  {m}: {exc}")
    ctx.update(warm)

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
                r["diff_margin"] = logit_margin(ctx, p["prompt"], ref["ids"], pos) if pos < len(ref["ids"]) \
                    else None
    return runs


def summarize(runs: list[dict]) -> list[dict]:
    rows = []
    for s in sorted({r["set"] for r in runs}) + ["all"]:
        sel = [r for r in runs if s in ("all", r["set"])]
        tps = {}
        for m in sorted({r["method"] for r in sel}, key=METHODS.index):
            mine = [r for r in sel if r["method"] == m]
            tokens, seconds = sum(len(r["ids"]) for r in mine), sum(r["seconds"] for r in mine)
            tps[m] = tokens / seconds if seconds else 0.0
            drafted = sum(r["drafted"] or 0 for r in mine)
            compared = [r for r in mine if "identical" in r]
            rows.append({
                "set": s, "method": m, "prompts": len(mine), "tokens": tokens, "seconds": round(seconds, 3),
                "tokens_per_second": round(tps[m], 3),
                "acceptance": round(sum(r["accepted"] or 0 for r in mine) / drafted, 3) if drafted else None,
                "identical": f"{sum(r['identical'] for r in compared)}/{len(compared)}" if compared else None,
                "diffs": [(r["prompt"], r["diff_pos"], None if r["diff_margin"] is None
                           else round(r["diff_margin"], 3)) for r in compared if not r["identical"]],
            })
        for row in rows:
            if row["set"] == s:
                base = BASELINE.get(row["method"])
                row["speedup"] = round(row["tokens_per_second"] / tps[base], 3) if tps.get(base) else None
                second = SECOND_BASELINE.get(row["method"])
                if tps.get(second):
                    row[f"speedup_vs_{second}"] = round(row["tokens_per_second"] / tps[second], 3)
    return rows


def sampled_at(result: dict) -> str:
    """The header's word on sampling: its temperature when a sampled method ran, else greedy."""
    ran = {r["method"] for r in result["summary"]}
    return f"sampled at T={result['config']['temperature']}" if "anyspec-sampled" in ran else "greedy"


def markdown(result: dict) -> str:
    c = result["config"]
    lines = [f"target `{c['target']}` ({c['dtype']}), draft `{c['draft']}` "
             f"({c.get('draft_dtype', c['dtype'])}), k={c['k']}, "
             f"{'draft confidence ' + str(c['draft_confidence']) + ', ' if c.get('draft_confidence') else ''}"
             f"{str(c['repeat']) + ' runs of each, ' if c.get('repeat', 1) > 1 else ''}"
             f"max_new_tokens={c['max_new_tokens']}, {c['threads']} threads, "
             f"{sampled_at(result)}",
             "", "| set | method | tokens | tok/s | speedup (vs) | acceptance | identical to target | "
             "first differences (prompt, pos, top1-top2 logit) |", "|---|---|---|---|---|---|---|---|"]
    for r in result["summary"]:
        vs = f"{r['speedup']:.2f}x ({BASELINE[r['method']]})" if r.get("speedup") is not None else "-"
        second = SECOND_BASELINE.get(r["method"])
        if r.get(f"speedup_vs_{second}") is not None:
            vs += f", {r[f'speedup_vs_{second}']:.2f}x ({second})"
        diffs = "; ".join(f"{p} @{pos} ({m})" for p, pos, m in r["diffs"][:4]) or "-"
        lines.append(f"| {r['set']} | {r['method']} | {r['tokens']} | {r['tokens_per_second']:.2f} | {vs} | "
                     f"{r['acceptance'] if r['acceptance'] is not None else '-'} | {r['identical'] or '-'} | "
                     f"{diffs} |")
    for m, info in c.get("vllm", {}).items():
        models = "target and draft" if info.get("speculative") else "target"
        lines.append(f"- {m}: vLLM {info.get('vllm')} ({info.get('python')}"
                     f"{f', {models} in ' + info['dtype'] if info.get('dtype') else ''}"
                     f"{', eager' if info.get('enforce_eager') else ''}"
                     f"{', cores ' + info['cpus'] if info.get('cpus') else ''}"
                     f"{', vocab mapping: ' + info['mapping'] if info.get('mapping') else ''})")
    lines += [f"- {m}: {note}" for m, note in result["notes"].items()]
    return "\n".join(lines) + "\n"


def pyplot():
    try:
        import matplotlib
    except ImportError:
        raise ConfigError("--plot needs matplotlib: pip install 'anyspec[bench]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot(result: dict, path: Path) -> None:
    plt = pyplot()

    rows = [r for r in result["summary"] if r["set"] != "all"]
    sets = list(dict.fromkeys(r["set"] for r in rows))
    methods = list(dict.fromkeys(r["method"] for r in rows))
    width = 0.8 / max(len(methods), 1)
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(sets) * len(methods) ** 0.5), 4))
    for j, m in enumerate(methods):
        xs, ys = [], []
        for i, s in enumerate(sets):
            r = next((r for r in rows if r["set"] == s and r["method"] == m), None)
            if r:
                xs.append(i + j * width)
                ys.append(r["tokens_per_second"])
                if r.get("speedup") is not None and m not in ("target", "hf-target"):
                    ax.annotate(f"{r['speedup']:.2f}x", (i + j * width, r["tokens_per_second"]),
                                ha="center", va="bottom", fontsize=7)
        ax.bar(xs, ys, width, label=m)
    c = result["config"]
    ax.set_xticks([i + width * (len(methods) - 1) / 2 for i in range(len(sets))], sets)
    ax.set_ylabel("tokens / s")
    ax.set_title(f"{c['target']} ({c['dtype']}) <- {c['draft']} ({c.get('draft_dtype', c['dtype'])}), "
                 f"k={c['k']}, {c['threads']} threads",
                 fontsize=9)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
