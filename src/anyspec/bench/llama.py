"""llama.cpp beside anyspec: the same GGUF target alone, and its forward cost by rows.

llama.cpp's programs (``llama-server``, ``llama-bench``) are built from the llama.cpp vendored in
the pinned ``llama-cpp-python`` sdist by ``make llama-cpp`` (``benchmarks/build_llama_cpp.sh``)
and found in ``$ANYSPEC_LLAMA_CPP``, then ``<cache>/llama.cpp/bin``, then on ``PATH``.

- :func:`llama_server` starts one ``llama-server`` on a GGUF file (a context manager that always
  kills it), optionally with llama.cpp's own lookup speculation (``llama_spec.py``), and
  :func:`complete` sends it one prompt as token ids, greedy, no prompt cache, timed end to end like
  anyspec's methods (prefill included, model load excluded).
- :func:`run_llama_cpp` is the bench's ``llama.cpp`` and ``llama.cpp-ngram`` methods: one server
  at a time, restarted when the other method's arguments are asked for.
- :func:`forward_cost_by_rows` runs ``llama-bench``: milliseconds per forward of 1..8 rows and
  per generated token.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from anyspec.bench.context import BenchContext
from anyspec.bench.timing import llama_timings

PROGRAMS = ("llama-server", "llama-bench")
TIMINGS = ("prompt_n", "prompt_ms", "predicted_n", "predicted_ms")  # llama-server's own, per request
FIX = "run `make llama-cpp` to build it (minutes), or set ANYSPEC_LLAMA_CPP to its bin folder"


class LlamaCppUnavailable(Exception):
    """llama.cpp cannot run here or its server died: the bench notes the one-line message and skips it."""


def llama_cpp_bin(name: str) -> Path | None:
    """The llama.cpp program ``name``: in ``$ANYSPEC_LLAMA_CPP`` where it is set (there only: a build
    chosen so, an AVX2 one say, is never replaced by another), else ``<cache>/llama.cpp/bin`` or on
    PATH."""
    from anyspec.paths import cache_dir

    chosen = os.environ.get("ANYSPEC_LLAMA_CPP")
    for folder in [chosen] if chosen else [cache_dir() / "llama.cpp" / "bin"]:
        path = Path(folder).expanduser() / name
        if path.is_file() and os.access(path, os.X_OK):
            return path
    found = None if chosen else shutil.which(name)
    return Path(found) if found else None


def llama_cpp_problem(gguf: str | Path | None = None) -> str | None:
    """One line saying why llama.cpp cannot run here (and what to do), or None when it can."""
    missing = [p for p in PROGRAMS if llama_cpp_bin(p) is None]
    if missing and (chosen := os.environ.get("ANYSPEC_LLAMA_CPP")):
        return (f"ANYSPEC_LLAMA_CPP={chosen} holds no {' or '.join(missing)}; set it to the bin folder of a "
                "llama.cpp build, or unset it for anyspec's own (make llama-cpp); skipped")
    if missing:
        return f"llama.cpp is not built ({', '.join(missing)} not found); {FIX}; skipped"
    if gguf is not None and not (Path(gguf).is_file() and Path(gguf).suffix == ".gguf"):
        what = "does not exist" if Path(gguf).suffix == ".gguf" else "is not a GGUF file (all llama.cpp runs)"
        return f"the target {gguf} {what}; skipped"
    return None


def _env(program: Path) -> dict:
    """The environment for a llama.cpp program: its own folder first for its shared libraries."""
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [str(program.parent), env.get("LD_LIBRARY_PATH")]))
    return env


def _program(name: str) -> Path:
    path = llama_cpp_bin(name)
    if path is None:
        raise LlamaCppUnavailable(f"llama.cpp is not built ({name} not found); {FIX}; skipped")
    return path


# ---- llama-server: one GGUF target, one request per prompt ------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _request(url: str, body: dict | None = None, timeout: float = 3600.0) -> dict:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read())


def server_command(program: str | Path, gguf: str | Path, port: int, threads: int | None = None,
                   ctx_size: int = 4096, extra: Sequence[str] = ()) -> list[str]:
    """The ``llama-server`` command line: one slot, no prompt cache, then ``extra`` (e.g. the
    checked arguments of :func:`anyspec.bench.llama_spec.llama_spec_args`)."""
    cmd = [str(program), "-m", str(gguf), "-c", str(ctx_size), "--parallel", "1", "--host", "127.0.0.1",
           "--port", str(port), "--no-cache-prompt", "--cache-ram", "0", "--no-webui"]
    if threads:
        cmd += ["-t", str(threads), "-tb", str(threads)]
    return cmd + [str(a) for a in extra]


@contextlib.contextmanager
def llama_server(gguf: str | Path, threads: int | None = None, ctx_size: int = 4096,
                 load_timeout: float = 600.0, extra: Sequence[str] = ()):
    """``llama-server`` on ``gguf`` (:func:`server_command`) until the block ends; yields its URL.

    The process is stopped on the way out, whatever happened; when it exits by itself, its log is
    kept and named in the error."""
    program = _program("llama-server")
    if not Path(gguf).is_file():
        raise LlamaCppUnavailable(f"{gguf} does not exist; skipped")
    port = _free_port()
    cmd = server_command(program, gguf, port, threads, ctx_size, extra)
    log = tempfile.NamedTemporaryFile(prefix="anyspec-llama-server-", suffix=".log", delete=False)
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=_env(program),
                            start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + load_timeout
        while True:
            if proc.poll() is not None:
                tail = Path(log.name).read_text(errors="replace").strip().splitlines()[-1:] or ["no output"]
                raise LlamaCppUnavailable(f"llama-server exited with {proc.returncode} ({tail[0]}; "
                                          f"log {log.name}); skipped")
            try:
                if _request(url + "/health", timeout=5).get("status") == "ok":
                    break
            except (urllib.error.URLError, OSError, ValueError):
                pass  # still loading (503) or not listening yet
            if time.monotonic() > deadline:
                raise LlamaCppUnavailable(f"llama-server did not become ready in {load_timeout:.0f}s "
                                          f"(log {log.name}); skipped")
            time.sleep(0.2)
        yield url
    finally:
        died = proc.poll() is not None  # on its own: its log is kept (and named) for the reader
        _stop(proc)
        log.close()
        if not died:
            Path(log.name).unlink(missing_ok=True)


def _stop(proc: subprocess.Popen) -> None:
    """Terminate the server's process group, killing it when it does not exit within 5 seconds."""
    for sig, wait in ((signal.SIGTERM, 5), (signal.SIGKILL, None)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def completion_body(ids: list[int], max_new_tokens: int, ignore_eos: bool = False,
                    cache_prompt: bool = False) -> dict:
    """The ``/completion`` request for a prompt given as token ids: greedy, by default with no prompt
    cache (``cache_prompt``: the slot keeps what its previous request's prompt shares with this one)."""
    if not ids or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in ids):
        raise ValueError("the prompt must be a non-empty list of token ids")
    return {"prompt": [int(t) for t in ids], "n_predict": int(max_new_tokens),
            "cache_prompt": bool(cache_prompt), "temperature": 0.0, "top_k": 1, "samplers": ["top_k"],
            "return_tokens": True, "ignore_eos": bool(ignore_eos), "stream": False}


def complete(url: str, ids: list[int], max_new_tokens: int, ignore_eos: bool = False,
             eos: set[int] | None = None, timeout: float = 3600.0, cache_prompt: bool = False) -> dict:
    """One greedy generation from token ids: ``{"ids", "text", "seconds", "drafted", "accepted"}``
    plus llama.cpp's own timings (``prompt_ms``, ``predicted_ms``, ``prompt_n``, ``predicted_n``);
    ``drafted``/``accepted`` are its lookup speculation's draft tokens (0 without it).

    ``seconds`` is the request's wall time (prefill and every token). As in anyspec, the ids end
    before the end-of-generation token: llama.cpp's own, or the first of ``eos`` (anyspec's set,
    which can be larger), unless ``ignore_eos``."""
    body = completion_body(ids, max_new_tokens, ignore_eos, cache_prompt)
    t = time.perf_counter()
    try:
        res = _request(url + "/completion", body, timeout=timeout)
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode(errors="replace")[:200]
        raise LlamaCppUnavailable(f"llama-server refused a request ({exc.code}: {detail}); skipped") from None
    except (urllib.error.URLError, OSError) as exc:
        raise LlamaCppUnavailable(f"llama-server failed a request ({exc}); skipped") from None
    dt = time.perf_counter() - t
    out = list(res.get("tokens", []))
    raw = res.get("timings", {})
    timings = {k: raw.get(k) for k in TIMINGS}
    if not ignore_eos:
        if res.get("stop_type") == "eos" and out:
            out = out[:-1]
        cut = next((i for i, tok in enumerate(out) if tok in (eos or ())), None)
        out = out if cut is None else out[:cut]
    return {"ids": out, "text": res.get("content", ""), "seconds": dt,
            "drafted": raw.get("draft_n", 0), "accepted": raw.get("draft_n_accepted", 0),
            "stop": res.get("stop_type"),
            **timings, **llama_timings(timings)}


def run_llama_cpp(ctx: BenchContext, ids: list[int], spec: Sequence[str] = ()) -> dict:
    """The bench's ``llama.cpp`` method (``spec`` empty) and ``llama.cpp-ngram`` (``spec``:
    ``ctx.llama_spec``): ``ctx.llama_cpp_gguf`` (the target's GGUF) in a ``llama-server``
    (``ctx.threads``, a context of ``ctx.llama_cpp_ctx`` tokens) started on first use and kept in
    ``ctx`` until :func:`close_llama_cpp` or until the other method asks for other arguments: the
    running server is then stopped before the next one starts, so two never share the cores, and a
    new one answers a short untimed request first. Stops at ``ctx.eos``; a conversation's later turn
    (``ctx.prefix_cache``) asks the server to keep its slot's cached prefix."""
    spec = tuple(spec)
    if ctx.llama_cpp_url is not None and ctx.llama_cpp_args != spec:
        close_llama_cpp(ctx)
    if ctx.llama_cpp_url is None:
        ctx.llama_cpp_stack = contextlib.ExitStack()
        ctx.llama_cpp_url = ctx.llama_cpp_stack.enter_context(
            llama_server(ctx.llama_cpp_gguf, ctx.threads, ctx.llama_cpp_ctx, extra=spec))
        ctx.llama_cpp_args = spec
        complete(ctx.llama_cpp_url, ids[:8], 2)
    return complete(ctx.llama_cpp_url, ids, ctx.max_new_tokens, eos=ctx.eos, cache_prompt=ctx.prefix_cache)


def close_llama_cpp(ctx: BenchContext) -> None:
    stack, ctx.llama_cpp_stack, ctx.llama_cpp_url, ctx.llama_cpp_args = ctx.llama_cpp_stack, None, None, None
    if stack is not None:
        stack.close()


def target_gguf(spec: str | Path) -> Path | None:
    """The GGUF file of a bench target: the path itself, or a built-in model's joined GGUF in the cache."""
    from anyspec.models import MODELS, gguf_cached

    path = Path(spec).expanduser()
    if path.suffix == ".gguf" and path.is_file():
        return path
    return gguf_cached(str(spec)) if str(spec) in MODELS else None


# ---- llama-bench: forward cost by rows ----------------------------------------------------------

def parse_llama_bench(text: str) -> dict:
    """``llama-bench -o json`` output -> ``{"forward_ms": {rows: ms}, "forward_sd_ms": {rows: ms},
    "token_ms": ms per generated token or None, "build": commit}``; a prompt test of N tokens on an
    empty cache is one forward of N rows."""
    tests = json.loads(text)
    out = {"forward_ms": {}, "forward_sd_ms": {}, "token_ms": None, "token_sd_ms": None,
           "build": tests[0].get("build_commit") if tests else None,
           "threads": tests[0].get("n_threads") if tests else None,
           "depth": tests[0].get("n_depth", 0) if tests else None}
    for t in tests:
        if t["n_prompt"] and not t["n_gen"]:
            out["forward_ms"][int(t["n_prompt"])] = t["avg_ns"] / 1e6
            out["forward_sd_ms"][int(t["n_prompt"])] = t["stddev_ns"] / 1e6
        elif t["n_gen"] and not t["n_prompt"]:
            out["token_ms"] = t["avg_ns"] / 1e6 / t["n_gen"]
            out["token_sd_ms"] = t["stddev_ns"] / 1e6 / t["n_gen"]
    return out


def forward_cost_by_rows(gguf: str | Path, rows=tuple(range(1, 9)), threads: int = 2, repeats: int = 5,
                         n_gen: int = 64, depth: int = 0, timeout: float = 3600.0) -> dict:
    """Milliseconds per llama.cpp forward of each row count in ``rows`` (``llama-bench -p``) on a
    cache of ``depth`` tokens, and per generated token (``-n n_gen``; 0 skips it); see
    :func:`parse_llama_bench`."""
    program = _program("llama-bench")
    cmd = [str(program), "-m", str(gguf), "-p", ",".join(str(int(r)) for r in rows), "-n", str(int(n_gen)),
           "-t", str(threads), "-r", str(repeats), "-o", "json"]
    if depth:
        cmd += ["-d", str(depth)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=_env(program), timeout=timeout)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise LlamaCppUnavailable(f"llama-bench failed with {proc.returncode}: {last}")
    return parse_llama_bench(proc.stdout)
