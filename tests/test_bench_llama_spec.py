"""llama.cpp's own lookup speculation as a bench method (``llama.cpp-ngram``).

Without llama.cpp: the check of ``--llama-spec``, the server command that carries it, and that the
bench's two llama.cpp methods never keep two servers at once. The last test (slow) runs the real
``llama-server`` on SmolLM2-135M, plain and with lookup speculation, and is skipped when llama.cpp
is not built.
"""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import pytest
from tokenizer_files import SMOLLM2, SMOLLM2_GGUF, _registry

from anyspec.bench import llama as bl
from anyspec.bench import report
from anyspec.bench.context import BenchContext, BenchSettings
from anyspec.bench.llama_spec import DEFAULT_LLAMA_SPEC, llama_spec_args
from anyspec.bench.methods import BASELINE, DEFAULT_METHODS, METHODS, SECOND_BASELINE
from anyspec.bench.run import compare, run_method
from anyspec.config import SpeculativeConfig
from anyspec.errors import ConfigError
from anyspec.fetch import package_file


def test_spec_args_are_split_and_checked():
    assert llama_spec_args("--spec-type ngram-map-k --spec-ngram-map-k-size-n 3") == [
        "--spec-type", "ngram-map-k", "--spec-ngram-map-k-size-n", "3"]
    assert llama_spec_args("--spec-type=ngram-mod,ngram-simple --spec-ngram-mod-n-min 0 "
                           "--spec-ngram-simple-size-m=08") == [
        "--spec-type", "ngram-mod,ngram-simple", "--spec-ngram-mod-n-min", "0",
        "--spec-ngram-simple-size-m", "8"]
    assert llama_spec_args("--spec-type none") == ["--spec-type", "none"]
    assert llama_spec_args(DEFAULT_LLAMA_SPEC)[:2] == ["--spec-type", "ngram-mod"]


@pytest.mark.parametrize("text, says", [
    ("", "is empty"),
    ("--spec-ngram-map-k-size-n 3", "--spec-type exactly once"),
    ("--spec-type ngram-simple --spec-type ngram-mod", "--spec-type exactly once"),
    ("--spec-type draft-simple", "is not one or more of"),
    ("--spec-type none,ngram-mod", "none alone"),
    ("--spec-type ngram-simple -m other.gguf", "unknown option -m"),
    ("--spec-type ngram-simple --port 80", "unknown option --port"),
    ("--spec-type ngram-simple --spec-ngram-map-k-size-n 3", "sizes ngram-map-k, which --spec-type"),
    ("--spec-type ngram-simple --spec-ngram-simple-size-n 0", "integer >= 1"),
    ("--spec-type ngram-simple --spec-ngram-simple-size-n x", "integer >= 1"),
    ("--spec-type ngram-simple --spec-ngram-simple-size-n", "needs a value"),
    ("--spec-type ngram-simple --spec-ngram-simple-size-n 2 --spec-ngram-simple-size-n 3", "more than once"),
    ("--spec-type 'ngram-simple", "cannot be split"),
])
def test_bad_spec_args_are_one_line_config_errors(text, says):
    with pytest.raises(ConfigError, match=says) as err:
        llama_spec_args(text)
    assert "\n" not in str(err.value) and "--llama-spec" in str(err.value)


def test_bench_settings_check_the_spec_before_any_model_work(tmp_path):
    with pytest.raises(ConfigError, match="--llama-spec"):
        BenchSettings("t", "d", [], ["llama.cpp-ngram"], llama_spec="--spec-type lookup")
    assert BenchSettings("t", "d", [], ["llama.cpp-ngram"]).llama_spec == DEFAULT_LLAMA_SPEC


def test_the_method_is_opt_in_against_target_and_llama_cpp():
    assert "llama.cpp-ngram" in METHODS and "llama.cpp-ngram" not in DEFAULT_METHODS
    assert BASELINE["llama.cpp-ngram"] == "target" and SECOND_BASELINE["llama.cpp-ngram"] == "llama.cpp"


def test_server_command_ends_with_the_spec_args():
    spec = llama_spec_args("--spec-type ngram-simple --spec-ngram-simple-size-n 4")
    cmd = bl.server_command("/bin/llama-server", "m.gguf", 8080, threads=2, ctx_size=512, extra=spec)
    assert cmd[-4:] == spec
    assert cmd[:3] == ["/bin/llama-server", "-m", "m.gguf"] and "--no-cache-prompt" in cmd
    assert cmd[cmd.index("--port") + 1] == "8080" and cmd[cmd.index("-t") + 1] == "2"
    assert not any(a.startswith("--spec") for a in bl.server_command("s", "m.gguf", 1))


def _context(**kw) -> BenchContext:
    return BenchContext(target=None, draft=None, speculative=SpeculativeConfig(), temperature=0.0, seed=0,
                        max_new_tokens=4, eos=set(), dtype_name="gguf", draft_dtype=None, threads=1, **kw)


def test_one_llama_server_at_a_time_restarted_for_the_other_arguments(monkeypatch):
    live, started = [], []

    @contextlib.contextmanager
    def fake_server(gguf, threads, ctx_size, extra=()):
        assert not live, "a second llama-server while one runs"
        live.append(tuple(extra))
        started.append(tuple(extra))
        try:
            yield f"url{len(started)}"
        finally:
            live.pop()

    monkeypatch.setattr(bl, "llama_server", fake_server)
    monkeypatch.setattr(bl, "complete", lambda url, ids, n, **kw: {"url": url})
    spec = tuple(llama_spec_args(DEFAULT_LLAMA_SPEC))
    ctx = _context(llama_spec=spec)
    ctx.target = SimpleNamespace(tokenizer=None)
    monkeypatch.setattr("anyspec.bench.run.prompt_ids", lambda tok, p: [1, 2])
    urls = [run_method(ctx, m, "p")["url"] for m in ("llama.cpp", "llama.cpp", "llama.cpp-ngram",
                                                       "llama.cpp-ngram", "llama.cpp")]
    assert urls == ["url1", "url1", "url2", "url2", "url3"]
    assert started == [(), spec, ()] and live == [()]
    bl.close_llama_cpp(ctx)
    assert live == [] and ctx.llama_cpp_url is None and ctx.llama_cpp_args is None


def test_answers_are_compared_with_llama_cpp_alone_in_the_summary_and_table():
    def row(method, prompt, ids):
        spec = method.endswith("ngram")
        return {"method": method, "prompt": prompt, "set": "code", "ids": ids, "seconds": 1.0,
                "drafted": 4 if spec else 0, "accepted": 2 if spec else 0}

    runs = [row("llama.cpp", "a", [1, 2]), row("llama.cpp-ngram", "a", [1, 2]),
            row("llama.cpp", "b", [1, 2]), row("llama.cpp-ngram", "b", [1, 3])]
    compare(_context(), runs, {})
    assert [r.get("identical_llama_cpp") for r in runs] == [None, True, None, False]
    summary = report.summarize(runs)
    mine = next(r for r in summary if r["set"] == "all" and r["method"] == "llama.cpp-ngram")
    assert mine["identical_llama_cpp"] == "1/2" and mine["acceptance"] == 0.5
    assert mine["speedup_vs_llama.cpp"] == 1.0
    config = {"target": "t", "draft": "d", "dtype": "gguf", "k": 4, "max_new_tokens": 8, "threads": 2,
              "temperature": 0.7, "llama_spec": DEFAULT_LLAMA_SPEC}
    table = report.markdown({"config": config, "notes": {}, "runs": runs, "summary": summary})
    assert (f"- code/llama.cpp-ngram (`{DEFAULT_LLAMA_SPEC}`): the same answer as llama.cpp alone "
            "on 1/2") in table


@pytest.mark.slow
@pytest.mark.skipif(bl.llama_cpp_problem() is not None,
                    reason=f"llama.cpp is not built here ({bl.llama_cpp_problem()})")
def test_real_lookup_speculation_answers_as_llama_cpp_alone(tok_smollm2):
    gguf = _registry(lambda: package_file(*SMOLLM2, *SMOLLM2_GGUF))
    ctx = _context(llama_spec=tuple(llama_spec_args(DEFAULT_LLAMA_SPEC)), llama_cpp_gguf=gguf,
                   llama_cpp_ctx=512)
    ctx.max_new_tokens = 24
    ctx.target = SimpleNamespace(tokenizer=tok_smollm2)
    prompt = "def add(a, b):\n    return a + b\n\ndef add3(a, b, c):\n    return a + b + c\n\ndef add4("
    try:
        plain = run_method(ctx, "llama.cpp", prompt)
        ngram = run_method(ctx, "llama.cpp-ngram", prompt)
    finally:
        bl.close_llama_cpp(ctx)
    assert plain["ids"] and ngram["ids"] == plain["ids"]
    assert plain["drafted"] == 0 and ngram["drafted"] > 0 and 0 <= ngram["accepted"] <= ngram["drafted"]
    assert ngram["prefill_tokens"] == plain["prefill_tokens"] and ngram["decode_seconds"] > 0


def _sweep_script():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).parents[1] / "benchmarks" / "llama_ngram_sweep.py"
    spec = importlib.util.spec_from_file_location("llama_ngram_sweep", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_sweep_grid_is_valid_and_its_table_compares_with_none():
    sweep = _sweep_script()
    assert sweep.GRID[0] == sweep.NONE and all(llama_spec_args(s) for s in sweep.GRID)
    assert sweep.label("--spec-type ngram-map-k --spec-ngram-map-k-size-n 3") == "ngram-map-k size-n=3"
    spec = "--spec-type ngram-simple --spec-ngram-simple-size-n 2"

    def run(setting, prompt, ids, seconds, drafted=0, accepted=0):
        return {"setting": setting, "prompt": prompt, "ids": ids, "tokens": len(ids), "seconds": seconds,
                "decode_tokens": len(ids) - 1, "decode_seconds": seconds / 2, "drafted": drafted,
                "accepted": accepted}

    runs = [run(sweep.NONE, "a", [1, 2, 3, 4], 2.0), run(sweep.NONE, "b", [5, 6], 1.0),
            run(spec, "a", [1, 2, 3, 4], 1.0, 4, 3), run(spec, "b", [5, 7], 1.0, 2, 0)]
    rows = {r["label"]: r for r in sweep.summarize(runs, [sweep.NONE, spec])}
    mine = rows["ngram-simple size-n=2"]
    assert rows["none"]["tokens_per_second"] == 2.0 and mine["tokens_per_second"] == 3.0
    assert mine["vs_none"] == 1.5 and mine["acceptance"] == 0.5 and mine["same_as_none"] == "1/2"
    config = {"model": "m", "prompts": ["edit"], "requests": 2, "max_new_tokens": 4, "threads": 2,
              "rounds": 1}
    table = sweep.markdown({"config": config, "notes": {}, "summary": list(rows.values())})
    assert "| ngram-simple size-n=2 | 3.0 | 1.5 | 4.0 | 6 | 0.5 | 1/2 |" in table
