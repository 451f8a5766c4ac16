"""llama.cpp's own lookup speculation, setting by setting, against llama.cpp without it.

    python benchmarks/llama_ngram_sweep.py [--model qwen2.5-coder-1.5b | --model FILE.gguf]
        [--prompts edit] [--limit N] [--max-new-tokens 128] [--rounds 1] [--threads 2]
        [--settings "--spec-type ngram-simple --spec-ngram-simple-size-n 3" ...] [--json F] [--markdown F]

Each setting is one ``llama-server`` on the GGUF file with the setting's arguments
(``anyspec.bench.llama_spec``; ``--spec-type none`` is always one of them, the reference): the
server starts, answers one short untimed request, then every prompt (greedy, as token ids, no prompt
cache; a conversation's first turn, a JSON schema ignored), and stops before the next setting's
starts. Each round runs every setting, the order rotating from round to round so drift of a noisy
machine falls on every setting alike. Without ``--settings``, the grid is every n-gram spec type
with a few lookup (n) and draft (m) sizes (``GRID``).

The table per setting: tok/s (generated tokens over each request's wall time, prefill included),
decode tok/s (llama-server's own ``predicted_ms``, after the first token), the draft tokens and the
share accepted, and how many answers equal the ``none`` setting's.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from anyspec.bench.llama import LlamaCppUnavailable, complete, llama_cpp_problem, llama_server, target_gguf
from anyspec.bench.llama_spec import llama_spec_args
from anyspec.bench.prompts import load_prompts, prompt_file, prompt_ids
from anyspec.bench.timing import timing_summary
from anyspec.cli.bench import publish
from anyspec.errors import ConfigError

NONE = "--spec-type none"


def _sizes(kind: str, n_opt: str, m_opt: str, pairs) -> list[str]:
    return [f"--spec-type {kind} {n_opt} {n} {m_opt} {m}" for n, m in pairs]


NM = ((2, 8), (3, 8), (3, 16), (4, 16))
GRID = [NONE,
        *_sizes("ngram-simple", "--spec-ngram-simple-size-n", "--spec-ngram-simple-size-m", NM),
        *_sizes("ngram-map-k", "--spec-ngram-map-k-size-n", "--spec-ngram-map-k-size-m", NM),
        *_sizes("ngram-map-k4v", "--spec-ngram-map-k4v-size-n", "--spec-ngram-map-k4v-size-m", NM),
        *[f"--spec-type ngram-mod --spec-ngram-mod-n-match {n} --spec-ngram-mod-n-min 1 "
          f"--spec-ngram-mod-n-max {m}" for n, m in ((4, 8), (8, 16), (24, 64))],
        "--spec-type ngram-cache"]


def label(setting: str) -> str:
    """``--spec-type ngram-map-k --spec-ngram-map-k-size-n 3 ...`` -> ``ngram-map-k size-n=3 ...``."""
    args = llama_spec_args(setting)
    kind = args[1]
    sizes = [f"{name.removeprefix('--spec-ngram-').removeprefix(kind.removeprefix('ngram-') + '-')}={value}"
             for name, value in zip(args[2::2], args[3::2], strict=True)]
    return " ".join([kind, *sizes])


def run_setting(gguf: Path, setting: str, requests: list[tuple[str, list[int]]], args,
                ctx_size: int) -> list[dict]:
    """Every request on one ``llama-server`` started with ``setting``'s arguments."""
    out = []
    with llama_server(gguf, args.threads, ctx_size, extra=llama_spec_args(setting)) as url:
        complete(url, requests[0][1][:16], 4)
        for rid, ids in requests:
            r = complete(url, ids, args.max_new_tokens)
            out.append({"prompt": rid, "tokens": len(r["ids"]), "ids": r["ids"], "seconds": r["seconds"],
                        **{k: r.get(k) for k in ("decode_tokens", "decode_seconds", "prefill_tokens",
                                                 "prefill_seconds", "ttft", "drafted", "accepted")}})
    return out


def sweep(gguf: Path, settings: list[str], requests, args, log) -> tuple[list[dict], dict]:
    """Every setting once a round, in an order rotating from round to round; a setting whose server
    fails leaves the sweep with a note."""
    ctx_size = max(4096, max(len(ids) for _, ids in requests) + args.max_new_tokens + 64)
    runs, notes, live = [], {}, list(settings)
    for i in range(args.rounds):
        for setting in live[i % len(live):] + live[:i % len(live)]:
            try:
                got = run_setting(gguf, setting, requests, args, ctx_size)
            except (LlamaCppUnavailable, OSError) as exc:
                notes[setting] = f"failed in round {i + 1}: {exc}"
                live.remove(setting)
                log(f"round {i + 1} {label(setting)}: {notes[setting]}")
                continue
            runs += [{**r, "setting": setting, "round": i + 1} for r in got]
            log(f"round {i + 1} {label(setting):<40} {sum(r['tokens'] for r in got):>5} tok "
                f"{sum(r['seconds'] for r in got):7.2f}s")
    return runs, notes


def summarize(runs: list[dict], settings: list[str]) -> list[dict]:
    reference = {r["prompt"]: r["ids"] for r in runs if r["setting"] == NONE}
    rows = []
    for setting in settings:
        mine = [r for r in runs if r["setting"] == setting]
        if not mine:
            continue
        tokens, seconds = sum(r["tokens"] for r in mine), sum(r["seconds"] for r in mine)
        drafted = sum(r["drafted"] or 0 for r in mine)
        same = [r["ids"] == reference[r["prompt"]] for r in mine if r["prompt"] in reference]
        rows.append({"setting": setting, "label": label(setting), "runs": len(mine), "tokens": tokens,
                     "tokens_per_second": round(tokens / seconds, 2) if seconds else None,
                     "decode_tokens_per_second": timing_summary(mine)["decode_tokens_per_second"],
                     "drafted": drafted,
                     "acceptance": round(sum(r["accepted"] or 0 for r in mine) / drafted, 3)
                     if drafted else None,
                     "same_as_none": f"{sum(same)}/{len(same)}" if same else None})
    base = next((r for r in rows if r["setting"] == NONE), None)
    for r in rows:
        ok = base and base["tokens_per_second"] and r["tokens_per_second"]
        r["vs_none"] = round(r["tokens_per_second"] / base["tokens_per_second"], 3) if ok else None
    return rows


def markdown(result: dict) -> str:
    c = result["config"]
    lines = [f"llama.cpp lookup speculation, `{c['model']}`, prompts {', '.join(c['prompts'])} "
             f"({c['requests']} requests), max_new_tokens={c['max_new_tokens']}, {c['threads']} threads, "
             f"{c['rounds']} rounds, greedy", "",
             "| setting | tok/s | ÷ none | decode tok/s | drafted | acceptance | same as none |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for r in result["summary"]:
        cells = [r["tokens_per_second"], r["vs_none"], r["decode_tokens_per_second"], r["drafted"],
                 r["acceptance"], r["same_as_none"]]
        lines.append(f"| {r['label']} | " + " | ".join("-" if v is None else str(v) for v in cells) + " |")
    lines += [f"- {label(s)}: {note}" for s, note in result["notes"].items()]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="qwen2.5-coder-1.5b", help="a built-in model name or a .gguf file")
    ap.add_argument("--prompts", nargs="+", default=["edit"], metavar="SET_OR_FILE")
    ap.add_argument("--limit", type=int, default=None, help="at most N prompts from each file")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--settings", nargs="+", default=None, metavar="ARGS",
                    help="llama-server spec arguments, one string a setting (default: the grid)")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--markdown", type=Path, default=None)
    args = ap.parse_args(argv)
    log = lambda s: print(s, file=sys.stderr, flush=True)  # noqa: E731

    settings = list(dict.fromkeys([NONE, *(args.settings or GRID)]))
    try:
        for s in settings:
            llama_spec_args(s, "--settings")
    except ConfigError as exc:
        ap.error(str(exc))
    for name, value in (("--limit", 1 if args.limit is None else args.limit),
                        ("--max-new-tokens", args.max_new_tokens),
                        ("--rounds", args.rounds), ("--threads", args.threads)):
        if value < 1:
            ap.error(f"{name} must be >= 1")
    gguf = target_gguf(args.model)
    problem = llama_cpp_problem(gguf or args.model)
    if problem:
        ap.error(problem)
    from anyspec.vocab.loading import load_tokenizer

    tok = load_tokenizer(gguf)
    rows = [p for f in args.prompts for p in load_prompts(prompt_file(f))[:args.limit]]
    requests = [(f"{p['set']}/{p['id']}", prompt_ids(tok, p["prompt"])) for p in rows]
    runs, notes = sweep(gguf, settings, requests, args, log)
    result = {"config": {"model": args.model, "gguf": str(gguf), "prompts": args.prompts,
                         "limit": args.limit, "requests": len(requests),
                         "max_new_tokens": args.max_new_tokens, "rounds": args.rounds,
                         "threads": args.threads, "settings": settings},
              "notes": notes, "summary": summarize(runs, settings), "runs": runs}
    publish(result, markdown(result), args.json, args.markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
