"""Acceptance of TLI vs SLEM on the real pair (greedy), against the target alone.

    .venv/bin/python benchmarks/algorithms.py [--k 4] [--max-new-tokens 64] [--prompts 2] \\
        [--threads 1] [--out benchmarks/results/algorithms_cpu1.json]

For the first ``--prompts`` prompts of code.jsonl and prose.jsonl (chat messages): the target alone,
then TLI and SLEM (both with draft_context="retokenize"). Greedy outputs must be identical to the
target alone. Per run: acceptance rate (accepted / proposed target tokens), mean accepted per
round, the accepted-length histogram, the rounds whose proposal was empty, and how many proposed
target tokens have no twin in the draft vocabulary (TLI can never propose those). One JSON line
per run on stdout; the whole result, with a per-kind summary, in ``--out``.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
import warnings
from pathlib import Path

import torch

import anyspec.engine.loop as loop
from anyspec.backends.load import load_model
from anyspec.bench.prompts import load_prompts, prompt_file
from anyspec.engine import Engine, SamplingParams, SpeculativeConfig


def prompts(kind: str, n: int) -> list[tuple[str, list[dict]]]:
    """The first ``n`` prompts of the set ``kind`` shipped with anyspec (or of a JSONL file)."""
    return [(row["id"], row["prompt"]) for row in load_prompts(prompt_file(kind))[:n]]


def run(engine: Engine, messages, params) -> tuple:
    """Generate, logging the target ids each round proposed to the target (its chain: ``loop.verify``
    gets them as ``proposal.ids``)."""
    proposals: list[list[int]] = []
    verify = loop.verify

    def logged(target, pending, proposal, *args):
        proposals.append(list(proposal.ids))
        return (yield from verify(target, pending, proposal, *args))

    loop.verify = logged
    try:
        result = engine.generate(messages, params)
    finally:
        loop.verify = verify
    return result, proposals


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="qwen2.5-coder-1.5b",
                        help="target: a built-in model name, a folder or a .gguf file (default %(default)s)")
    parser.add_argument("--draft", default="smollm2-135m",
                        help="draft: a built-in model name, a folder or a .gguf file (default %(default)s)")
    parser.add_argument("--dtype", default="auto",
                        help="both models' dtype: auto, gguf, bf16, fp16, fp32, int8 (default %(default)s)")
    parser.add_argument("--k", type=int, default=4, help="draft tokens per round (default %(default)s)")
    parser.add_argument("--max-new-tokens", type=int, default=64, metavar="N",
                        help="the most tokens each answer may have (default %(default)s)")
    parser.add_argument("--prompts", type=int, default=2, metavar="N",
                        help="the first N prompts of each kind (default %(default)s)")
    parser.add_argument("--kinds", default="code,prose",
                        help="the prompt sets, comma-separated: sets shipped with anyspec or .jsonl files "
                             "(default %(default)s)")
    parser.add_argument("--algorithms", default="tli,slem",
                        help="the algorithms compared, comma-separated (default %(default)s)")
    parser.add_argument("--threads", type=int, default=1, metavar="N",
                        help="torch CPU threads (default %(default)s)")
    parser.add_argument("--out", default=None, metavar="FILE",
                        help="write the whole result as JSON here (default: none)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore", message=".*has no unk token.*")
    chosen = {kind: prompts(kind, args.prompts) for kind in args.kinds.split(",")}
    target = load_model(args.target, dtype=args.dtype, name="target")
    draft = load_model(args.draft, dtype=args.dtype, name="draft")
    params = SamplingParams(temperature=0.0, max_new_tokens=args.max_new_tokens)
    algorithms = args.algorithms.split(",")
    engines = {a: Engine(target, draft, SpeculativeConfig(num_speculative_tokens=args.k, algorithm=a,
                                                          prefix_cache=False))
               for a in algorithms}
    to_draft = engines[algorithms[0]].bridge.target_to_draft
    runs = []
    t_start = time.perf_counter()
    for kind, rows in chosen.items():
        for name, messages in rows:
            base = Engine(target, None, SpeculativeConfig(prefix_cache=False)).generate(messages, params)
            row = {"kind": kind, "prompt": name, "run": "target-only", "tokens": len(base.token_ids),
                   "target_seconds": round(base.stats.target_seconds, 2), "text": base.text}
            print(json.dumps(row), flush=True)
            runs.append(row)
            for algorithm in algorithms:
                got, proposals = run(engines[algorithm], messages, params)
                s = got.stats
                row = {
                    "kind": kind, "prompt": name, "run": algorithm, "k": args.k,
                    "identical_to_target_only": got.token_ids == base.token_ids,
                    "acceptance_rate": round(s.acceptance_rate, 3),
                    "mean_accepted_per_round": round(s.mean_accepted_length, 3),
                    "rounds": s.rounds, "drafted": s.drafted, "accepted": s.accepted,
                    "accepted_hist": s.accepted_hist,
                    "empty_proposals": sum(not p for p in proposals),
                    "proposal_lengths": [sum(len(p) == m for p in proposals) for m in range(args.k + 1)],
                    "proposed_target_only_tokens": sum(to_draft[t] < 0 for p in proposals for t in p),
                    "tokens": len(got.token_ids), "draft_fallbacks": s.draft_fallbacks,
                    "draft_seconds": round(s.draft_seconds, 2), "target_seconds": round(s.target_seconds, 2),
                }
                print(json.dumps(row), flush=True)
                runs.append(row)
    summary = {}
    for kind in args.kinds.split(","):
        for algorithm in algorithms:
            rows = [r for r in runs if r["kind"] == kind and r["run"] == algorithm]
            drafted, accepted, rounds = (sum(r[key] for r in rows)
                                         for key in ("drafted", "accepted", "rounds"))
            summary[f"{kind}/{algorithm}"] = {
                "prompts": len(rows), "acceptance_rate": round(accepted / drafted, 3) if drafted else 0.0,
                "mean_accepted_per_round": round(accepted / rounds, 3), "rounds": rounds,
                "drafted": drafted, "accepted": accepted,
                "tokens_per_target_forward": round(sum(r["tokens"] for r in rows) / rounds, 3),
                "all_identical_to_target_only": all(r["identical_to_target_only"] for r in rows),
            }
    print(json.dumps({"summary": summary}), flush=True)
    if args.out:
        result = {
            "config": {"target": args.target, "draft": args.draft, "dtype": str(target.dtype),
                       "k": args.k, "max_new_tokens": args.max_new_tokens, "temperature": 0.0,
                       "draft_context": "retokenize", "threads": args.threads,
                       "prompts_per_kind": args.prompts, "machine": platform.machine(),
                       "torch": torch.__version__, "seconds": round(time.perf_counter() - t_start, 1)},
            "summary": summary, "runs": runs,
        }
        Path(args.out).write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
