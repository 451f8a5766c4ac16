"""One vLLM run on CPU, for the real-vLLM tier; run it with the vLLM venv's python.

    .venv-vllm/bin/python tests/vllm/run_vllm.py --target DIR --draft DIR --mode anyspec

``--mode none``: the target alone. ``builtin``: TLI drafting with vLLM's own VocabMapping
(ANYSPEC_VLLM_PLUGIN=0). ``anyspec``: TLI drafting with the anyspec plugin on. Greedy, fp32.
The last stdout line is ``RESULT <json>``: per-prompt output token ids and texts, the
speculative counters over the timed run, its wall time and tokens/s.
``--compare-mappings`` builds vLLM's and anyspec's mappings for the pair and reports both.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

PROMPTS = [
    "Write a Python function that returns the n-th Fibonacci number iteratively.",
    "Explain in three sentences what a hash map is.",
    "Write a C function that reverses a string in place.",
    "def quicksort(xs):\n    \"\"\"Sort a list of integers.\"\"\"\n",
    "List five prime numbers and say why each is prime.",
    "Write a SQL query that counts orders per customer from a table orders(id, customer_id).",
]


def counters(llm) -> dict[str, int]:
    out: dict[str, int] = {}
    for metric in llm.get_metrics():
        if metric.name.startswith("vllm:spec_decode_num_") and hasattr(metric, "value"):
            out[metric.name] = out.get(metric.name, 0) + int(metric.value)
    return out


def prompts_for(target: str) -> list[str]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(target)
    return [tok.apply_chat_template([{"role": "user", "content": p}], tokenize=False,
                                    add_generation_prompt=True) for p in PROMPTS]


def run(args) -> dict:
    os.environ["ANYSPEC_VLLM_PLUGIN"] = "1" if args.mode == "anyspec" else "0"
    from vllm import LLM, SamplingParams

    spec = None
    if args.mode != "none":
        spec = {"method": "draft_model", "model": args.draft, "num_speculative_tokens": args.k,
                "use_heterogeneous_vocab": True}
    llm = LLM(model=args.target, tokenizer=args.target, dtype="float32", enforce_eager=True,
              max_model_len=1024, max_num_seqs=8, seed=0, speculative_config=spec,
              disable_log_stats=False)
    prompts = prompts_for(args.target)
    greedy = SamplingParams(temperature=0.0, max_tokens=args.max_tokens)
    llm.generate(prompts[:1], SamplingParams(temperature=0.0, max_tokens=8), use_tqdm=False)
    before = counters(llm)
    start = time.perf_counter()
    outputs = llm.generate(prompts, greedy, use_tqdm=False)
    wall = time.perf_counter() - start
    after = counters(llm)
    spent = {name.removeprefix("vllm:spec_decode_"): after[name] - before.get(name, 0) for name in after}
    generated = sum(len(o.outputs[0].token_ids) for o in outputs)
    drafted, accepted = spent.get("num_draft_tokens", 0), spent.get("num_accepted_tokens", 0)
    return {
        "mode": args.mode, "k": args.k, "max_tokens": args.max_tokens,
        "token_ids": [list(o.outputs[0].token_ids) for o in outputs],
        "texts": [o.outputs[0].text for o in outputs],
        "generated_tokens": generated, "wall_s": wall, "tokens_per_s": generated / wall,
        "counters": spent,
        "acceptance_rate": accepted / drafted if drafted else None,
        "mean_accepted_per_draft": accepted / spent["num_drafts"] if spent.get("num_drafts") else None,
    }


def compare_mappings(args) -> dict:
    import logging

    import torch
    from transformers import AutoConfig
    from vllm.tokenizers.registry import get_tokenizer
    from vllm.v1.spec_decode.vocab_mapping import VocabMapping as VllmMapping

    from anyspec.integrations.vllm import AnyspecVocabMapping

    logging.getLogger("vllm").setLevel(logging.INFO)
    logging.getLogger("vllm").addHandler(logging.StreamHandler())
    target, draft = get_tokenizer(args.target), get_tokenizer(args.draft)
    sizes = [AutoConfig.from_pretrained(path).vocab_size for path in (args.target, args.draft)]
    theirs = VllmMapping(target, draft, *sizes, torch.device("cpu"))
    ours = AnyspecVocabMapping(target, draft, *sizes, torch.device("cpu"))
    both = theirs.intersection_mask_draft & ours.intersection_mask_draft
    differ = both & (theirs.draft_to_target_ids != ours.draft_to_target_ids)
    target_ids = torch.tensor(target.encode("".join(PROMPTS) + "".join(prompts_for(args.target))))
    return {
        "vllm_intersection": theirs.intersection_size, "anyspec_intersection": ours.intersection_size,
        "only_vllm": int((theirs.intersection_mask_draft & ~ours.intersection_mask_draft).sum()),
        "only_anyspec": int((ours.intersection_mask_draft & ~theirs.intersection_mask_draft).sum()),
        "paired_differently": int(differ.sum()),
        "same_unk_ids": (theirs.target_unk_token_id, theirs.draft_unk_token_id)
        == (ours.target_unk_token_id, ours.draft_unk_token_id),
        "identical_tables": bool(torch.equal(theirs.draft_to_target_ids, ours.draft_to_target_ids)
                                 and torch.equal(theirs.target_to_draft_ids, ours.target_to_draft_ids)),
        "only_vllm_examples": [draft.convert_ids_to_tokens(int(i)) for i in
                               torch.nonzero(theirs.intersection_mask_draft
                                             & ~ours.intersection_mask_draft).flatten()[:12]],
        "prompt_tokens": len(target_ids),
        "prompt_tokens_unk_vllm": int((theirs.target_to_draft_ids[target_ids] < 0).sum()),
        "prompt_tokens_unk_anyspec": int((ours.target_to_draft_ids[target_ids] < 0).sum()),
    }


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--target", required=True)
    parser.add_argument("--draft", required=True)
    parser.add_argument("--mode", choices=["none", "builtin", "anyspec"], default="anyspec")
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--compare-mappings", action="store_true")
    args = parser.parse_args()
    result = compare_mappings(args) if args.compare_mappings else run(args)
    sys.stdout.flush()
    print("RESULT " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
