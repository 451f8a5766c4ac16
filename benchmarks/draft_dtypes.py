"""Time per draft token of one model under several dtypes, alternating round by round.

    python benchmarks/draft_dtypes.py [--model gemma3-270m] [--dtypes gguf bf16] [--threads 2]
        [--rounds 5] [--tokens 32] [--tli-target qwen2.5-coder-1.5b] [--json F]

A draft token is one cached one-row forward (``extend([token])``) after a short prompt, the step a
draft takes k times a round. Each round times every dtype once, in a rotating order, so a noisy
machine's drift falls on all of them; the figure is the median over rounds. ``--tli-target`` adds
``gguf-tli``: the GGUF draft with its LM head restricted to the intersection with that target's
vocabulary, as TLI drafts (``GGUFModel.restricted_head``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

PROMPT = "def merge(a, b):\n    \"\"\"Merge two sorted lists into one sorted list.\"\"\"\n    out = []\n"


def per_token_ms(model, tokens: int, head=None) -> float:
    ids = model.tokenizer.encode(PROMPT)
    model.reset()
    logits = model.extend(ids, None, head) if head is not None else model.extend(ids)
    start = time.perf_counter()
    for _ in range(tokens):
        token = [int(logits[-1].argmax())]
        logits = model.extend(token, None, head) if head is not None else model.extend(token)
    return (time.perf_counter() - start) * 1000 / tokens


def main() -> None:
    from anyspec.backends.load import load_model

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="gemma3-270m", help="a built-in name or a .gguf file")
    ap.add_argument("--dtypes", nargs="+", default=["gguf", "bf16"])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--tli-target", default=None,
                    help="also the GGUF draft with its head on its intersection with this target")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    models = {d: load_model(args.model, dtype=d, name="draft") for d in args.dtypes}
    heads = {d: None for d in args.dtypes}
    if args.tli_target:
        from anyspec.config import SpeculativeConfig
        from anyspec.engine.bridge import build_bridge

        models["gguf"] = models.get("gguf") or load_model(args.model, dtype="gguf", name="draft")
        target = load_model(args.tli_target, dtype="gguf", name="target")
        mask = build_bridge(models["gguf"], target, SpeculativeConfig()).intersection_mask
        models["gguf-tli"] = models["gguf"]
        heads["gguf-tli"] = models["gguf"].restricted_head(mask.nonzero().flatten())
        print(f"intersection with {args.tli_target}: {int(mask.sum()):,} of {mask.numel():,} draft tokens")
        args.dtypes = list(dict.fromkeys([*args.dtypes, "gguf", "gguf-tli"]))
        heads.setdefault("gguf", None)
    times: dict[str, list[float]] = {d: [] for d in args.dtypes}
    for r in range(args.rounds):
        order = args.dtypes[r % len(args.dtypes):] + args.dtypes[:r % len(args.dtypes)]
        for d in order:
            times[d].append(per_token_ms(models[d], args.tokens, heads[d]))
    medians = {d: statistics.median(t) for d, t in times.items()}
    first = args.dtypes[0]
    print(f"{args.model}, {args.threads} threads, median of {args.rounds} alternating rounds:")
    for d, ms in medians.items():
        print(f"  {d:8s} {ms:7.2f} ms per draft token  ({ms / medians[first]:.2f}x {first})")
    if args.json:
        args.json.write_text(json.dumps({"model": args.model, "threads": args.threads, "times_ms": times,
                                         "median_ms": medians}, indent=2))


if __name__ == "__main__":
    main()
