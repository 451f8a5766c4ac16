"""Forward cost by rows, 1..8, for llama.cpp and anyspec's kernels on the same GGUF file.

    python benchmarks/forward_rows.py [--model qwen2.5-coder-1.5b | --model FILE.gguf] [--threads 2]
        [--rounds 3] [--repeats 3] [--rows 1 2 3 4 5 6 7 8] [--depth 0] [--n-gen 64] [--prefill 0]
        [--json F] [--markdown F]

A forward of N rows is what verifying N - 1 draft tokens costs. llama.cpp's side is ``llama-bench``
(``-p 1,..,8``: N prompt tokens on a cache of ``--depth`` tokens, plus ``-n 64`` for the time per
generated token at that depth); anyspec's side loads the GGUF with anyspec's kernels, fills its
cache with ``--depth`` tokens (in the engine's prefill chunks) and times ``extend`` of N tokens
there, and 64 tokens decoded one at a time after it. ``--prefill P`` also times a P-token prompt on
an empty cache: ``llama-bench -p P`` (its own batches), and anyspec's ``extend`` of P tokens in the
engine's prefill chunks (``PREFILL_CHUNK``). The two engines alternate round by round, each round
starting with the other one, so drift of a noisy machine falls on both; every figure is the median
over rounds.
"""

from __future__ import annotations

import argparse
import functools
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

from anyspec.bench.llama import forward_cost_by_rows, llama_cpp_problem, target_gguf
from anyspec.cli.bench import publish
from anyspec.engine.batch import PREFILL_CHUNK


@functools.cache
def load_target(spec: str):
    """The model on anyspec's GGUF kernels, loaded once for every round."""
    from anyspec.backends.load import load_model

    return load_model(spec, dtype="gguf", name="target")


def random_ids(model, n: int) -> list[int]:
    """``n`` token ids, the same every call."""
    return [int(i) for i in torch.randint(100, min(model.vocab_size, 20000), (n,),
                                          generator=torch.Generator().manual_seed(0))]


def fill(model, ids: list[int]) -> None:
    """``ids`` into the model's cache as the engine's prefill puts them: chunks of ``PREFILL_CHUNK``."""
    for start in range(0, len(ids), PREFILL_CHUNK):
        model.extend(ids[start:start + PREFILL_CHUNK], last=1)


def decode_cost(spec: str, n_gen: int, threads: int, depth: int = 0) -> float:
    """Milliseconds per token of ``n_gen`` tokens decoded one at a time after a prompt of ``depth``
    tokens (at least one), as llama.cpp's ``llama-bench -n N -d depth`` measures it."""
    torch.set_num_threads(threads)
    model = load_target(spec)
    model.reset()
    ids = random_ids(model, max(1, depth))
    fill(model, ids[:-1])
    token = int(model.extend(ids[-1:])[-1].argmax())
    start = time.perf_counter()
    for _ in range(n_gen):
        token = int(model.extend([token])[-1].argmax())
    model.reset()
    return 1000 * (time.perf_counter() - start) / n_gen


def prefill_cost(spec: str, tokens: int, repeats: int, threads: int) -> float:
    """Milliseconds to prefill a prompt of ``tokens`` tokens on an empty cache in the engine's chunks:
    the median of ``repeats``."""
    torch.set_num_threads(threads)
    model = load_target(spec)
    ids = random_ids(model, tokens)
    times = []
    for _ in range(repeats):
        model.reset()
        start = time.perf_counter()
        fill(model, ids)
        times.append(time.perf_counter() - start)
    model.reset()
    return 1000 * statistics.median(times)


def forward_cost(spec: str, rows, repeats: int, threads: int, cache_len: int) -> dict[int, float]:
    """Milliseconds of one forward of N rows on a cache of ``cache_len`` tokens, for each N in ``rows``:
    the median of ``repeats`` forwards."""
    torch.set_num_threads(threads)
    model = load_target(spec)
    ids = random_ids(model, cache_len + max(rows))
    model.reset()
    fill(model, ids[:max(1, min(cache_len, PREFILL_CHUNK))])  # page the weights in
    out = {}
    for n in rows:
        times = []
        for _ in range(repeats):
            model.reset()
            fill(model, ids[:cache_len])
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
             f"cache depth {c['depth']}", ""]
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
            lines.append(f"\n{name}: {side['token_ms']:.1f} ms per generated token (tg{c['n_gen']} at depth "
                         f"{c['depth']}, {1000 / side['token_ms']:.1f} tok/s){build}")
        if side and side.get("prefill_ms"):
            lines.append(f"\n{name}: {side['prefill_ms']:.0f} ms to prefill {c['prefill']} tokens on an "
                         f"empty cache ({1000 * c['prefill'] / side['prefill_ms']:.1f} tok/s)")
    lines += [f"- {k}: {v}" for k, v in result["notes"].items()]
    return "\n".join(lines) + "\n"


def llama_round(gguf, args) -> dict:
    """One round of llama.cpp: rows and decode at ``--depth``, then ``--prefill`` on an empty cache."""
    r = forward_cost_by_rows(gguf, args.rows, args.threads, args.repeats, args.n_gen, args.depth)
    out = {"forward_ms": r["forward_ms"], "token_ms": r["token_ms"], "build": r["build"]}
    if args.prefill:
        p = forward_cost_by_rows(gguf, (args.prefill,), args.threads, args.repeats, 0, 0)
        out["prefill_ms"] = p["forward_ms"][args.prefill]
    return out


def anyspec_round(args) -> dict:
    """One round of anyspec's kernels, as :func:`llama_round` measures llama.cpp."""
    out = {"forward_ms": forward_cost(args.model, args.rows, args.repeats, args.threads, args.depth),
           "token_ms": decode_cost(args.model, args.n_gen, args.threads, args.depth) if args.n_gen else None}
    if args.prefill:
        out["prefill_ms"] = prefill_cost(args.model, args.prefill, args.repeats, args.threads)
    return out


def measure(gguf, engines: list[str], args, notes: dict, log) -> dict[str, list[dict]]:
    """Every engine's rounds, alternating which one starts; an engine that fails leaves a note."""
    samples = {e: [] for e in engines}
    for i in range(args.rounds if engines else 0):
        for engine in engines[i % len(engines):] + engines[:i % len(engines)]:
            if engine in notes:
                continue
            try:
                got = llama_round(gguf, args) if engine == "llama.cpp" else anyspec_round(args)
            except Exception as exc:  # one engine failing (LlamaCppUnavailable or worse) leaves the other's
                notes[engine] = f"failed in round {i + 1}: {str(exc).splitlines()[0] if str(exc) else exc!r}"
                continue
            samples[engine].append(got)
            log(f"round {i + 1} {engine} ms by rows: "
                + ", ".join(f"{n}: {ms:.1f}" for n, ms in got["forward_ms"].items()))
    return samples


def median_of(rounds: list[dict], key: str) -> float | None:
    values = [r[key] for r in rounds if r.get(key) is not None]
    return statistics.median(values) if values else None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="qwen2.5-coder-1.5b",
                    help="a built-in model name or a .gguf file (default %(default)s)")
    ap.add_argument("--rows", nargs="+", type=int, default=list(range(1, 9)), metavar="N",
                    help="the row counts of the forwards timed (default: 1 to 8)")
    ap.add_argument("--threads", type=int, default=2, metavar="N",
                    help="CPU threads of both engines (default %(default)s)")
    ap.add_argument("--rounds", type=int, default=3, metavar="N",
                    help="rounds, the engines alternating which one starts; each figure is the median "
                         "over them (default %(default)s)")
    ap.add_argument("--repeats", type=int, default=3, metavar="N",
                    help="measurements per row count in each round (default %(default)s)")
    ap.add_argument("--depth", type=int, default=0, metavar="N",
                    help="both engines' cache length before each forward and before the decoded tokens "
                         "(default %(default)s)")
    ap.add_argument("--n-gen", type=int, default=64, metavar="N",
                    help="tokens decoded one at a time for ms/token (0: skip; default %(default)s)")
    ap.add_argument("--prefill", type=int, default=0, metavar="P",
                    help="also time a P-token prompt on an empty cache (0: skip; default %(default)s)")
    ap.add_argument("--json", type=Path, default=None, metavar="FILE",
                    help="write the whole result as JSON here (default: none)")
    ap.add_argument("--markdown", type=Path, default=None, metavar="FILE",
                    help="write the table here (it is printed anyway; default: none)")
    args = ap.parse_args(argv)
    log = lambda s: print(s, file=sys.stderr, flush=True)  # noqa: E731
    if min(args.rows) < 1 or args.depth < 0 or args.n_gen < 0 or args.prefill < 0:
        ap.error("--rows must be >= 1; --depth, --n-gen and --prefill >= 0")

    notes = {}
    gguf = target_gguf(args.model)
    problem = llama_cpp_problem(gguf if gguf else args.model)
    if problem:
        notes["llama.cpp"] = problem
    engines = [e for e in ("llama.cpp", "anyspec") if e not in notes]
    samples = measure(gguf, engines, args, notes, log)
    result = {"config": {"model": args.model, "gguf": str(gguf) if gguf else None, "rows": args.rows,
                         "threads": args.threads, "rounds": args.rounds, "repeats": args.repeats,
                         "depth": args.depth, "n_gen": args.n_gen, "prefill": args.prefill,
                         "machine": cpu()},
              "notes": notes}
    for engine, rounds in samples.items():
        if rounds:
            result[engine] = {"forward_ms": median_by_rows([r["forward_ms"] for r in rounds]),
                              "rounds": [r["forward_ms"] for r in rounds],
                              "token_ms": median_of(rounds, "token_ms"),
                              "prefill_ms": median_of(rounds, "prefill_ms"),
                              "prefill_rounds": [r.get("prefill_ms") for r in rounds],
                              **({"build": rounds[-1]["build"]} if engine == "llama.cpp" else {})}
    publish(result, markdown(result), args.json, args.markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
