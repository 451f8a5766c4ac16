"""Sampled decoding with each row's Gumbel-max choice made by anyspec's kernel or by numpy
(``gumbel.choose``), alternating in one process: tokens/s of the default pair's SLEM and of its
target alone, and whether every answer is the same either way and with the draft as without.
Needs a quiet machine.

    python benchmarks/choose_ab.py --temperature 1.0
"""

from __future__ import annotations

import argparse
import time

from anyspec.algorithms import gumbel
from anyspec.bench.prompts import load_prompts, prompt_file
from anyspec.engine import Engine, SamplingParams, sampler
from anyspec.pair import check_pair, load_pair

WAYS = {"kernel": sampler.chooser, "numpy": lambda: gumbel.choose}


def prompts(limit: int) -> list[list[dict]]:
    """The first ``limit`` prompts of the ``code`` set, then of ``prose``."""
    return [row["prompt"] for name in ("code", "prose") for row in load_prompts(prompt_file(name))[:limit]]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--temperature", type=float, default=1.0,
                    help="the requests' temperature (default %(default)s)")
    ap.add_argument("--top-p", type=float, default=1.0, metavar="P",
                    help="the requests' nucleus sampling mass (1 = off; default %(default)s)")
    ap.add_argument("--limit", type=int, default=2, metavar="N",
                    help="prompts of each set (code, prose; default %(default)s)")
    ap.add_argument("--seeds", type=int, default=2, metavar="N",
                    help="each prompt with seeds 0 to N-1 (default %(default)s)")
    ap.add_argument("--max-new-tokens", type=int, default=96, metavar="N",
                    help="the most tokens each answer may have (default %(default)s)")
    ap.add_argument("--threads", type=int, default=2, metavar="N",
                    help="torch CPU threads (default %(default)s)")
    args = ap.parse_args()

    pair = load_pair(check_pair("qwen2.5-coder-1.5b", "smollm2-135m", "auto", "auto", args.threads))
    engines = {"SLEM": Engine(pair.target, pair.draft), "target alone": Engine(pair.target, None)}
    asked = prompts(args.limit)
    engines["SLEM"].generate(asked[0], SamplingParams(max_new_tokens=8))  # warm up
    spent = {(way, name): [0, 0.0] for way in WAYS for name in engines}
    same = 0
    for seed in range(args.seeds):
        for i, messages in enumerate(asked):
            params = SamplingParams(temperature=args.temperature, top_p=args.top_p,
                                    max_new_tokens=args.max_new_tokens, seed=seed)
            answers = []
            for way in list(WAYS) if (seed + i) % 2 == 0 else list(WAYS)[::-1]:
                sampler.chooser = WAYS[way]
                for name, engine in engines.items():
                    start = time.perf_counter()
                    result = engine.generate(messages, params)
                    spent[way, name][0] += len(result.token_ids)
                    spent[way, name][1] += time.perf_counter() - start
                    answers.append(result.token_ids)
            same += all(a == answers[0] for a in answers)
    for (way, name), (tokens, seconds) in spent.items():
        print(f"choices by {way}: {name} {tokens / seconds:.2f} tok/s")
    print(f"the same answer all four ways: {same}/{args.seeds * len(asked)}")


if __name__ == "__main__":
    main()
