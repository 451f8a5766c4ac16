"""Acceptance with the draft reading its own tokenization (retokenize) vs vLLM's token map.

    .venv/bin/python benchmarks/draft_context.py [--dtype fp32] [--k 4] [--max-new-tokens 64] [--threads 1]

Runs the target alone, then TLI with each draft-context policy, on the first code and the first
prose prompt; checks greedy outputs are identical and prints one JSON line per run.
"""

from __future__ import annotations

import argparse
import json
import warnings

import torch

from anyspec.backends.load import load_model
from anyspec.bench.prompts import load_prompts, prompt_file
from anyspec.engine import Engine, SamplingParams, SpeculativeConfig


def first_prompt(kind: str) -> tuple[str, list[dict]]:
    """The first prompt of the set ``kind`` shipped with anyspec (or of a JSONL file)."""
    row = load_prompts(prompt_file(kind))[0]
    return row["id"], row["prompt"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--target", default="qwen2.5-coder-1.5b")
    parser.add_argument("--draft", default="smollm2-135m")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--kinds", default="code,prose")
    parser.add_argument("--contexts", default="retokenize,token-map")
    parser.add_argument("--no-baseline", action="store_true")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore", message=".*has no unk token.*")
    chosen = {kind: first_prompt(kind) for kind in args.kinds.split(",")}
    target = load_model(args.target, dtype=args.dtype, name="target")
    draft = load_model(args.draft, dtype=args.dtype, name="draft")
    params = SamplingParams(temperature=0.0, max_new_tokens=args.max_new_tokens)
    for name, messages in chosen.values():
        base = None if args.no_baseline else Engine(target, None).generate(messages, params)
        if base is not None:
            print(json.dumps({"prompt": name, "run": "target-only", "dtype": str(target.dtype),
                              "tokens_per_second": round(base.stats.tokens_per_second, 3),
                              "tokens": len(base.token_ids)}), flush=True)
        for context in args.contexts.split(","):
            config = SpeculativeConfig(algorithm="tli", num_speculative_tokens=args.k, draft_context=context)
            got = Engine(target, draft, config).generate(messages, params)
            s = got.stats
            print(json.dumps({
                "prompt": name, "run": context, "k": args.k, "dtype": str(target.dtype),
                "identical_to_target_only": None if base is None else got.token_ids == base.token_ids,
                "acceptance_rate": round(s.acceptance_rate, 3), "drafted": s.drafted,
                "accepted": s.accepted, "rounds": s.rounds, "accepted_hist": s.accepted_hist,
                "mean_accepted_length": round(s.mean_accepted_length, 3),
                "tokens_per_second": round(s.tokens_per_second, 3),
                "draft_seconds": round(s.draft_seconds, 2), "target_seconds": round(s.target_seconds, 2),
                "tokens": len(got.token_ids), "draft_fallbacks": s.draft_fallbacks,
            }), flush=True)


if __name__ == "__main__":
    main()
