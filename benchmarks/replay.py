"""Stop rules for the draft's chain, scored on one recorded run instead of one timed run each.

    python benchmarks/replay.py [--k 8] [--limit 6] [--skip 0] [--threads 2] [--json F]
    python benchmarks/replay.py --load F [--rows-free] [--draft-scale 0.5]

Greedy SLEM with the default pair drafts k tokens every round with no stop and no branches; each
round records the draft's probability of each token it wrote and the target ids that each prefix
of its tokens re-encodes to. Greedy output is the target's own, so how many target tokens any
shorter proposal of that round would have had accepted is known exactly: the common prefix of its
ids with the output from the round's position on. The costs are measured in the same run: every
forward of both models is timed, by the rows it computed.

A rule decides after which draft token a round stops. Its rounds are then scored with the
measured costs: the round's own catch-up forward, one draft forward per further token, the
median verify of that many rows, and the run's remaining time per round (Python, commits), which
makes the recorded rule's modeled time equal its measured time. Its speed over the target alone
(measured on the same prompts, decode only, prefill left out of both) is a model, not a
measurement: the rounds after a different stop would not be the same rounds. It ranks rules
without the noise of separate timed runs; ``anyspec bench`` or ``tune.py`` confirms a ranking.

``hindsight`` picks each round's stop so that the whole run is fastest, knowing what the target
accepts: no rule that sees only the draft's numbers can beat it on these rounds. ``--rows-free``
and ``--draft-scale`` score the same rounds as if a verify of any rows cost one row, or a draft
forward a multiple of its measured seconds (``--load``: a recording written by ``--json``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np
import torch

import anyspec.engine.batch as batching
import anyspec.engine.loop as loop
from anyspec.algorithms.adaptive_k import confidence
from anyspec.backends.load import load_model
from anyspec.bench.prompts import DEFAULT_PROMPTS, load_prompts
from anyspec.engine import Engine, SamplingParams, SpeculativeConfig
from anyspec.engine.prefix import common_prefix


def timed_forwards(model, log: list):
    """Record (rows, seconds) of every forward of ``model``."""
    forward = model.forward

    def wrapper(batch, head=None):
        start = time.perf_counter()
        out = forward(batch, head)
        log.append((sum(len(entry[1]) for entry in batch), time.perf_counter() - start))
        return out

    model.forward = wrapper


class Noting:
    """A proposer that notes the draft tokens of the round it re-encodes to target ids."""

    def __init__(self, proposer):
        self.proposer, self.draft_ids = proposer, []

    def __getattr__(self, name):
        return getattr(self.proposer, name)

    def to_target(self, ctx, draft_ids, limit):
        self.draft_ids = list(draft_ids)
        return self.proposer.to_target(ctx, draft_ids, limit)


def record(engine: Engine, prompt, max_new_tokens: int, draft_log: list, target_log: list) -> dict:
    """One generation with the rounds it drafted: position, probabilities, prefixes' target ids,
    the catch-up forward's seconds. It runs with the config's k every round (no k schedule)."""
    rounds, state = [], {"pos": 0}
    propose, verify = loop.propose, loop.verify

    def propose_and_note(proposer, draft, ctx, k, *args):
        """``loop.propose``, keeping the logits each of its draft forwards answered."""
        first, replies, noting = len(draft_log), [], Noting(proposer)
        steps, reply = propose(noting, draft, ctx, k, *args), None
        while True:
            try:
                forward = steps.send(reply)
            except StopIteration as done:
                proposal = done.value
                break
            reply = yield forward
            replies.append(reply[-1])
        ids = noting.draft_ids
        # each draft token is chosen from the last row of a forward: the first from the catch-up's,
        # each next one from the forward that read the token before it
        chose = replies[len(replies) - len(ids):]
        probs = [confidence(logits, d, None, proposer.mask) for logits, d in zip(chose, ids, strict=True)]
        rounds.append({"pos": state["pos"], "probs": probs,
                       "prefixes": [proposer.to_target(ctx, ids[:i], k) for i in range(1, len(ids) + 1)],
                       "catch_up": draft_log[first][1] if len(draft_log) > first else 0.0})
        return proposal

    def verify_and_count(*args):
        verified = yield from verify(*args)
        state["pos"] += len(verified[0]) + 1  # the accepted tokens and the target's own
        return verified

    greedy = SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens)
    loop.propose, loop.verify = propose_and_note, verify_and_count
    try:
        first = len(target_log)
        steps = batching.alone(lambda batch: loop.speculative_generate(engine, prompt, greedy,
                                                                       batch.meter(0)))
        while True:
            try:
                next(steps)
            except StopIteration as done:
                result = done.value
                break
    finally:
        loop.propose, loop.verify = propose, verify
    prefill = target_log[first][1]
    return {"rounds": rounds, "ids": result.token_ids, "decode": result.stats.total_seconds - prefill}


def stop_by_token(threshold: float, k: int):
    """The engine's rule: stop after the first token the draft gives less than ``threshold``."""
    def stop(r):
        below = [i for i, p in enumerate(r["probs"][:k]) if p < threshold]
        return min(below[0] + 1 if below else k, len(r["probs"]))
    return stop


def stop_by_chain(threshold: float, k: int):
    """Stop once the product of the draft's probabilities so far falls below ``threshold``."""
    def stop(r):
        chain = np.cumprod(r["probs"][:k])
        below = np.nonzero(chain < threshold)[0]
        return min(int(below[0]) + 1 if len(below) else k, len(r["probs"]))
    return stop


def record_runs(args) -> dict:
    """The recorded rounds of every prompt, the target alone's decode seconds on it, and the
    forwards' costs."""
    target = load_model(args.target, dtype="gguf", name="target")
    draft = load_model(args.draft, dtype="gguf", name="draft")
    target_log, draft_log = [], []
    timed_forwards(target, target_log)
    timed_forwards(draft, draft_log)
    config = SpeculativeConfig(num_speculative_tokens=args.k, algorithm="slem", draft_confidence=0, tree=0,
                               prefix_cache=False, ngram=0)
    spec, alone = Engine(target, draft, config), Engine(target, None, SpeculativeConfig(prefix_cache=False))
    for engine in (spec, alone):
        engine.generate("Hello", SamplingParams(max_new_tokens=4))
    target_log.clear()
    draft_log.clear()
    runs = []
    for path in DEFAULT_PROMPTS:
        for p in load_prompts(path)[args.skip: args.skip + args.limit]:
            first = len(target_log)
            greedy = SamplingParams(temperature=0.0, max_new_tokens=args.max_new_tokens)
            base = alone.generate(p["prompt"], greedy)
            base_decode = base.stats.total_seconds - target_log[first][1]
            run = record(spec, p["prompt"], args.max_new_tokens, draft_log, target_log)
            if run["ids"] != base.token_ids:
                raise SystemExit(f"{p['id']}: the speculative output differs from the target alone's")
            runs.append({"id": p["id"], "set": p["set"], "base_decode": base_decode, **run})
            print(f"{p['set']}/{p['id']:<16} {len(run['rounds'])} rounds, {len(run['ids'])} tokens",
                  flush=True)
    by_rows = {}
    for rows, seconds in target_log:
        by_rows.setdefault(rows, []).append(seconds)
    verify = {r: statistics.median(v) for r, v in by_rows.items() if len(v) >= 3 and r <= args.k + 1}
    one_row = statistics.median(s for n, s in draft_log if n == 1)
    return {"runs": runs, "verify": verify, "draft_forward": one_row}


def score(recorded: dict, k_max: int, rows_free: bool = False, draft_scale: float = 1.0) -> list[dict]:
    """Every rule's modeled speed over the target alone, per prompt set. What if: ``rows_free``, a
    verify of any rows costs one row; ``draft_scale``, a draft forward costs that many times its own."""
    runs = recorded["runs"]
    known = sorted(recorded["verify"])
    costs = {"draft": 1.0, "times": [recorded["verify"][r] for r in known]}

    def round_cost(r, j: int) -> tuple[int, float]:
        ids = r["prefixes"][j - 1] if j else []
        accepted = min(common_prefix(ids, r["future"]) + 1, len(r["future"]))
        verify = float(np.interp(len(ids) + 1, known, costs["times"]))
        draft = (r["catch_up"] + (j - 1) * recorded["draft_forward"]) * costs["draft"]
        return accepted, draft + verify

    for run in runs:
        for r in run["rounds"]:
            r["future"] = run["ids"][r["pos"]:]
        modeled = sum(round_cost(r, len(r["probs"]))[1] for r in run["rounds"])
        run["overhead"] = (run["decode"] - modeled) / max(1, len(run["rounds"]))
    costs["draft"] = draft_scale
    if rows_free:
        costs["times"] = [recorded["verify"][known[0]]] * len(known)

    def speed(mine, stop) -> float:
        tokens = seconds = 0.0
        for run in mine:
            for r in run["rounds"]:
                t, c = round_cost(r, stop(r))
                tokens, seconds = tokens + t, seconds + c + run["overhead"]
        return tokens / seconds

    def hindsight(mine) -> float:
        """The best speed of any stop per round (Dinkelbach: at the speed reached so far, each round
        takes the stop with the most tokens less that speed times its seconds, until it settles)."""
        rate = 0.0
        for _ in range(50):
            def best(r, rate=rate):
                costs = [round_cost(r, j) for j in range(1, len(r["probs"]) + 1)]
                return 1 + int(np.argmax([t - rate * c for t, c in costs]))
            rate, before = speed(mine, best), rate
            if abs(rate - before) < 1e-9:
                break
        return rate

    rules = {f"no stop, k = {k_max} (recorded)": lambda r: len(r["probs"])}
    for k in sorted({4, 5, 6, k_max}):
        rules.update({f"token < {t:g}, k = {k}": stop_by_token(t, k) for t in (0.3, 0.5, 0.7, 0.8)})
        rules.update({f"chain < {t:g}, k = {k}": stop_by_chain(t, k) for t in (0.2, 0.3, 0.4)})
    table = []
    for name in [*rules, "hindsight"]:
        row = {"rule": name}
        for s in sorted({run["set"] for run in runs}):
            mine = [run for run in runs if run["set"] == s]
            base = sum(len(run["ids"]) for run in mine) / sum(run["base_decode"] for run in mine)
            row[s] = round((hindsight(mine) if name == "hindsight" else speed(mine, rules[name])) / base, 3)
        table.append(row)
    for run in runs:
        for r in run["rounds"]:
            r.pop("future")
    return table


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="qwen2.5-coder-1.5b")
    ap.add_argument("--draft", default="smollm2-135m")
    ap.add_argument("--k", type=int, default=8, help="draft tokens recorded a round")
    ap.add_argument("--limit", type=int, default=6, help="prompts per set")
    ap.add_argument("--skip", type=int, default=0, help="prompts per set left out before them")
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", type=Path, default=None, help="write the recording and the table here")
    ap.add_argument("--load", type=Path, default=None, help="score a recording written by --json instead")
    ap.add_argument("--rows-free", action="store_true", help="what if a verify of any rows cost one row")
    ap.add_argument("--draft-scale", type=float, default=1.0,
                    help="what if a draft forward cost this many times its measured seconds")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.load:
        recorded = json.loads(args.load.read_text())
        recorded["verify"] = {int(r): v for r, v in recorded["verify"].items()}
        args.k = int(recorded["args"]["k"])
    else:
        recorded = record_runs(args)
        recorded["args"] = {k: str(v) for k, v in vars(args).items()}
    table = score(recorded, args.k, args.rows_free, args.draft_scale)
    sets = [key for key in table[0] if key != "rule"]
    print(f"\ndraft forward {1e3 * recorded['draft_forward']:.1f} ms; verify by rows (ms): "
          + ", ".join(f"{r}: {1e3 * v:.0f}" for r, v in sorted(recorded["verify"].items())))
    print("\n| rule | " + " | ".join(f"{s}: model ÷ target alone" for s in sets) + " |\n|---|"
          + "---:|" * len(sets))
    for row in table:
        print(f"| {row['rule']} | " + " | ".join(f"{row[s]:.2f}×" for s in sets) + " |")
    if args.json:
        args.json.write_text(json.dumps({**recorded, "table": table}) + "\n")


if __name__ == "__main__":
    main()
