"""Concurrent streaming clients against OpenAI-compatible servers on loopback, on the same GGUF target.

    python benchmarks/serve_load.py [--clients 1 2 4 8] [--rounds 3] [--max-tokens 64] [--threads 2]
        [--prompts code prose]
        [--methods batched one-at-a-time llama.cpp] [--anyspec-args="..."] [--llama-args="..."]

Each method is a server started here on a free port and stopped at the end, on errors and Ctrl-C too:
``batched`` (``anyspec serve --max-batch N``), ``one-at-a-time`` (``--max-batch 1``, started once)
and ``llama.cpp`` (``llama-server -np N``: the target's GGUF alone, continuous batching, ``--ctx``
tokens per slot). For each client count N and round, each method in turn (the order rotates) gets N
concurrent greedy streaming ``/v1/completions`` requests of the same texts: the prompts of
``--prompts`` (sets shipped with anyspec, or JSONL files; ``code`` and ``prose`` by default) through
the target's chat template, taken in turn. Reported: tokens/s of the round (every token
over the time from its first request sent to its last finished), time to first token, latency, the
ratios batched ÷ one-at-a-time and ÷ llama.cpp, and whether every batched answer equals the
one-at-a-time answer to the same prompt (greedy: it must).
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import platform
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from anyspec.bench.llama import _env, _free_port, _program, _request, _stop, llama_cpp_problem, target_gguf
from anyspec.bench.prompts import SETS, load_prompts, prompt_file
from anyspec.models import DEFAULT_DRAFT, DEFAULT_TARGET, resolve_model
from anyspec.vocab.loading import load_tokenizer

METHODS = ("batched", "one-at-a-time", "llama.cpp")
RESULTS = Path(__file__).resolve().parent / "results"


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    i = (len(s) - 1) * q
    lo = int(i)
    return s[lo] + (s[min(lo + 1, len(s) - 1)] - s[lo]) * (i - lo)


def cpu_model() -> str:
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        for line in subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


@contextlib.contextmanager
def server(name: str, cmd: list[str], port: int, env: dict | None = None, timeout: float = 900.0):
    """``cmd`` running until the block ends; yields its URL once ``/health`` answers ok. A server
    that exits by itself keeps its log, named in the error."""
    log = tempfile.NamedTemporaryFile(prefix=f"serve-load-{name}-", suffix=".log", delete=False)
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                lines = Path(log.name).read_text(errors="replace").strip().splitlines() or ["no output"]
                raise RuntimeError(f"{name} exited with {proc.returncode}: {lines[-1]} (log {log.name})")
            with contextlib.suppress(OSError, ValueError):  # not listening yet, or 503 while loading
                if _request(url + "/health", timeout=5).get("status") == "ok":
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(f"{name} was not ready after {timeout:.0f}s (log {log.name})")
            time.sleep(0.5)
        yield url
    finally:
        died = proc.poll() is not None
        _stop(proc)
        log.close()
        if not died:
            Path(log.name).unlink(missing_ok=True)


def request_body(text: str, max_tokens: int) -> dict:
    """The same body for every server: greedy, streamed, usage asked for, no prompt cache."""
    return {"prompt": text, "max_tokens": max_tokens, "temperature": 0, "top_k": 1, "stream": True,
            "stream_options": {"include_usage": True}, "ignore_eos": False, "cache_prompt": False}


def stream(url: str, body: dict, timeout: float = 3600.0) -> dict:
    """One streaming ``/v1/completions`` request, timed from just before it is sent."""
    host, port = url.removeprefix("http://").split(":")
    out = {"ttft": None, "text": "", "usage": None, "finish": None, "error": None}
    out["sent"] = time.perf_counter()
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            raise RuntimeError(f"HTTP {resp.status}: {resp.read(300).decode(errors='replace')}")
        for raw in resp:
            line = raw.decode().strip()
            if not line.startswith("data:"):
                continue
            if (data := line[5:].strip()) == "[DONE]":
                break
            chunk = json.loads(data)
            if "error" in chunk:
                raise RuntimeError(f"error event: {chunk['error']}")
            out["usage"] = chunk.get("usage") or out["usage"]
            for choice in chunk.get("choices") or []:
                if choice.get("text"):
                    out["ttft"] = out["ttft"] or time.perf_counter() - out["sent"]
                    out["text"] += choice["text"]
                out["finish"] = choice.get("finish_reason") or out["finish"]
    except (OSError, ValueError, RuntimeError, http.client.HTTPException) as exc:
        out["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        conn.close()
    out["done"] = time.perf_counter()
    out["latency"] = out["done"] - out["sent"]
    return out


def run_round(url: str, texts: list[str], max_tokens: int) -> list[dict]:
    """One request per client, all released together; the records in client order."""
    results: list[dict] = [{}] * len(texts)
    barrier = threading.Barrier(len(texts))

    def client(i: int) -> None:
        barrier.wait()
        results[i] = stream(url, request_body(texts[i], max_tokens))

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(len(texts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def count_tokens(rec: dict, tok) -> None:
    """The server's own count where it streamed ``usage``, else the text re-encoded (both are kept)."""
    rec["retokenized"] = len(tok.encode(rec["text"], add_special_tokens=False))
    used = (rec["usage"] or {}).get("completion_tokens")
    by_usage = isinstance(used, int)
    rec["tokens"], rec["counted"] = (used, "usage") if by_usage else (rec["retokenized"], "re-tokenized")


def round_rate(recs: list[dict]) -> float:
    wall = max(r["done"] for r in recs) - min(r["sent"] for r in recs)
    return sum(r["tokens"] for r in recs if not r["error"]) / wall if wall > 0 else 0.0


def summarize(records: list[dict], clients: list[int], methods: list[str]) -> dict:
    table = {}
    for n in clients:
        for m in methods:
            recs = [r for r in records if r["clients"] == n and r["method"] == m]
            if not recs:
                continue
            rounds = sorted({r["round"] for r in recs})
            rates = {k: round_rate([r for r in recs if r["round"] == k]) for k in rounds}
            ok = [r for r in recs if not r["error"]]
            ttft, lat = [r["ttft"] for r in ok if r["ttft"] is not None], [r["latency"] for r in ok]
            by_usage = sum(r["counted"] == "usage" for r in ok)
            counted = "usage" if by_usage == len(ok) else "re-tokenized" if not by_usage else \
                f"mixed ({by_usage}/{len(ok)} usage)"
            table.setdefault(n, {})[m] = {
                "tok_s": statistics.median(rates.values()), "tok_s_by_round": rates,
                "ttft_p50": percentile(ttft, 0.5), "ttft_p95": percentile(ttft, 0.95),
                "latency_p50": percentile(lat, 0.5), "latency_p95": percentile(lat, 0.95),
                "requests": len(recs), "errors": len(recs) - len(ok), "counted": counted,
                "tokens": sum(r["tokens"] for r in ok)}
    return table


def ratio(table: dict, n: int, a: str, b: str) -> float | None:
    """The median over rounds of a's tokens/s over b's in the same round."""
    ra, rb = (table.get(n, {}).get(m, {}).get("tok_s_by_round", {}) for m in (a, b))
    both = [ra[k] / rb[k] for k in ra if k in rb and rb[k] > 0]
    return statistics.median(both) if both else None


def compare(records: list[dict], method: str, ref: str = "one-at-a-time") -> dict:
    """``method``'s answers against the first ``ref`` answer to the same prompt."""
    refs: dict[str, str] = {}
    for r in records:
        if r["method"] == ref and not r["error"]:
            refs.setdefault(r["prompt"], r["text"])
    same, differ = 0, []
    for r in records:
        if r["method"] == method and not r["error"] and r["prompt"] in refs:
            want = refs[r["prompt"]]
            if r["text"] == want:
                same += 1
                continue
            at = next((i for i, (x, y) in enumerate(zip(r["text"], want, strict=False)) if x != y),
                      min(len(r["text"]), len(want)))
            differ.append({"clients": r["clients"], "round": r["round"], "prompt": r["prompt"], "char": at,
                           method: r["text"][at:at + 40], ref: want[at:at + 40]})
    return {"compared": same + len(differ), "identical": same, "differ": differ}


def fmt(x: float | None, spec: str = ".2f", unit: str = "") -> str:
    return "–" if x is None else f"{x:{spec}}{unit}"


def markdown(result: dict) -> str:
    s, times = result["settings"], ("ttft_p50", "ttft_p95", "latency_p50", "latency_p95")
    lines = [f"# Serving load: {s['target']} drafted by {s['draft']}", "", f"`{result['command']}`", "",
             f"CPU: {result['cpu']}; {s['threads']} threads per server; {s['max_tokens']} tokens a request, "
             f"greedy; rounds: {s['rounds']}; prompts: {s['prompts']}. tok/s and ratios: medians over "
             "rounds; TTFT and latency: percentiles over every request of every round.", ""]
    lines += [f"- note: {note}" for note in result["notes"]] + [""] * bool(result["notes"])
    lines += ["| clients | method | tok/s (median) | TTFT p50 | TTFT p95 | latency p50 | latency p95 | "
              "errors | tokens counted by |", "|---:|---|---:|---:|---:|---:|---:|---:|---|"]
    lines += [] if result["table"] else ["", "No method ran."]
    for n, row in result["table"].items():
        for m, x in row.items():
            cells = [f"{x['tok_s']:.1f}", *(fmt(x[k], unit=" s") for k in times),
                     f"{x['errors']}/{x['requests']}", x["counted"]]
            lines.append(f"| {n} | {m} | " + " | ".join(cells) + " |")
    lines += ["", "| clients | batched ÷ one-at-a-time | batched ÷ llama.cpp |", "|---:|---:|---:|"]
    lines += [f"| {n} | " + " | ".join(fmt(v, unit="×") for v in r.values()) + " |"
              for n, r in result["ratios"].items()]
    lines.append("")
    for method, c in result["identical"].items():
        what = {"batched": "batched answers identical to one-at-a-time's to the same prompt (greedy: must)",
                "one-at-a-time": "one-at-a-time answers identical to its first answer to the same prompt",
                "llama.cpp": "llama.cpp answers identical to one-at-a-time's (other numerics: not required)"}
        lines.append(f"- {what[method]}: {c['identical']}/{c['compared']}")
        lines += [f"  - differs: {d['clients']} clients, round {d['round'] + 1}, `{d['prompt']}` at "
                  f"character {d['char']}: {json.dumps(d[method])} vs {json.dumps(d['one-at-a-time'])}"
                  for d in c["differ"]]
    lines += ["", "Server commands (`PORT` is a free port):", ""]
    lines += [f"- {m}: `{cmd}`" for m, cmd in result["servers"].items()]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default=DEFAULT_TARGET, help="built-in name or path (default %(default)s)")
    ap.add_argument("--draft", default=DEFAULT_DRAFT, help="built-in name or path (default %(default)s)")
    ap.add_argument("--threads", type=int, default=2, metavar="N",
                    help="CPU threads of each server (default %(default)s)")
    ap.add_argument("--max-tokens", type=int, default=64, metavar="N",
                    help="each request's max_tokens (default %(default)s)")
    ap.add_argument("--clients", type=int, nargs="+", default=[1, 2, 4, 8], metavar="N",
                    help="concurrency levels: N clients streaming at once (default: 1 2 4 8)")
    ap.add_argument("--rounds", type=int, default=3, metavar="N",
                    help="rounds at each client count, the order of the methods rotating "
                         "(default %(default)s)")
    ap.add_argument("--prompts", nargs="+", default=["code", "prose"], metavar="SET_OR_FILE",
                    help=f"prompt sets ({', '.join(s for s in SETS if s != 'chat')}) or JSONL files of "
                         "single prompts (default: code prose)")
    ap.add_argument("--prompts-limit", type=int, default=None, metavar="N",
                    help="at most N prompts per set (default: all)")
    ap.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS), metavar="METHOD",
                    help="batched (anyspec serve --max-batch N), one-at-a-time (--max-batch 1), llama.cpp "
                         "(llama-server -np N on the target's GGUF alone) (default: all three)")
    ap.add_argument("--no-llama", action="store_true", help="leave llama.cpp out")
    ap.add_argument("--ctx", type=int, default=4096, metavar="N",
                    help="llama-server context per slot (default %(default)s)")
    ap.add_argument("--anyspec-args", default="--no-prefix-cache",
                    help='more `anyspec serve` arguments, one string: --anyspec-args="-k 4" '
                         '(default %(default)s)')
    ap.add_argument("--llama-args", default="--no-cache-prompt --cache-ram 0",
                    help="more llama-server arguments, one string (default %(default)s)")
    ap.add_argument("--load-timeout", type=float, default=900.0, metavar="SECONDS",
                    help="seconds a server may take to start (default %(default)s)")
    ap.add_argument("--markdown", type=Path, default=RESULTS / "serve_load.md", metavar="FILE",
                    help="write the report here (default: benchmarks/results/serve_load.md)")
    ap.add_argument("--json", type=Path, default=RESULTS / "serve_load.json", metavar="FILE",
                    help="write the whole result as JSON here (default: benchmarks/results/serve_load.json)")
    args = ap.parse_args(argv)
    if min(args.clients + [args.rounds, args.max_tokens, args.threads, args.prompts_limit or 1]) < 1:
        ap.error("--clients, --rounds, --max-tokens, --threads and --prompts-limit must be >= 1")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the servers on the way out

    methods = [m for m in METHODS if m in args.methods and not (args.no_llama and m == "llama.cpp")]
    prompts = [p for name in args.prompts for p in load_prompts(prompt_file(name))[:args.prompts_limit]]
    if turns := [p["id"] for p in prompts if "turns" in p]:
        ap.error(f"--prompts: {turns[0]} is a conversation; this load sends single prompts")
    tok = load_tokenizer(resolve_model(args.target))
    texts = [(p["id"], p["prompt"] if isinstance(p["prompt"], str) else  # the chat template, as the engine
              tok.apply_chat_template(p["prompt"], tokenize=False, add_generation_prompt=True))
             for p in prompts]
    notes, cmds = [], {}
    serve_help = subprocess.run([sys.executable, "-m", "anyspec", "serve", "--help"], capture_output=True,
                                text=True).stdout
    has_max_batch = "--max-batch" in serve_help
    if not has_max_batch:
        notes.append("this `anyspec serve` has no --max-batch: batched is skipped, one-at-a-time runs "
                     "without the flag")
        methods = [m for m in methods if m != "batched"]
    gguf = target_gguf(args.target)
    if "llama.cpp" in methods and (problem := llama_cpp_problem(gguf or args.target)):
        notes.append(f"llama.cpp: {problem}")
        methods.remove("llama.cpp")

    def launch(stack: contextlib.ExitStack, method: str, n: int) -> str | None:
        """Start ``method``'s server with ``n`` slots and send it one warm-up request; None if it fails."""
        if method == "llama.cpp":
            program, th = _program("llama-server"), str(args.threads)
            cmd = [str(program), "-m", str(gguf), "-c", str(args.ctx * n), "-np", str(n), "-t", th, "-tb", th,
                   "--host", "127.0.0.1", "--port", "PORT", "--no-webui", *shlex.split(args.llama_args)]
            env = _env(program)
        else:
            cmd = [sys.executable, "-m", "anyspec", "serve", "--target", args.target, "--draft", args.draft,
                   "--threads", str(args.threads), "--host", "127.0.0.1", "--port", "PORT",
                   "--queue-size", str(max(16, 2 * max(args.clients))), "--queue-timeout", "3600",
                   "--generation-timeout", "3600", *(["--max-batch", str(n)] if has_max_batch else []),
                   *shlex.split(args.anyspec_args)]
            env = None
        name = f"{method}, {n} slots" if method != "one-at-a-time" else method
        cmds.setdefault(name, shlex.join(cmd))
        print(f"starting {name}", flush=True)
        port, t = _free_port(), time.perf_counter()
        try:
            cmd = [str(port) if a == "PORT" else a for a in cmd]
            url = stack.enter_context(server(method, cmd, port, env, args.load_timeout))
        except RuntimeError as exc:
            notes.append(f"{name} did not start, skipped: {exc}")
            print(notes[-1], flush=True)
            return None
        warm = stream(url, request_body(texts[0][1], args.max_tokens))  # first-request costs stay out
        print(f"  ready in {time.perf_counter() - t:.1f}s; warm-up {warm['latency']:.1f}s"
              + (f", error {warm['error']}" if warm["error"] else ""), flush=True)
        return url

    records: list[dict] = []
    with contextlib.ExitStack() as stack:
        urls = {"one-at-a-time": launch(stack, "one-at-a-time", 1)} if "one-at-a-time" in methods else {}
        for ni, n in enumerate(args.clients):
            with contextlib.ExitStack() as per_n:
                urls.update({m: launch(per_n, m, n) for m in ("batched", "llama.cpp") if m in methods})
                live = [m for m in methods if urls.get(m)]
                for r in range(args.rounds):
                    k = (r + ni) % max(len(live), 1)
                    batch = [texts[(r * n + i) % len(texts)] for i in range(n)]
                    for m in live[k:] + live[:k]:
                        recs = run_round(urls[m], [text for _, text in batch], args.max_tokens)
                        for (pid, _), rec in zip(batch, recs, strict=True):
                            count_tokens(rec, tok)
                            records.append(rec | {"method": m, "clients": n, "round": r, "prompt": pid})
                        errors = [x["error"] for x in recs if x["error"]]
                        print(f"{n} clients, round {r + 1}/{args.rounds}, {m}: {round_rate(recs):.1f} tok/s"
                              + (f"; {len(errors)} errors, first: {errors[0]}" if errors else ""), flush=True)
            for m in ("batched", "llama.cpp"):
                urls.pop(m, None)

    ran = [m for m in methods if any(r["method"] == m for r in records)]
    table = summarize(records, args.clients, ran)
    result = {"command": shlex.join(["python", "benchmarks/serve_load.py", *(argv or sys.argv[1:])]),
              "cpu": f"{cpu_model()} ({os.cpu_count()} CPUs)", "notes": notes, "servers": cmds,
              "settings": {"target": args.target, "draft": args.draft, "threads": args.threads,
                           "max_tokens": args.max_tokens, "rounds": args.rounds, "clients": args.clients,
                           "prompts": f"{len(texts)} ({' '.join(args.prompts)})", "methods": ran},
              "table": table,
              "ratios": {n: {"batched/one-at-a-time": ratio(table, n, "batched", "one-at-a-time"),
                             "batched/llama.cpp": ratio(table, n, "batched", "llama.cpp")} for n in table},
              "identical": {m: compare(records, m) for m in ("batched", "one-at-a-time", "llama.cpp")
                            if m in ran and "one-at-a-time" in ran},
              "requests": records}
    text = markdown(result)
    print("\n" + text)
    for path, body in ((args.markdown, text), (args.json, json.dumps(result, indent=1) + "\n")):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(body)
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
