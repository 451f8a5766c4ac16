"""The bench's results: the summary by prompt set and method, the Markdown table and a PNG plot."""

from __future__ import annotations

from pathlib import Path

from anyspec.bench.methods import BASELINE, METHODS, SECOND_BASELINE, base
from anyspec.bench.timing import timing_summary
from anyspec.errors import ConfigError


def summarize(runs: list[dict]) -> list[dict]:
    rows = []
    for s in sorted({r["set"] for r in runs}) + ["all"]:
        sel = [r for r in runs if s in ("all", r["set"])]
        tps = {}
        for m in sorted({r["method"] for r in sel}, key=lambda m: (METHODS.index(base(m)), m)):
            mine = [r for r in sel if r["method"] == m]
            tokens, seconds = sum(len(r["ids"]) for r in mine), sum(r["seconds"] for r in mine)
            tps[m] = tokens / seconds if seconds else 0.0
            drafted = sum(r["drafted"] or 0 for r in mine)
            timed = [r["draft_seconds"] for r in mine if r.get("draft_seconds") is not None]
            compared = [r for r in mine if "identical" in r]
            grammar = sum(r.get("grammar_seconds") or 0 for r in mine)
            rows.append({
                "set": s, "method": m, "prompts": len(mine), "tokens": tokens, "seconds": round(seconds, 3),
                "tokens_per_second": round(tps[m], 3), **timing_summary(mine),
                "acceptance": round(sum(r["accepted"] or 0 for r in mine) / drafted, 3) if drafted else None,
                "draft_ms_per_token": round(1000 * sum(timed) / drafted, 2) if drafted and timed else None,
                **round_causes(mine),
                "identical": f"{sum(r['identical'] for r in compared)}/{len(compared)}" if compared else None,
                "diffs": [(r["prompt"], r["diff_pos"], None if r["diff_margin"] is None
                           else round(r["diff_margin"], 3)) for r in compared if not r["identical"]],
                "grammar_share": round(grammar / seconds, 4) if grammar and seconds else None,
                "forced": sum(r.get("forced") or 0 for r in mine),
                **same_as_llama_cpp(mine),
            })
        for row in rows:
            if row["set"] == s:
                first = BASELINE.get(base(row["method"]))
                row["speedup"] = round(row["tokens_per_second"] / tps[first], 3) if tps.get(first) else None
                second = SECOND_BASELINE.get(base(row["method"]))
                if tps.get(second):
                    row[f"speedup_vs_{second}"] = round(row["tokens_per_second"] / tps[second], 3)
    return rows


def same_as_llama_cpp(runs: list[dict]) -> dict:
    """For llama.cpp's lookup speculation: how many answers equal llama.cpp's alone."""
    compared = [r["identical_llama_cpp"] for r in runs if "identical_llama_cpp" in r]
    return {"identical_llama_cpp": f"{sum(compared)}/{len(compared)}"} if compared else {}


CAUSES = ("rejected", "branch", "boundary", "confidence", "k", "eos", "none")  # branch: a branch's tokens


def round_causes(runs: list[dict]) -> dict:
    """Why the runs' rounds ended (``proposers.round_end``: n-gram rounds as "ngram:<cause>"), the
    rounds whose first rejection came at each position, and the n-gram proposals accepted."""
    if not any(r.get("ended_by") for r in runs):
        return {}
    ended, at = {}, []
    for r in runs:
        for cause, n in r["ended_by"].items():
            ended[cause] = ended.get(cause, 0) + n
        at += [0] * (len(r["rejected_at"]) - len(at))
        for i, n in enumerate(r["rejected_at"]):
            at[i] += n
    proposed = sum(r["ngram_proposed"] for r in runs)
    return {"rounds": sum(r["rounds"] for r in runs), "ended_by": ended, "rejected_at": at,
            "branch_rows": sum(r.get("branch_rows", 0) for r in runs),
            "ngram_acceptance": round(sum(r["ngram_accepted"] for r in runs) / proposed, 3)
            if proposed else None}


def causes_markdown(summary: list[dict]) -> list[str]:
    """The share of rounds that ended by each cause, per method that proposed anything."""
    rows = [r for r in summary if r["set"] == "all" and set(r.get("ended_by") or {}) - {"none"}]
    if not rows:
        return []
    kinds = [c for c in CAUSES if any(c in r["ended_by"] for r in rows)]
    kinds += sorted({c for r in rows for c in r["ended_by"] if c.startswith("ngram:")})
    head = ("| method | rounds | " + " | ".join(kinds) +
            " | first rejection at 0, 1, .. | n-gram acceptance | branch rows a round |")
    lines = ["", "Why rounds ended (share of rounds, all sets; ngram: rounds proposed from the context; "
             "branch: rounds that accepted a branch's tokens):", "", head,
             "|---|---:|" + "---:|" * len(kinds) + "---|---:|---:|"]
    for r in rows:
        shares = [f"{100 * r['ended_by'].get(c, 0) / r['rounds']:.0f}%" for c in kinds]
        branch_rows = r.get("branch_rows") or 0
        lines.append(f"| {r['method']} | {r['rounds']} | " + " | ".join(shares) +
                     f" | {', '.join(map(str, r['rejected_at'])) or '-'} | {r['ngram_acceptance'] or '-'} | "
                     f"{branch_rows / r['rounds']:.2f} |")
    return lines


TIME_COLUMNS = (("ttft_ms", ".0f"), ("prefill_tokens_per_second", ".1f"), ("decode_tokens_per_second", ".2f"),
                ("seconds", ".2f"))


def dash(value, spec: str = "") -> str:
    """A table cell: the value, or a dash where the method could not measure it."""
    return "-" if value is None else format(value, spec)


def turns_markdown(summary: list[dict]) -> list[str]:
    """For conversations: the first turns' time to the first token beside the later turns'."""
    rows = [r for r in summary if r["set"] != "all" and "ttft_ms_first_turn" in r]
    if not rows:
        return []
    lines = ["", "Conversations: time to the first token (ms), first turns and later turns (the prefix "
             "cache's share):", "", "| set | method | first turns | later turns | later ÷ first |",
             "|---|---|---:|---:|---:|"]
    for r in rows:
        first, later = r["ttft_ms_first_turn"], r["ttft_ms_later_turns"]
        ratio = f"{later / first:.2f}" if first and later is not None else "-"
        lines.append(f"| {r['set']} | {r['method']} | {dash(first, '.0f')} | {dash(later, '.0f')} "
                     f"| {ratio} |")
    return lines


def sampled_at(result: dict) -> str:
    """The header's word on sampling: its temperature (and top-p below 1) when a sampled method ran,
    else greedy; and the penalties where there are any."""
    ran, config = {base(r["method"]) for r in result["summary"]}, result["config"]
    top_p, penalties = config.get("top_p", 1.0), ""
    for name in ("presence_penalty", "frequency_penalty"):
        penalties += f", {name.replace('_', ' ')} {config[name]}" if config.get(name) else ""
    if "anyspec-sampled" not in ran:
        return "greedy" + penalties
    sampled = f"T={config['temperature']}" + (f", top-p {top_p}" if top_p < 1.0 else "")
    if ran - {"anyspec-sampled", "target-sampled"}:
        return f"greedy, and the -sampled methods at {sampled}" + penalties
    return f"sampled at {sampled}" + penalties


def markdown(result: dict) -> str:
    c = result["config"]
    lines = [f"target `{c['target']}` ({c['dtype']}), draft `{c['draft']}` "
             f"({c.get('draft_dtype', c['dtype'])}), k={c['k']}, "
             f"{'draft confidence ' + str(c['draft_confidence']) + ', ' if c.get('draft_confidence') else ''}"
             f"{'up to ' + str(c['tree']) + ' branches a round, ' if c.get('tree') else ''}"
             f"{str(c['repeat']) + ' runs of each, ' if c.get('repeat', 1) > 1 else ''}"
             f"max_new_tokens={c['max_new_tokens']}, {c['threads']} thread{'s' * (c['threads'] != 1)}, "
             f"{sampled_at(result)}",
             "", "| set | method | tokens | tok/s | speedup (vs) | time to first token (ms) | prefill tok/s "
             "| decode tok/s | total s | acceptance | draft ms/token "
             "| identical to target | first differences (prompt, pos, top1-top2 logit) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in result["summary"]:
        vs = f"{r['speedup']:.2f}x ({BASELINE[base(r['method'])]})" if r.get("speedup") is not None else "-"
        second = SECOND_BASELINE.get(base(r["method"]))
        if r.get(f"speedup_vs_{second}") is not None:
            vs += f", {r[f'speedup_vs_{second}']:.2f}x ({second})"
        diffs = "; ".join(f"{p} @{pos} ({m})" for p, pos, m in r["diffs"][:4]) or "-"
        lines.append(f"| {r['set']} | {r['method']} | {r['tokens']} | {r['tokens_per_second']:.2f} | {vs} | "
                     + " | ".join(dash(r.get(k), f) for k, f in TIME_COLUMNS) + " | "
                     f"{r['acceptance'] if r['acceptance'] is not None else '-'} | "
                     f"{r['draft_ms_per_token'] if r.get('draft_ms_per_token') is not None else '-'} | "
                     f"{r['identical'] or '-'} | "
                     f"{diffs} |")
    lines += causes_markdown(result["summary"]) + turns_markdown(result["summary"])
    lines += [f"- {r['set']}/{r['method']}: the grammar's masks and steps took "
              f"{100 * r['grammar_share']:.2f}% of the time; {r['forced']} tokens it forced were proposed "
              "without the draft"
              for r in result["summary"] if r.get("grammar_share") is not None and r["set"] != "all"]
    for m, info in c.get("vllm", {}).items():
        models = "target and draft" if info.get("speculative") else "target"
        lines.append(f"- {m}: vLLM {info.get('vllm')} ({info.get('python')}"
                     f"{f', {models} in ' + info['dtype'] if info.get('dtype') else ''}"
                     f"{', eager' if info.get('enforce_eager') else ''}"
                     f"{', cores ' + info['cpus'] if info.get('cpus') else ''}"
                     f"{', vocab mapping: ' + info['mapping'] if info.get('mapping') else ''})")
    lines += [f"- {r['set']}/{r['method']} (`{c.get('llama_spec')}`): the same answer as llama.cpp alone "
              f"on {r['identical_llama_cpp']} prompts"
              for r in result["summary"] if r.get("identical_llama_cpp") and r["set"] != "all"]
    if c.get("llama_cpp"):
        lines.append(f"- llama.cpp: `{c['llama_cpp']}`")
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
                 f"k={c['k']}, {c['threads']} thread{'s' * (c['threads'] != 1)}",
                 fontsize=9)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
