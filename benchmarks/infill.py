"""Fill in the middle, as an editor's code completion asks: from each file of the ``edit`` set, a
method's body is cut out and asked for between the code before it and the code after it (the
target's FIM prompt, ``prompt.fill_in_the_middle``). The default pair's defaults against its target
alone, alternating, greedy: tokens/s (prefill included), and whether each answer is the same.
Needs a quiet machine.

    python benchmarks/infill.py --limit 4 --max-new-tokens 96
"""

from __future__ import annotations

import argparse
import re
import time

from anyspec.bench.prompts import load_prompts, prompt_file
from anyspec.engine import Engine, SamplingParams
from anyspec.engine.prompt import fill_in_the_middle
from anyspec.pair import check_pair, load_pair


def holes(limit: int) -> list[tuple[str, str, str]]:
    """``(id, prefix, suffix)``: in each Python file of the set, a method's body cut out (the middle
    one of the file's, then the one after it, ...)."""
    files = {}
    for case in load_prompts(prompt_file("edit")):
        found = re.search(r"```python\n(.*?)```", case["prompt"][-1]["content"], re.S)
        if found and found.group(1) not in files.values():
            files[case["id"]] = found.group(1)
    out = []
    for n in range(limit):
        name, code = list(files.items())[n % len(files)]
        lines = code.splitlines(keepends=True)
        defs = [i for i, x in enumerate(lines) if x.lstrip().startswith("def ")]
        start = defs[(len(defs) // 2 + n // len(files)) % len(defs)]
        indent = len(lines[start]) - len(lines[start].lstrip())
        end = next((i for i in range(start + 1, len(lines)) if lines[i].strip()
                    and len(lines[i]) - len(lines[i].lstrip()) <= indent), len(lines))
        out.append((name, "".join(lines[:start + 1]), "".join(lines[end:])))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--limit", type=int, default=4, metavar="N",
                    help="N method bodies to fill in, cut from the edit set's files in turn "
                         "(default %(default)s)")
    ap.add_argument("--max-new-tokens", type=int, default=96, metavar="N",
                    help="the most tokens each answer may have (default %(default)s)")
    ap.add_argument("--repeat", type=int, default=2, metavar="N",
                    help="every case this many times, the order of the two runs alternating "
                         "(default %(default)s)")
    ap.add_argument("--threads", type=int, default=2, metavar="N",
                    help="torch CPU threads (default %(default)s)")
    args = ap.parse_args()

    pair = load_pair(check_pair("qwen2.5-coder-1.5b", "smollm2-135m", "auto", "auto", args.threads))
    engines = {"defaults": Engine(pair.target, pair.draft), "target alone": Engine(pair.target, None)}
    params = SamplingParams(max_new_tokens=args.max_new_tokens)
    cases = [(name, fill_in_the_middle(pair.target.tokenizer, pre, suf))
             for name, pre, suf in holes(args.limit)]
    engines["defaults"].generate(cases[0][1], SamplingParams(max_new_tokens=4))  # warm up
    spent = {name: [0, 0.0, 0.0] for name in engines}  # tokens, seconds, prefill seconds
    same, accepted, drafted, found, taken = 0, 0, 0, 0, 0
    for rep in range(args.repeat):
        for i, (_, prompt) in enumerate(cases):
            answers = []
            for name in list(engines) if (rep + i) % 2 == 0 else list(engines)[::-1]:
                engines[name].target.reset()
                start = time.perf_counter()
                result = engines[name].generate(prompt, params)
                spent[name][0] += len(result.token_ids)
                spent[name][1] += time.perf_counter() - start
                spent[name][2] += result.stats.prefill_seconds
                answers.append(result.token_ids)
                if name == "defaults":
                    s = result.stats
                    accepted, drafted = accepted + s.accepted, drafted + s.drafted
                    found, taken = found + s.ngram_proposed, taken + s.ngram_accepted
            same += answers[0] == answers[1]
    for name, (tokens, seconds, prefill) in spent.items():
        print(f"{name}: {tokens / seconds:.2f} tok/s with the prefill, {prefill / seconds:.0%} of the time "
              f"prefilling, {tokens} tokens")
    print(f"draft tokens accepted {accepted}/{drafted}, tokens from the context {taken}/{found}; "
          f"identical {same}/{args.repeat * len(cases)}")


if __name__ == "__main__":
    main()
