"""The engine on a CUDA GPU: correctness on tiny models, and forward costs of the default pair's shapes.

No weights travel to the GPU machine (they are GBs), only the two built-in models' configs and
tokenizers (``--assets``: one folder per model, as in ``~/.cache/anyspec/models/NAME`` without the
safetensors). So:

1. correctness: tiny random fp32 models with the REAL Qwen2.5 and SmolLM2 tokenizers on the GPU;
   greedy speculative output (TLI and SLEM) must equal target-only greedy.
2. costs: random-weight models with the real architectures (Qwen2.5-Coder-1.5B, SmolLM2-135M) in
   bf16: seconds per forward of n = 1..9 tokens through the engine's backend (extend + crop).
   Random weights do not change what a forward costs; they make acceptance meaningless, so the
   projected speedup uses acceptance rates measured with the real weights on the CPU (``--accept``).

    PYTHONPATH=src python benchmarks/gpu_check.py --assets .gpu --out results.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

PROMPTS = ["def fibonacci(n):\n    if n < 2:\n        return n\n",
           "The quick brown fox jumps over the lazy dog. Then",
           "数据科学 🤖 naïve café — ∑ résumé", "class Stack:\n\tdef push(self, item):\n"]


def tokenizer(folder: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(folder, local_files_only=True)


def random_model(folder: Path, dtype, device: str, tiny: bool, seed: int):
    from transformers import AutoConfig, AutoModelForCausalLM

    from anyspec.backends.transformers import TransformersModel

    config = AutoConfig.from_pretrained(folder, local_files_only=True)
    if tiny:
        for key, value in dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=2, head_dim=16).items():
            setattr(config, key, value)
        config.tie_word_embeddings = False
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    return TransformersModel(model, tokenizer(folder), name=folder.name)


def correctness(assets: Path, device: str) -> dict:
    from anyspec.engine import Engine, SamplingParams, SpeculativeConfig

    target = random_model(assets / "qwen2.5-coder-1.5b", torch.float32, device, tiny=True, seed=0)
    draft = random_model(assets / "smollm2-135m", torch.float32, device, tiny=True, seed=1)
    out = {}
    alone = Engine(target, None)
    greedy = SamplingParams(temperature=0.0, max_new_tokens=24)
    for algorithm in ("tli", "slem"):
        for k in (1, 3, 5):
            spec = Engine(target, draft, SpeculativeConfig(num_speculative_tokens=k, algorithm=algorithm,
                                                           draft_sample_method="greedy"))
            same = [spec.generate(p, greedy).token_ids == alone.generate(p, greedy).token_ids
                    for p in PROMPTS]
            out[f"{algorithm} k={k} greedy identical"] = f"{sum(same)}/{len(same)}"
        sampled = Engine(target, draft, SpeculativeConfig(num_speculative_tokens=4, algorithm=algorithm))
        res = sampled.generate(PROMPTS[0], SamplingParams(temperature=0.8, max_new_tokens=24, seed=1))
        again = sampled.generate(PROMPTS[0], SamplingParams(temperature=0.8, max_new_tokens=24, seed=1))
        out[f"{algorithm} sampled runs, seeded repeat identical"] = res.token_ids == again.token_ids
    return out


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def forward_costs(assets: Path, device: str, sizes=range(1, 10), reps: int = 20) -> dict:
    costs = {}
    for name in ("qwen2.5-coder-1.5b", "smollm2-135m"):
        model = random_model(assets / name, torch.bfloat16, device, tiny=False, seed=0)
        context = list(range(100, 356))  # 256 cached tokens
        model.extend(context, last=1)
        row = {}
        for n in sizes:
            times = []
            for _ in range(reps + 3):
                model.crop(len(context))
                sync(device)
                t = time.perf_counter()
                model.extend(context[:n])  # logits come back to the CPU, as in the engine
                sync(device)
                times.append(time.perf_counter() - t)
            row[n] = statistics.median(times[3:])
        costs[name] = row
        model.crop(len(context))
        together = model.extend(context[:5])
        model.crop(len(context))
        alone = torch.cat([model.extend([i]) for i in context[:5]])
        costs[f"{name}: max |logit diff|, 5 tokens together vs one by one"] = \
            float((together - alone).abs().max())
        del model
    return costs


def projection(costs: dict, accept: dict[str, float], k_max: int = 8) -> dict:
    from anyspec.algorithms.adaptive_k import expected_tokens

    t, d = costs["qwen2.5-coder-1.5b"], costs["smollm2-135m"][1]
    out = {}
    for label, a in accept.items():
        out[label] = {k: round(expected_tokens(a, k) * t[1] / (k * d + t[k + 1]), 3)
                      for k in range(1, k_max + 1)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--assets", type=Path, required=True, metavar="FOLDER",
                    help="a folder with qwen2.5-coder-1.5b/ and smollm2-135m/: each model's config and "
                         "tokenizer files, without the weights")
    ap.add_argument("--out", type=Path, required=True, metavar="FILE",
                    help="write the whole result as JSON here (not with --skip-costs, which only prints "
                         "the correctness)")
    ap.add_argument("--accept", default="code=0.25,prose=0.55", metavar="LABEL=RATE,...",
                    help="per-token acceptance measured with the real weights on the CPU, for the "
                         "projected speedup by k (default %(default)s)")
    ap.add_argument("--device", default="cuda", help="the torch device (default %(default)s)")
    ap.add_argument("--skip-costs", action="store_true",
                    help="check correctness only: no forward costs, no projection")
    args = ap.parse_args()
    device = args.device
    name = torch.cuda.get_device_name(0) if device == "cuda" else device
    result = {"device": name, "torch": torch.__version__}
    import transformers

    result["transformers"] = transformers.__version__
    t = time.perf_counter()
    result["correctness"] = correctness(args.assets, device)
    print(json.dumps(result, indent=1), flush=True)
    if args.skip_costs:
        return
    result["forward_seconds"] = forward_costs(args.assets, device)
    accept = {kv.split("=")[0]: float(kv.split("=")[1]) for kv in args.accept.split(",")}
    result["accept"] = accept
    result["projected_speedup_by_k"] = projection(result["forward_seconds"], accept)
    result["wall_seconds"] = time.perf_counter() - t
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
