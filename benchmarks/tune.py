"""Tuning pass for the defaults: k, algorithm, adaptive k, confidence stop, branches and prompt
lookup, against the target alone, in one run.

Loads the pair once, then for each prompt runs the target alone and every configuration in an
order that rotates from prompt to prompt (drift on a shared machine falls on all alike), greedy.
Prints a Markdown table of speedups over the target alone per prompt set, and writes JSON.

    .venv/bin/python benchmarks/tune.py --ks 4 5 6 --algorithms slem --confidences 0 0.5 0.7 \\
        --limit 3 --threads 2 --json benchmarks/results/tune_confidence.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import time
from pathlib import Path

import torch

from anyspec.backends.load import load_model, resolve_dtype
from anyspec.bench.prompts import PROMPTS_DIR, load_prompts
from anyspec.engine import Engine, SamplingParams, SpeculativeConfig


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="qwen2.5-coder-1.5b",
                    help="target: a built-in model name, a folder or a .gguf file (default %(default)s)")
    ap.add_argument("--draft", default="smollm2-135m",
                    help="draft: a built-in model name, a folder or a .gguf file (default %(default)s)")
    ap.add_argument("--dtype", default=None,
                    help="the target's dtype, as anyspec's --dtype: gguf, bf16, fp16, fp32, int8 "
                         "(default: auto)")
    ap.add_argument("--draft-dtype", default=None,
                    help="the draft's dtype, as anyspec's --draft-dtype (default: auto)")
    ap.add_argument("--ks", nargs="+", type=int, default=[2, 3, 4, 6], metavar="K",
                    help="draft tokens per round to try (default: 2 3 4 6)")
    ap.add_argument("--algorithms", nargs="+", default=["slem", "tli"], metavar="ALGORITHM",
                    help="algorithms to try: slem, tli, auto (default: slem tli)")
    ap.add_argument("--adaptive", action="store_true", help="also each configuration with adaptive k")
    ap.add_argument("--confidences", nargs="+", type=float, default=[0.0], metavar="P",
                    help="draft_confidence thresholds to try (0 = off; default: 0)")
    ap.add_argument("--trees", nargs="+", type=int, default=[None], metavar="N",
                    help="branches beside the chain to try (0 = the chain alone; default: the engine's own "
                         "choice for the target)")
    ap.add_argument("--ngrams", nargs="+", type=int, default=[0], metavar="N",
                    help="prompt lookup lengths to try (0 = off; default: 0)")
    ap.add_argument("--limit", type=int, default=2, metavar="N", help="prompts per set (default %(default)s)")
    ap.add_argument("--skip", type=int, default=0, metavar="N",
                    help="prompts per set left out before the --limit ones (held-out prompts to confirm on; "
                         "default %(default)s)")
    ap.add_argument("--sets", nargs="+", default=["code", "prose"], metavar="SET",
                    help="prompt sets: the shipped ones (code, prose), or .jsonl files (named by stem; "
                         "default: code prose)")
    ap.add_argument("--repeat", type=int, default=1, metavar="N",
                    help="every prompt this many times, rotating on (default %(default)s)")
    ap.add_argument("--max-new-tokens", type=int, default=96, metavar="N",
                    help="the most tokens each answer may have (default %(default)s)")
    ap.add_argument("--threads", type=int, default=2, metavar="N",
                    help="torch CPU threads (default %(default)s)")
    ap.add_argument("--json", type=Path, default=None, metavar="FILE",
                    help="write the arguments, the table and every run as JSON here (default: none)")
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    target = load_model(args.target, dtype=resolve_dtype(args.dtype, spec=args.target), name="target")
    draft_dtype = resolve_dtype(args.draft_dtype, draft=True, spec=args.draft)
    draft = load_model(args.draft, dtype=draft_dtype, name="draft")
    print(f"target {args.target} ({target.dtype}), draft {args.draft} ({draft.dtype})", flush=True)
    configs = {"target": None}
    for algorithm in args.algorithms:
        for k in args.ks:
            for adaptive in ([False, True] if args.adaptive else [False]):
                for conf, tree, n in itertools.product(args.confidences, args.trees, args.ngrams):
                    name = (f"{algorithm} k={k}" + (" adaptive" if adaptive else "")
                            + (f" conf={conf:g}" if conf else "")
                            + (f" tree={tree}" if tree is not None else "")
                            + (f" ngram={n}" if n else ""))
                    configs[name] = SpeculativeConfig(num_speculative_tokens=k, algorithm=algorithm,
                                                      draft_sample_method="greedy", adaptive_k=adaptive,
                                                      draft_confidence=conf, tree=tree, ngram=n,
                                                      prefix_cache=False)
    cold = SpeculativeConfig(prefix_cache=False)  # every run prefills its whole prompt
    engines = {name: Engine(target, None if c is None else draft, c or cold) for name, c in configs.items()}
    params = SamplingParams(temperature=0.0, max_new_tokens=args.max_new_tokens)
    for engine in engines.values():
        engine.generate("Hello", SamplingParams(max_new_tokens=4))

    files = [Path(s) if s.endswith(".jsonl") else PROMPTS_DIR / f"{s}.jsonl" for s in args.sets]
    args.sets = [f.stem for f in files]
    prompts = [p for f in files for p in load_prompts(f)[args.skip: args.skip + args.limit]] * args.repeat
    names = list(engines)
    runs = []
    for i, p in enumerate(prompts):
        order = names[i % len(names):] + names[: i % len(names)]
        for name in order:
            t = time.perf_counter()
            res = engines[name].generate(p["prompt"], params)
            seconds = time.perf_counter() - t
            runs.append({"config": name, "set": p["set"], "prompt": p["id"], "tokens": len(res.token_ids),
                         "seconds": seconds, "ids": res.token_ids, "drafted": res.stats.drafted,
                         "accepted": res.stats.accepted})
            print(f"{p['set']}/{p['id']:<18} {name:<22} {len(res.token_ids) / seconds:6.2f} tok/s",
                  flush=True)

    rows = []
    for name in names:
        row = {"config": name}
        for s in args.sets:
            mine = [r for r in runs if r["config"] == name and r["set"] == s]
            base = [r for r in runs if r["config"] == "target" and r["set"] == s]
            tps = sum(r["tokens"] for r in mine) / sum(r["seconds"] for r in mine)
            base_tps = sum(r["tokens"] for r in base) / sum(r["seconds"] for r in base)
            row[f"{s} tok/s"] = round(tps, 2)
            row[f"{s} speedup"] = round(tps / base_tps, 2)
            drafted = sum(r["drafted"] for r in mine)
            row[f"{s} acceptance"] = round(sum(r["accepted"] for r in mine) / drafted, 3) if drafted else None
            ref = {r["prompt"]: r["ids"] for r in base}
            row[f"{s} identical"] = f"{sum(r['ids'] == ref[r['prompt']] for r in mine)}/{len(mine)}"
        rows.append(row)
    keys = list(rows[0])
    print("\n| " + " | ".join(keys) + " |\n|" + "---|" * len(keys))
    for row in rows:
        print("| " + " | ".join("-" if row[k] is None else str(row[k]) for k in keys) + " |")
    if args.json:
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "table": rows,
                                         "runs": runs}, indent=1) + "\n")


if __name__ == "__main__":
    main()
