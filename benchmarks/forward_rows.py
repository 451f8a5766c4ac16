"""Forward cost by rows, 1..8, for llama.cpp and anyspec's kernels on the same GGUF file.

    python benchmarks/forward_rows.py [--model qwen2.5-coder-1.5b | --model FILE.gguf] [--threads 2]
        [--rounds 3] [--repeats 3] [--rows 1 2 3 4 5 6 7 8] [--depth 0] [--json F] [--markdown F]

A forward of N rows is what verifying N - 1 draft tokens costs. llama.cpp's side is ``llama-bench``
(``-p 1,..,8``: N prompt tokens on a cache of ``--depth`` tokens, plus ``-n 64`` for the time per
generated token); anyspec's side loads the GGUF with anyspec's kernels and times ``extend`` of N
tokens at a fixed cache length, and 64 tokens decoded one at a time. The two engines alternate
round by round, each round starting with the other one, so drift of a noisy machine falls on both;
every figure is the median over rounds.
"""

from __future__ import annotations

import argparse
import functools
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

from anyspec.bench.llama import forward_cost_by_rows, llama_cpp_problem, target_gguf


@functools.cache
def load_target(spec: str):
    """The model on anyspec's GGUF kernels, loaded once for every round."""
    from anyspec.backends.load import load_model

    return load_model(spec, dtype="gguf", name="target")


def decode_cost(spec: str, n_gen: int, threads: int) -> float:
    """Milliseconds per token of ``n_gen`` tokens decoded one at a time after a one-token prompt, as
    llama.cpp's ``llama-bench -n`` measures it."""
    torch.set_num_threads(threads)
    model = load_target(spec)
    token = int(model.extend([1000])[-1].argmax())
    start = time.perf_counter()
    for _ in range(n_gen):
        token = int(model.extend([token])[-1].argmax())
    model.reset()
    return 1000 * (time.perf_counter() - start) / n_gen


def forward_cost(spec: str, rows, repeats: int, threads: int, cache_len: int) -> dict[int, float]:
    """Milliseconds of one forward of N rows on a cache of ``cache_len`` tokens, for each N in ``rows``:
    the median of ``repeats`` forwards."""
    torch.set_num_threads(threads)
    model = load_target(spec)
    ids = [int(i) for i in torch.randint(100, min(model.vocab_size, 20000), (cache_len + max(rows),),
                                         generator=torch.Generator().manual_seed(0))]
    model.extend(ids[:max(1, cache_len)])  # page the weights in
    out = {}
    for n in rows:
        times = []
        for _ in range(repeats):
            model.reset()
            if cache_len:
                model.extend(ids[:cache_len], last=1)
            start = time.perf_counter()
            model.extend(ids[cache_len:cache_len + n])
            times.append(time.perf_counter() - start)
        out[n] = 1000 * statistics.median(times)
    model.reset()
    return out


def cpu() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else the machine type."""
    try:
        names = [line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                 if line.startswith("model name")]
    except OSError:
        names = []
    return f"{names[0]} x{len(names)}" if names else platform.machine()


def median_by_rows(rounds: list[dict]) -> dict:
    rows = sorted({n for r in rounds for n in r})
    return {n: statistics.median(r[n] for r in rounds if n in r) for n in rows}


def markdown(result: dict) -> str:
    c = result["config"]
    lines = [f"forward cost by rows, `{c['model']}` ({c['gguf']}), {c['machine']}, {c['threads']} threads, "
             f"median of {c['rounds']} alternating rounds x {c['repeats']} repeats, "
             f"llama.cpp cache depth {c['depth']}", ""]
    llama, mine = result.get("llama.cpp"), result.get("anyspec")
    lines += ["| rows | llama.cpp ms | x 1 row | anyspec ms | x 1 row | anyspec / llama.cpp |",
              "|---:|---:|---:|---:|---:|---:|"]
    for n in c["rows"]:
        cells = []
        for side in (llama, mine):
            ms = side["forward_ms"].get(n) if side else None
            one = side["forward_ms"].get(1) if side else None
            cells += [f"{ms:.1f}" if ms else "-", f"{ms / one:.2f}" if ms and one else "-"]
        a, b = (llama or {}).get("forward_ms", {}).get(n), (mine or {}).get("forward_ms", {}).get(n)
        lines.append(f"| {n} | {' | '.join(cells)} | {f'{b / a:.2f}' if a and b else '-'} |")
    for name, side in (("llama.cpp", llama), ("anyspec", mine)):
        if side and side.get("token_ms"):
            build = f", build {side['build']}" if side.get("build") else ""
            lines.append(f"\n{name}: {side['token_ms']:.1f} ms per generated token (tg{c['n_gen']}, "
                         f"{1000 / side['token_ms']:.1f} tok/s){build}")
    lines += [f"- {k}: {v}" for k, v in result["notes"].items()]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="qwen2.5-coder-1.5b", help="a built-in model name or a .gguf file")
    ap.add_argument("--rows", nargs="+", type=int, default=list(range(1, 9)))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=3, help="measurements per row count in each round")
    ap.add_argument("--depth", type=int, default=0, help="llama.cpp's cache length before each forward")
    ap.add_argument("--n-gen", type=int, default=64, help="llama.cpp tokens generated for ms/token (0: skip)")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--markdown", type=Path, default=None)
    args = ap.parse_args(argv)
    log = lambda s: print(s, file=sys.stderr, flush=True)  # noqa: E731

    notes = {}
    gguf = target_gguf(args.model)
    problem = llama_cpp_problem(gguf if gguf else args.model)
    if problem:
        notes["llama.cpp"] = problem
    engines = [e for e in ("llama.cpp", "anyspec") if e not in notes]
    samples = {e: [] for e in engines}
    token_ms, build, anyspec_token_ms = [], None, []
    for i in range(args.rounds if engines else 0):
        for engine in engines[i % len(engines):] + engines[:i % len(engines)]:
            if engine in notes:
                continue
            try:
                if engine == "llama.cpp":
                    r = forward_cost_by_rows(gguf, args.rows, args.threads, args.repeats, args.n_gen,
                                             args.depth)
                    samples[engine].append(r["forward_ms"])
                    build = r["build"]
                    if r["token_ms"]:
                        token_ms.append(r["token_ms"])
                else:
                    samples[engine].append(forward_cost(args.model, args.rows, args.repeats, args.threads,
                                                        args.depth))
                    if args.n_gen:
                        anyspec_token_ms.append(decode_cost(args.model, args.n_gen, args.threads))
            except Exception as exc:  # one engine failing (LlamaCppUnavailable or worse) leaves the other's
                notes[engine] = f"failed in round {i + 1}: {str(exc).splitlines()[0] if str(exc) else exc!r}"
                continue
            got = ", ".join(f"{n}: {ms:.1f}" for n, ms in samples[engine][-1].items())
            log(f"round {i + 1} {engine} ms by rows: {got}")

    result = {"config": {"model": args.model, "gguf": str(gguf) if gguf else None, "rows": args.rows,
                         "threads": args.threads, "rounds": args.rounds, "repeats": args.repeats,
                         "depth": args.depth, "n_gen": args.n_gen,
                         "machine": cpu()},
              "notes": notes}
    if samples.get("llama.cpp"):
        result["llama.cpp"] = {"forward_ms": median_by_rows(samples["llama.cpp"]),
                               "rounds": samples["llama.cpp"],
                               "token_ms": statistics.median(token_ms) if token_ms else None, "build": build}
    if samples.get("anyspec"):
        result["anyspec"] = {"forward_ms": median_by_rows(samples["anyspec"]), "rounds": samples["anyspec"],
                             "token_ms": statistics.median(anyspec_token_ms) if anyspec_token_ms else None}
    table = markdown(result)
    print(table)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    if args.markdown:
        args.markdown.write_text(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
