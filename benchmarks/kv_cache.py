"""The target's forward on an fp32 and on an fp16 KV cache, alternating in one process: a prefill of
``--prefill`` tokens on an empty cache, then at each ``--depth`` the milliseconds per token of
``--tokens`` tokens decoded one at a time and of one pass of ``--rows`` rows. Each repeat runs both
caches, the first one flipping every repeat; the figures are medians. Needs a quiet machine.

    python benchmarks/kv_cache.py [--model qwen2.5-coder-1.5b] [--depth 1024 4096] [--repeats 4]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from anyspec.backends.load import KV_CACHE_DTYPES, load_model
from anyspec.engine.batch import PREFILL_CHUNK


def fill(model, ids: list[int]) -> float:
    """Seconds to prefill ``ids`` on an empty cache in the engine's chunks."""
    model.reset()
    start = time.perf_counter()
    for at in range(0, len(ids), PREFILL_CHUNK):
        model.extend(ids[at:at + PREFILL_CHUNK], last=1)
    return time.perf_counter() - start


def one_repeat(model, ids: list[int], args, out: dict) -> None:
    out.setdefault(f"prefill {args.prefill}, s", []).append(fill(model, ids[:args.prefill]))
    for depth in args.depth:
        fill(model, ids[:depth])
        start = time.perf_counter()
        for token in ids[depth:depth + args.tokens]:
            model.extend([token])
        per_token = 1000 * (time.perf_counter() - start) / args.tokens
        out.setdefault(f"decode at {depth}, ms/token", []).append(per_token)
        model.crop(depth)
        start = time.perf_counter()
        model.extend(ids[depth:depth + args.rows])
        out.setdefault(f"{args.rows} rows at {depth}, ms", []).append(1000 * (time.perf_counter() - start))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen2.5-coder-1.5b",
                    help="a built-in model name or a .gguf file, on anyspec's GGUF kernels "
                         "(default %(default)s)")
    ap.add_argument("--depth", type=int, nargs="+", default=[1024, 4096], metavar="N",
                    help="the cache lengths the decode and the pass of --rows rows are timed at "
                         "(default: 1024 4096)")
    ap.add_argument("--prefill", type=int, default=2048, metavar="N",
                    help="the prompt prefilled on an empty cache (default %(default)s)")
    ap.add_argument("--tokens", type=int, default=16, metavar="N",
                    help="tokens decoded one at a time at each depth (default %(default)s)")
    ap.add_argument("--rows", type=int, default=6, metavar="N",
                    help="the rows of the one pass timed at each depth (default %(default)s)")
    ap.add_argument("--repeats", type=int, default=4, metavar="N",
                    help="repeats, each running both caches (default %(default)s)")
    ap.add_argument("--threads", type=int, default=2, metavar="N",
                    help="torch CPU threads (default %(default)s)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model = load_model(args.model, dtype="gguf", name="target")
    longest = max([args.prefill] + [d + max(args.tokens, args.rows) for d in args.depth])
    ids = torch.randint(100, min(model.vocab_size, 20000), (longest,),
                        generator=torch.Generator().manual_seed(0)).tolist()
    runs: dict[str, dict] = {name: {} for name in KV_CACHE_DTYPES}
    for repeat in range(args.repeats):
        for name in list(KV_CACHE_DTYPES)[::1 if repeat % 2 == 0 else -1]:
            model.use_kv_dtype(KV_CACHE_DTYPES[name])
            one_repeat(model, ids, args, runs[name])
    print(f"{args.model}, {args.threads} threads, median of {args.repeats} alternating repeats")
    print("| measure | fp32 cache | fp16 cache | fp16 / fp32 |\n|---|---:|---:|---:|")
    for measure in runs["fp32"]:
        a, b = (statistics.median(runs[name][measure]) for name in ("fp32", "fp16"))
        print(f"| {measure} | {a:.2f} | {b:.2f} | {b / a:.2f} |")
    print(json.dumps(runs))


if __name__ == "__main__":
    main()
