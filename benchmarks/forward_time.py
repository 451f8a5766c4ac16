"""Forward time of the built-in models on this CPU: n new tokens on top of a cached prompt.

    python benchmarks/forward_time.py [--threads 2] [--reps 20] [--dtypes bf16 fp32]

Each measurement extends a 64-token cached prompt by n tokens and crops the cache back; the
median over ``--reps`` is reported. Models are measured in turn within one run so their ratios
share the machine's state.
"""

import argparse
import json
import statistics
import time

import torch

from anyspec.models import load

CASES = [("smollm2-135m", 1), ("qwen2.5-coder-0.5b", 1), ("qwen2.5-coder-1.5b", 1), ("qwen2.5-coder-1.5b", 5),
         ("gemma3-270m", 1)]
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


@torch.inference_mode()
def forward_ms(model, n: int, reps: int, prompt_len: int = 64) -> float:
    from transformers import DynamicCache

    vocab = model.config.get_text_config().vocab_size
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(100, min(vocab, 30000), (1, prompt_len), generator=gen)
    cache = DynamicCache(config=model.config)
    model(input_ids=prompt, past_key_values=cache, use_cache=True)
    new = torch.randint(100, min(vocab, 30000), (1, n), generator=gen)
    times = []
    for i in range(reps + 2):
        t = time.perf_counter()
        model(input_ids=new, past_key_values=cache, use_cache=True)
        dt = time.perf_counter() - t
        cache.crop(-n)
        if i >= 2:
            times.append(dt)
    return 1000 * statistics.median(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--dtypes", nargs="+", default=list(DTYPES), choices=list(DTYPES))
    ap.add_argument("--models", nargs="+", default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    rows = []
    for dname in args.dtypes:
        loaded = {}
        for name, n in CASES:
            if args.models and name not in args.models:
                continue
            if name not in loaded:
                loaded[name] = load(name, dtype=DTYPES[dname])[0]
            ms = forward_ms(loaded[name], n, args.reps)
            rows.append({"model": name, "dtype": dname, "new_tokens": n, "ms": round(ms, 1)})
            print(f"{name:<20} {dname:<5} n={n}  {ms:8.1f} ms", flush=True)
        del loaded
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
