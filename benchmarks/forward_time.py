"""Forward time of the built-in models on this CPU: n new tokens on top of a cached prompt.

    python benchmarks/forward_time.py [--threads 2] [--reps 20] [--dtypes bf16 fp32]

Each measurement extends a 64-token cached prompt by n tokens and crops the cache back. Every
model is timed rep by rep alternating with the first (reference) model, in both dtypes; min,
median and the median per-rep ratio to the reference are reported.
"""

import argparse
import json
import statistics
import time

import torch

from anyspec.backends.transformers import cache_argument
from anyspec.models import load

CASES = [("smollm2-135m", 1), ("qwen2.5-coder-0.5b", 1), ("qwen2.5-coder-1.5b", 1), ("qwen2.5-coder-1.5b", 5),
         ("gemma3-270m", 1)]
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


@torch.inference_mode()
def prepared(model, n: int, prompt_len: int = 64):
    """A closure running one forward of n new tokens over a cached prompt, cropping back after."""
    from transformers import DynamicCache

    vocab = model.config.get_text_config().vocab_size
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(100, min(vocab, 30000), (1, prompt_len), generator=gen)
    cache = DynamicCache(config=model.config)
    arg = cache_argument(model)
    model(input_ids=prompt, use_cache=True, **{arg: cache})
    new = torch.randint(100, min(vocab, 30000), (1, n), generator=gen)

    @torch.inference_mode()
    def step() -> float:
        t = time.perf_counter()
        model(input_ids=new, use_cache=True, **{arg: cache})
        dt = time.perf_counter() - t
        cache.crop(-n)
        return dt

    return step


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--dtypes", nargs="+", default=list(DTYPES), choices=list(DTYPES))
    ap.add_argument("--models", nargs="+", default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    cases = [c for c in CASES if not args.models or c[0] in args.models]
    ref = cases[0][0]
    rows = []
    # One model at a time (in both dtypes), interleaved rep by rep with the reference model, so that
    # load from other processes falls on every case alike and the ratios to the reference hold.
    for name in dict.fromkeys(c[0] for c in cases):
        group = [(m, d, n) for m, n in cases for d in args.dtypes if m in (ref, name)]
        models = {(m, d): load(m, dtype=DTYPES[d])[0] for m, d in dict.fromkeys((m, d) for m, d, _ in group)}
        steps = {(m, d, n): prepared(models[m, d], n) for m, d, n in group}
        times = {key: [] for key in steps}
        for i in range(args.reps + 2):
            for key, step in steps.items():
                dt = step()
                if i >= 2:
                    times[key].append(dt)
        for (m, d, n), ts in times.items():
            if m == ref and name != ref:
                continue
            ratio = statistics.median(a / b for a, b in zip(ts, times[ref, d, 1], strict=True))
            rows.append({"model": m, "dtype": d, "new_tokens": n, "min_ms": round(1000 * min(ts), 1),
                         "median_ms": round(1000 * statistics.median(ts), 1), f"x_{ref}": round(ratio, 2)})
            med = 1000 * statistics.median(ts)
            print(f"{m:<20} {d:<5} n={n}  min {1000 * min(ts):8.1f} ms  median {med:8.1f} ms  "
                  f"{ratio:5.2f}x {ref}", flush=True)
        del models, steps
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
