"""Sampled rounds on the default pair: how the draft's temperature and branches change what a round
commits. The counts do not depend on the CPU or its load (only on the pair and the seeds), so this
needs no quiet machine; seconds per round come from ``anyspec bench``.

The draft's temperature is the request's times ``--factors`` (1 = the request's own, the engine's
rule): its coupled Gumbel-max choice (``engine/sampler.py``) is taken over its logits at that
temperature, while the target's choices, and so the answers, stay the same.

    python benchmarks/draft_temperature.py --temperatures 0.7 1.0 --factors 0.5 0.75 1 1.25 --tree 0 2
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools

from anyspec.backends.load import load_model
from anyspec.bench.prompts import load_prompts, prompt_file
from anyspec.engine import Engine, SamplingParams, SpeculativeConfig
from anyspec.engine import sampler as sampler_module
from anyspec.models import DEFAULT_DRAFT, DEFAULT_TARGET, gguf_path


def prompts(limit: int) -> list[list[dict]]:
    """The first ``limit`` prompts of the ``code`` set, then of ``prose``."""
    return [row["prompt"] for name in ("code", "prose") for row in load_prompts(prompt_file(name))[:limit]]


def with_draft_factor(factor: float):
    """``Sampler.draft_choice`` at ``factor`` times the request's temperature."""
    choice = sampler_module.Sampler.draft_choice

    def scaled(self, logits, position, mask=None):
        params = self.params
        self.params = dataclasses.replace(params, temperature=params.temperature * factor)
        try:
            return choice(self, logits, position, mask)
        finally:
            self.params = params

    sampler_module.Sampler.draft_choice = scaled if factor != 1 else choice
    return choice


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--temperatures", type=float, nargs="+", default=[0.7, 1.0], metavar="T",
                    help="the requests' temperatures (default: 0.7 1.0)")
    ap.add_argument("--factors", type=float, nargs="+", default=[0.5, 0.75, 1.0, 1.25], metavar="F",
                    help="the draft's temperature as the request's times F (1 = the request's own, the "
                         "engine's rule; default: 0.5 0.75 1.0 1.25)")
    ap.add_argument("--tree", type=int, nargs="+", default=[0, 2], metavar="N",
                    help="branches beside the draft's chain (0 = the chain alone; default: 0 2)")
    ap.add_argument("--seeds", type=int, default=2, metavar="N",
                    help="each prompt with seeds 0 to N-1 (default %(default)s)")
    ap.add_argument("--limit", type=int, default=6, metavar="N",
                    help="prompts per set (code, prose; default %(default)s)")
    ap.add_argument("--max-new-tokens", type=int, default=64, metavar="N",
                    help="the most tokens each answer may have (default %(default)s)")
    args = ap.parse_args()
    target = load_model(str(gguf_path(DEFAULT_TARGET)), dtype="gguf", name="target")
    draft = load_model(str(gguf_path(DEFAULT_DRAFT)), dtype="gguf", name="draft")
    original = sampler_module.Sampler.draft_choice
    print("| T | draft T | branches | acceptance | tokens per round | draft tokens per round | branch rows "
          "per round |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for temperature, factor, tree in itertools.product(args.temperatures, args.factors, args.tree):
        with_draft_factor(factor)
        engine = Engine(target, draft, SpeculativeConfig(algorithm="slem", tree=tree))
        totals = dict(rounds=0, drafted=0, accepted=0, generated=0, branch_rows=0)
        for messages, seed in itertools.product(prompts(args.limit), range(args.seeds)):
            params = SamplingParams(temperature=temperature, max_new_tokens=args.max_new_tokens, seed=seed)
            stats = engine.generate(messages, params).stats
            for name in totals:
                totals[name] += getattr(stats, name)
        sampler_module.Sampler.draft_choice = original
        per_round = {name: value / totals["rounds"] for name, value in totals.items()}
        print(f"| {temperature} | {temperature * factor:.2f} | {tree} | "
              f"{totals['accepted'] / max(totals['drafted'], 1):.3f} | {per_round['generated']:.2f} | "
              f"{per_round['drafted']:.2f} | {per_round['branch_rows']:.2f} |", flush=True)


if __name__ == "__main__":
    main()
