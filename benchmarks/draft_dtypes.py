"""Time per draft token of one model under several dtypes, alternating round by round.

    python benchmarks/draft_dtypes.py [--model gemma3-270m] [--dtypes gguf bf16] [--threads 2]
        [--rounds 5] [--tokens 32] [--tli-target qwen2.5-coder-1.5b] [--split] [--json F]

A draft token is one cached one-row forward (``extend([token])``) after a short prompt, the step a
draft takes k times a round. Each round times every dtype once, in a rotating order, so a noisy
machine's drift falls on all of them; the figure is the median over rounds. ``--tli-target`` adds
``gguf-tli``: the GGUF draft with its LM head restricted to the intersection with that target's
vocabulary, as TLI drafts (``GGUFModel.restricted_head``).

``--split`` (GGUF models): where a draft token's time goes, from the same rounds: the decoder stack
(``decoder_forward``, one C++ call), the LM head's product and the rest (embedding, final norm,
argmax, Python), each with the weight bytes it reads per token and the rate it reads them at, beside
the machine's streaming rate on as many threads (a sum over a buffer larger than any cache): the
bandwidth floor of a token is its bytes at that rate.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

PROMPT = "def merge(a, b):\n    \"\"\"Merge two sorted lists into one sorted list.\"\"\"\n    out = []\n"


def per_token_ms(model, tokens: int, head=None, spent: dict | None = None, into: dict | None = None) -> float:
    """Milliseconds per draft token; with ``spent`` (a ``Timed`` kernel's) and ``into``, the seconds
    of each kernel call over the draft tokens (the prompt's prefill left out) are added to ``into``."""
    ids = model.tokenizer.encode(PROMPT)
    model.reset()
    logits = model.extend(ids, None, head) if head is not None else model.extend(ids)
    before = dict(spent or {})
    start = time.perf_counter()
    for _ in range(tokens):
        token = [int(logits[-1].argmax())]
        logits = model.extend(token, None, head) if head is not None else model.extend(token)
    seconds = time.perf_counter() - start
    if into is not None:
        for name, total in (spent or {}).items():
            into[name] = into.get(name, 0.0) + total - before.get(name, 0.0)
        into["total"] = into.get("total", 0.0) + seconds
    return seconds * 1000 / tokens


class Timed:
    """A kernel whose calls add their seconds to ``spent[name]``."""

    def __init__(self, kernel, spent: dict):
        self._kernel, self._spent = kernel, spent

    def __getattr__(self, name):
        fn = getattr(self._kernel, name)
        if not callable(fn):
            return fn

        def timed(*args, **kwargs):
            start = time.perf_counter()
            out = fn(*args, **kwargs)
            self._spent[name] = self._spent.get(name, 0.0) + time.perf_counter() - start
            return out
        return timed


def stream_gbs(threads: int, mb: int = 512, repeats: int = 7) -> float:
    """GB/s of a float sum over ``mb`` MB on ``threads`` threads, the best of ``repeats``."""
    torch.set_num_threads(threads)
    buffer = torch.ones(mb * 2**20 // 4)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        buffer.sum()
        best = min(best, time.perf_counter() - start)
    return buffer.numel() * 4 / best / 1e9


def split_table(model, spent: dict, tokens: int, floor_gbs: float, head_rows=None) -> list[dict]:
    """Per draft token: ms, weight MB and GB/s of the stack, the head (``head_rows``: a restricted
    one) and the rest."""
    stack = sum(p.weight.numel() * p.weight.element_size() for layer in model.layers
                for p in (layer.q, layer.k, layer.v, layer.o, layer.gate, layer.up, layer.down))
    weight = (model.lm_head if head_rows is None else head_rows.product)[0]
    head = weight.numel() * weight.element_size()
    ms = {name: 1000 * s / tokens for name, s in spent.items()}
    parts = [("decoder stack", ms.pop("decoder_forward", 0.0), stack),
             ("LM head", ms.pop("typed_linear", 0.0), head)]
    parts.append(("rest", ms.pop("total") - sum(p[1] for p in parts), 0))
    rows = [{"part": n, "ms": t, "MB": b / 1e6, "GB/s": b / t / 1e6 if b and t else None}
            for n, t, b in parts]
    total = stack + head
    rows.append({"part": "bandwidth floor", "ms": total / floor_gbs / 1e6, "MB": total / 1e6,
                 "GB/s": floor_gbs})
    return rows


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
    ap.add_argument("--split", action="store_true", help="where a GGUF draft token's time goes")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    if args.split and args.rounds < 2:
        ap.error("--split needs --rounds 2 or more (the first round warms up and is not split)")
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
    spent: dict[str, dict] = {d: {} for d in args.dtypes}  # a Timed kernel's running totals
    parts: dict[str, dict] = {d: {} for d in args.dtypes}  # their share in the timed draft tokens
    if args.split:
        for d in args.dtypes:
            if not hasattr(models[d], "layers"):
                continue
            if not isinstance(models[d].kernel, Timed):  # gguf-tli shares gguf's model
                models[d].kernel = Timed(models[d].kernel, spent[d])
            spent[d] = models[d].kernel._spent
    for r in range(args.rounds):
        order = args.dtypes[r % len(args.dtypes):] + args.dtypes[:r % len(args.dtypes)]
        for d in order:
            into = parts[d] if args.split and r > 0 else None  # the first round warms up
            times[d].append(per_token_ms(models[d], args.tokens, heads[d], spent[d], into))
    medians = {d: statistics.median(t) for d, t in times.items()}
    first = args.dtypes[0]
    print(f"{args.model}, {args.threads} threads, median of {args.rounds} alternating rounds:")
    for d, ms in medians.items():
        print(f"  {d:8s} {ms:7.2f} ms per draft token  ({ms / medians[first]:.2f}x {first})")
    splits = {}
    if args.split and args.rounds > 1:
        floor = stream_gbs(args.threads)
        for d in args.dtypes:
            if spent[d]:
                splits[d] = split_table(models[d], parts[d], args.tokens * (args.rounds - 1), floor, heads[d])
                print(f"\n{d}, per draft token over rounds 2-{args.rounds} (the prompt's prefill left out):")
                print("| part | ms | weight MB | GB/s |\n|---|---:|---:|---:|")
                for row in splits[d]:
                    rate = f"{row['GB/s']:.1f}" if row["GB/s"] else "-"
                    print(f"| {row['part']} | {row['ms']:.2f} | {row['MB']:.1f} | {rate} |")
    if args.json:
        args.json.write_text(json.dumps({"model": args.model, "threads": args.threads, "times_ms": times,
                                         "median_ms": medians, "split": splits}, indent=2))


if __name__ == "__main__":
    main()
