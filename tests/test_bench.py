import json
import os
import sys

import pytest

from anyspec.bench import prompts as bench_prompts
from anyspec.bench import report
from anyspec.bench import run as bench_run
from anyspec.bench import vllm as bench_vllm
from anyspec.bench.context import BenchSettings
from anyspec.config import AUTO_NGRAM, SpeculativeConfig
from anyspec.errors import ConfigError


def test_shipped_prompt_files_load():
    for name in ("code", "prose"):
        rows = bench_prompts.load_prompts(bench_prompts.PROMPTS_DIR / f"{name}.jsonl")
        assert len(rows) >= 3 and all(r["set"] == name for r in rows)
        assert all(r["prompt"][0]["role"] == "user" and r["prompt"][0]["content"] for r in rows)
        assert len({r["id"] for r in rows}) == len(rows)


def test_bad_prompt_files_are_one_line_errors(tmp_path):
    with pytest.raises(ConfigError, match=r"does not exist \(the sets shipped with anyspec: code, prose"):
        bench_prompts.load_prompts(tmp_path / "nope.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "prompt": "x"}\n{not json\n')
    with pytest.raises(ConfigError, match="bad.jsonl:2"):
        bench_prompts.load_prompts(bad)
    bad.write_text(json.dumps({"id": "a", "text": "x"}) + "\n")
    with pytest.raises(ConfigError, match="neither"):
        bench_prompts.load_prompts(bad)


def test_first_difference():
    assert bench_run.first_difference([1, 2, 3], [1, 2, 3]) is None
    assert bench_run.first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert bench_run.first_difference([1, 2, 3], [1, 2]) == 2
    assert bench_run.first_difference([], []) is None


def run(method, prompt, n, seconds, s="code", **kw):
    return {"method": method, "prompt": prompt, "set": s, "ids": list(range(n)), "seconds": seconds,
            "drafted": kw.pop("drafted", None), "accepted": kw.pop("accepted", None), **kw}


def test_summary_speedups_acceptance_and_exactness():
    runs = [run("target", "a", 10, 2.0), run("anyspec-greedy", "a", 10, 1.0, drafted=8, accepted=6,
                                             identical=True, draft_seconds=0.05),
            run("target", "b", 10, 2.0), run("anyspec-greedy", "b", 10, 1.0, drafted=8, accepted=2,
                                             identical=False, diff_pos=3, diff_margin=0.01,
                                             draft_seconds=0.03),
            run("hf-target", "a", 10, 4.0, identical=True), run("hf-uag", "a", 10, 2.0, identical=True)]
    rows = {(r["set"], r["method"]): r for r in report.summarize(runs)}
    g = rows[("code", "anyspec-greedy")]
    assert g["tokens_per_second"] == 10.0 and g["speedup"] == 2.0 and g["acceptance"] == 0.5
    assert g["identical"] == "1/2" and g["diffs"] == [("b", 3, 0.01)]
    assert rows[("code", "hf-uag")]["speedup"] == 2.0  # against hf-target, not target
    assert rows[("code", "target")]["speedup"] is None
    order = [r["method"] for r in report.summarize(runs) if r["set"] == "all"]
    assert order == ["target", "anyspec-greedy", "hf-target", "hf-uag"]
    table = report.markdown({"config": {"target": "t", "draft": "d", "dtype": "float32", "k": 4,
                                        "max_new_tokens": 8, "threads": 2, "temperature": 0.7},
                             "notes": {"vllm": "not installed"}, "runs": runs,
                             "summary": report.summarize(runs)})
    assert ("| code | anyspec-greedy | 20 | 10.00 | 2.00x (target) | - | - | - | 2.00 | 0.5 | 5.0 | 1/2 "
            "| b @3 (0.01) |") in table
    assert "- vllm: not installed" in table


def test_the_header_names_a_temperature_only_when_a_sampled_method_ran():
    config = {"target": "t", "draft": "d", "dtype": "float32", "k": 4, "max_new_tokens": 8, "threads": 2,
              "temperature": 0.7}
    greedy = [run("target", "a", 10, 2.0), run("anyspec-slem", "a", 10, 1.0, drafted=8, accepted=6)]
    head = report.markdown({"config": config, "notes": {}, "runs": greedy,
                            "summary": report.summarize(greedy)}).splitlines()[0]
    assert head.endswith("2 threads, greedy") and "T=" not in head
    sampled = greedy + [run("anyspec-sampled", "a", 10, 1.0, drafted=8, accepted=5)]
    head = report.markdown({"config": config, "notes": {}, "runs": sampled,
                            "summary": report.summarize(sampled)}).splitlines()[0]
    assert head.endswith("2 threads, greedy, and the -sampled methods at T=0.7")  # a mixed run
    head = report.markdown({"config": config | {"top_p": 0.9}, "notes": {}, "runs": sampled,
                            "summary": report.summarize(sampled)}).splitlines()[0]
    assert head.endswith("2 threads, greedy, and the -sampled methods at T=0.7, top-p 0.9")
    alone = [run("target-sampled", "a", 10, 2.0), sampled[-1]]
    head = report.markdown({"config": config, "notes": {}, "runs": alone,
                            "summary": report.summarize(alone)}).splitlines()[0]
    assert head.endswith("2 threads, sampled at T=0.7")
    head = report.markdown({"config": config | {"frequency_penalty": 0.5}, "notes": {}, "runs": greedy,
                            "summary": report.summarize(greedy)}).splitlines()[0]
    assert head.endswith("2 threads, greedy, frequency penalty 0.5")


def test_plot_writes_png(tmp_path):
    pytest.importorskip("matplotlib")
    runs = [run("target", "a", 10, 2.0), run("anyspec-greedy", "a", 10, 1.0, drafted=4, accepted=4,
                                             identical=True)]
    result = {"config": {"target": "t", "draft": "d", "dtype": "float32", "k": 4, "threads": 2},
              "summary": report.summarize(runs)}
    report.plot(result, tmp_path / "p.png")
    assert (tmp_path / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_unknown_method_is_refused_before_loading(monkeypatch):
    with pytest.raises(ConfigError, match="unknown method"):
        BenchSettings("t", "d", [bench_prompts.PROMPTS_DIR / "code.jsonl"], ["target", "magic"])


def test_penalties_are_refused_beside_engines_that_would_not_get_them():
    code = [bench_prompts.PROMPTS_DIR / "code.jsonl"]
    with pytest.raises(ConfigError, match="anyspec's methods only; leave out llama.cpp, hf-uag"):
        BenchSettings("t", "d", code, ["target", "llama.cpp", "hf-uag"], penalties=(0.5, 0.0))
    BenchSettings("t", "d", code, ["target", "anyspec-slem", "anyspec-sampled"], penalties=(0.0, 1.0))


def tiny_pair(tmp_path, tok_qwen2, tok_smollm2, contents: list[str]):
    """A tiny target and draft with a chat template, and a prompt file of one user message each
    (ids p0, p1, ..)."""
    from tiny_models import CHATML, save_tiny_model

    target = save_tiny_model(tok_qwen2, tmp_path / "target", "qwen2", seed=0, chat_template=CHATML)
    draft = save_tiny_model(tok_smollm2, tmp_path / "draft", "llama", seed=1, chat_template=CHATML)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("\n".join(json.dumps({"id": f"p{i}", "messages": [{"role": "user", "content": c}]})
                                 for i, c in enumerate(contents)) + "\n")
    return target, draft, prompts


def test_run_bench_end_to_end_on_tiny_models(tmp_path, tok_qwen2, tok_smollm2):
    target, draft, prompts = tiny_pair(tmp_path, tok_qwen2, tok_smollm2, ["Write code.", "Say hello."])
    methods = ["target", "anyspec-greedy", "anyspec-sampled", "hf-target", "hf-uag", "vllm"]
    settings = BenchSettings(str(target), str(draft), [prompts], methods, max_new_tokens=6, dtype="fp32")
    result = bench_run.run_bench(settings, log=lambda s: None)
    runs = result["runs"]
    done = {r["method"] for r in runs}
    assert done | set(result["notes"]) == set(methods) and "target" in done and "hf-uag" in done
    orders = {r["prompt"]: [x["method"] for x in sorted((x for x in runs if x["prompt"] == r["prompt"]),
                                                          key=lambda x: x["order"])] for r in runs}
    assert orders["p0"] != orders["p1"]  # rotated per prompt
    for r in runs:
        assert 0 < len(r["ids"]) <= 6 and r["seconds"] > 0
        if r["method"] in ("anyspec-greedy", "hf-target", "hf-uag"):
            assert r["identical"] is True or r["diff_pos"] < 6  # greedy is compared with the target alone
    assert all(r["drafted"] for r in runs if r["method"].startswith("anyspec"))
    table = report.markdown(result)
    assert "| all | anyspec-greedy |" in table and "(target)" in table and "(hf-target)" in table



def test_a_method_that_raises_is_one_line_and_every_other_row_and_the_table_are_written(
        tmp_path, tok_qwen2, tok_smollm2, monkeypatch, capsys):
    from anyspec.cli import main

    target, draft, prompts = tiny_pair(tmp_path, tok_qwen2, tok_smollm2, ["Write code.", "Say hello."])
    real = bench_run.RUNNERS["hf-target"]

    def fails_on_the_second_prompt(ctx, prompt):
        if prompt[0]["content"] == "Say hello.":
            raise RuntimeError("cannot reshape tensor of 0 elements\nsecond line of the message")
        return real(ctx, prompt)

    monkeypatch.setitem(bench_run.RUNNERS, "hf-target", fails_on_the_second_prompt)
    out_json, out_md = tmp_path / "bench.json", tmp_path / "bench.md"
    code = main(["bench", "--target", str(target), "--draft", str(draft), "--prompts", str(prompts),
                 "--methods", "target", "anyspec-slem", "hf-target", "--max-new-tokens", "4",
                 "--dtype", "fp32", "--json", str(out_json), "--markdown", str(out_md)])
    assert code == 0
    line = "hf-target failed on p/p1: RuntimeError: cannot reshape tensor of 0 elements; skipped"
    assert [x.strip() for x in capsys.readouterr().err.splitlines() if "failed" in x] == [line]
    result = json.loads(out_json.read_text())
    assert result["notes"]["hf-target"] == line.removeprefix("hf-target ")
    done = sorted((r["prompt"], r["method"]) for r in result["runs"])
    assert done == [("p0", "anyspec-slem"), ("p0", "hf-target"), ("p0", "target"),
                    ("p1", "anyspec-slem"), ("p1", "target")]
    table = out_md.read_text()
    assert "| all | anyspec-slem |" in table and "| all | hf-target |" in table
    assert f"- {line.replace('hf-target ', 'hf-target: ', 1)}" in table

# ---- vLLM: in-process, or in a subprocess of another python (--vllm-python) ---------------------------
# Real vLLM cannot run in this venv (it needs other torch/transformers versions), so these tests
# put a fake ``vllm`` package on the path: the real runner script and protocol run around it.

FAKE_VLLM = '''
import json, os, sys
__version__ = "0.0-fake"
print("fake vllm: noise on stdout at import")  # must not reach the bench's protocol
if os.environ.get("FAKE_VLLM_BROKEN"):
    raise ImportError("fake vllm is broken")
LOADED = []

class Metric:
    def __init__(self, name, value):
        self.name, self.value = name, value

class SamplingParams:
    def __init__(self, temperature=1.0, max_tokens=16):
        self.temperature, self.max_tokens = temperature, max_tokens

class _Completion:
    def __init__(self, ids, text):
        self.token_ids, self.text = ids, text

class _Output:
    def __init__(self, ids, text):
        self.outputs = [_Completion(ids, text)]

class LLM:
    def __init__(self, model, **kw):
        self.kw = dict(kw, model=model)
        self.drafted = self.accepted = 0
        LOADED.append(self)

    def generate(self, prompts, params, use_tqdm=True):
        print("fake vllm: noise on stdout while generating")
        assert params.temperature == 0.0
        ids = prompts[0]["prompt_token_ids"]
        if ids == [666]:
            sys.stderr.write("fake vllm: boom, the engine died\\n")
            sys.stderr.flush()
            os._exit(7)
        if self.kw["speculative_config"]:
            self.drafted += 8
            self.accepted += 3
        new = [ids[-1] + i + 1 for i in range(params.max_tokens)]
        return [_Output(new, json.dumps({k: self.kw[k] for k in ("model", "dtype", "speculative_config")}))]

    def get_metrics(self):
        return [Metric("vllm:spec_decode_num_draft_tokens", self.drafted),
                Metric("vllm:spec_decode_num_accepted_tokens", self.accepted)]
'''


@pytest.fixture
def fake_vllm(tmp_path, monkeypatch):
    """A fake ``vllm`` for subprocesses of this python (PYTHONPATH); the path to put it in-process."""
    root = tmp_path / "fake_site"
    (root / "vllm").mkdir(parents=True)
    (root / "vllm" / "__init__.py").write_text(FAKE_VLLM)
    monkeypatch.setenv("PYTHONPATH", str(root))
    return root


def test_the_runner_folder_holds_nothing_to_shadow_vllm():
    """Run by path, the runner's folder comes first on sys.path: only the runner may be there."""
    assert sorted(p.name for p in bench_vllm.RUNNER.parent.iterdir() if p.suffix == ".py" or p.is_dir()
                  and p.name != "__pycache__") == ["__init__.py", "vllm_runner.py"]


def test_vllm_subprocess_protocol(fake_vllm):
    proc = bench_vllm.VllmProcess(sys.executable, "/models/t", "/models/d", "float32", 3, max_model_len=1024)
    try:
        assert proc.info["vllm"] == "0.0-fake" and proc.info["python"] == sys.executable
        for prompt in ([1, 2, 3], [10, 20]):  # one model, several prompts, one at a time
            out = proc.generate(prompt, 4)
            assert out["ids"] == [prompt[-1] + 1, prompt[-1] + 2, prompt[-1] + 3, prompt[-1] + 4]
            assert out["seconds"] > 0
            assert (out["drafted"], out["accepted"]) == (8, 3)  # this prompt's counts, not the totals
        sent = json.loads(out["text"])
        assert sent == {"model": "/models/t", "dtype": "float32",
                        "speculative_config": {"method": "draft_model", "model": "/models/d",
                                               "num_speculative_tokens": 3, "use_heterogeneous_vocab": True}}
    finally:
        proc.close()
    assert proc.proc.poll() == 0 and not os.path.exists(proc.log.name)


def test_vllm_subprocess_target_alone(fake_vllm):
    proc = bench_vllm.VllmProcess(sys.executable, "/models/t", None, "bfloat16", 4)
    try:
        out = proc.generate([5], 2)
        assert out["ids"] == [6, 7] and out["drafted"] is None and out["accepted"] is None
        assert json.loads(out["text"])["speculative_config"] is None
    finally:
        proc.close()


def test_vllm_subprocess_death_reports_stderr_tail(fake_vllm):
    proc = bench_vllm.VllmProcess(sys.executable, "/models/t", "/models/d", "float32", 4)
    with pytest.raises(bench_vllm.VllmUnavailable) as err:
        proc.generate([666], 4)
    msg = str(err.value)
    assert "exited with code 7" in msg and "boom, the engine died" in msg and "\n" not in msg
    assert os.path.exists(proc.log.name)  # named in the message, so kept
    os.unlink(proc.log.name)


def test_vllm_python_without_vllm_is_one_line(fake_vllm, monkeypatch):
    monkeypatch.setenv("FAKE_VLLM_BROKEN", "1")
    msg = "^vllm does not import with .*fake vllm is broken.*skipped$"
    with pytest.raises(bench_vllm.VllmUnavailable, match=msg):
        bench_vllm.VllmProcess(sys.executable, "/models/t", "/models/d", "float32", 4)


def test_missing_vllm_python_is_a_note(tmp_path):
    methods, notes = bench_run.available(["target", "vllm", "vllm-target"], tmp_path / "no" / "python")
    assert methods == ["target"]
    assert set(notes) == {"vllm", "vllm-target"}
    assert "does not exist" in notes["vllm"] and "\n" not in notes["vllm"]
    with pytest.raises(bench_vllm.VllmUnavailable, match="cannot start"):
        bench_vllm.VllmProcess(tmp_path / "no" / "python", "/models/t", None, "float32", 4)


def test_vllm_python_option_defaults_to_env(monkeypatch):
    import argparse

    from anyspec.cli import bench as bench_command

    monkeypatch.setenv("ANYSPEC_VLLM_PYTHON", "/opt/vllm/bin/python")
    parser = argparse.ArgumentParser()
    bench_command.add_parser(parser.add_subparsers())
    args = parser.parse_args(["bench"])
    assert args.vllm_python == "/opt/vllm/bin/python"
    assert "vllm-target" not in args.methods and "vllm" in args.methods
    assert parser.parse_args(["bench", "--vllm-python", "x"]).vllm_python == "x"


def test_vllm_speedups_in_summary():
    runs = [run("target", "a", 10, 2.0), run("vllm-target", "a", 10, 1.0, identical=True),
            run("vllm", "a", 10, 4.0, drafted=8, accepted=2, identical=True)]
    rows = {r["method"]: r for r in report.summarize(runs) if r["set"] == "all"}
    assert rows["vllm"]["speedup"] == 0.5 and rows["vllm"]["speedup_vs_vllm-target"] == 0.25
    assert rows["vllm"]["acceptance"] == 0.25 and rows["vllm-target"]["speedup"] == 2.0
    info = {"vllm": "0.32.0", "python": "/v/bin/python", "dtype": "float32", "speculative": True,
            "enforce_eager": True,
            "cpus": "1", "mapping": "anyspec plugin"}
    table = report.markdown({"config": {"target": "t", "draft": "d", "dtype": "float32", "k": 4,
                                        "max_new_tokens": 8, "threads": 2, "temperature": 0.7,
                                        "vllm": {"vllm": info}},
                             "notes": {}, "runs": runs, "summary": report.summarize(runs)})
    assert ("| all | vllm | 10 | 2.50 | 0.50x (target), 0.25x (vllm-target) | - | - | - | 4.00 | 0.25 | - "
            "| 1/1 | - |") in table
    assert ("- vllm: vLLM 0.32.0 (/v/bin/python, target and draft in float32, eager, cores 1, "
            "vocab mapping: anyspec plugin)") in table


@pytest.mark.parametrize("where", ["subprocess", "in-process"])
def test_run_bench_with_vllm(where, tmp_path, tok_qwen2, tok_smollm2, fake_vllm, monkeypatch):
    from tiny_models import CHATML, save_tiny_model

    if where == "in-process":
        monkeypatch.syspath_prepend(str(fake_vllm))
        monkeypatch.delitem(sys.modules, "vllm", raising=False)
    target = save_tiny_model(tok_qwen2, tmp_path / "target", "qwen2", seed=0, chat_template=CHATML)
    draft = save_tiny_model(tok_smollm2, tmp_path / "draft", "llama", seed=1, chat_template=CHATML)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("\n".join(json.dumps({"id": f"p{i}", "messages": [{"role": "user", "content": c}]})
                                 for i, c in enumerate(["Write code.", "Say hello."])) + "\n")
    methods = ["target", "vllm-target", "vllm"]
    try:
        settings = BenchSettings(str(target), str(draft), [prompts], methods, max_new_tokens=5,
                                 speculative=SpeculativeConfig(num_speculative_tokens=3),
                                 dtype="fp32", vllm_python=sys.executable if where == "subprocess" else None)
        result = bench_run.run_bench(settings, log=lambda s: None)
    finally:
        if where == "in-process":
            sys.modules.pop("vllm", None)
    assert result["notes"] == {}
    assert set(result["config"]["vllm"]) == {"vllm", "vllm-target"}
    runs = result["runs"]
    assert sorted(r["method"] for r in runs) == sorted(methods * 2)
    orders = {p: [r["method"] for r in sorted((r for r in runs if r["prompt"] == p),
                                              key=lambda r: r["order"])] for p in ("p0", "p1")}
    assert orders["p0"] != orders["p1"]  # the vLLM methods rotate with the others
    for r in (r for r in runs if r["method"].startswith("vllm")):
        assert len(r["ids"]) == 5 and r["seconds"] > 0
        assert r["identical"] is False and r["diff_pos"] == 0  # the fake's ids are not the target's
        assert (r["drafted"], r["accepted"]) == ((8, 3) if r["method"] == "vllm" else (None, None))
    rows = {r["method"]: r for r in result["summary"] if r["set"] == "all"}
    assert rows["vllm"]["acceptance"] == 0.375 and rows["vllm"]["speedup"] is not None
    assert "speedup_vs_vllm-target" in rows["vllm"]


def test_run_bench_vllm_dies_midway_is_a_note(tmp_path, tok_qwen2, tok_smollm2, fake_vllm, monkeypatch):
    from tiny_models import CHATML, save_tiny_model

    target = save_tiny_model(tok_qwen2, tmp_path / "target", "qwen2", seed=0, chat_template=CHATML)
    draft = save_tiny_model(tok_smollm2, tmp_path / "draft", "llama", seed=1, chat_template=CHATML)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"id": "p0", "prompt": "hello"}) + "\n")
    real = bench_run.prompt_ids
    monkeypatch.setattr(bench_run, "prompt_ids", lambda tok, p: [666] if p == "hello" else real(tok, p))
    settings = BenchSettings(str(target), str(draft), [prompts], ["target", "vllm"], max_new_tokens=4,
                             dtype="fp32", vllm_python=sys.executable)
    result = bench_run.run_bench(settings, log=lambda s: None)
    assert [r["method"] for r in result["runs"]] == ["target"]
    assert "exited with code 7" in result["notes"]["vllm"] and "boom" in result["notes"]["vllm"]
    os.unlink(result["notes"]["vllm"].split("full log: ")[1].split(")")[0])


def test_repeat_runs_every_prompt_again_in_its_next_rotation(tmp_path, tok_qwen2, tok_smollm2):
    target, draft, prompts = tiny_pair(tmp_path, tok_qwen2, tok_smollm2, ["Hi."])
    settings = BenchSettings(str(target), str(draft), [prompts], ["target", "anyspec-slem"], max_new_tokens=4,
                             dtype="fp32", repeat=3)
    result = bench_run.run_bench(settings, log=lambda s: None)
    runs = result["runs"]
    assert sorted((r["repeat"], r["method"]) for r in runs) == [
        (i, m) for i in range(3) for m in ("anyspec-slem", "target")]
    firsts = [next(r["method"] for r in runs if r["repeat"] == i and r["order"] == 0) for i in range(3)]
    assert firsts == ["target", "anyspec-slem", "target"]  # the rotation moves on at each repeat
    assert all(r["identical"] for r in runs if r["method"] == "anyspec-slem")
    row = next(r for r in result["summary"] if r["set"] == "all" and r["method"] == "target")
    assert row["prompts"] == 3 and result["config"]["repeat"] == 3
    assert "3 runs of each" in report.markdown(result)
    with pytest.raises(ConfigError, match="--repeat"):
        BenchSettings(str(target), str(draft), [prompts], ["target"], repeat=0)


def test_logit_margin_is_the_reference_targets_own_top1_minus_top2(tok_qwen2):
    """Scored through anyspec's target wrapper (lean or transformers'), leaving its cache empty."""
    import torch
    from test_engine import tiny

    target = tiny("qwen2", tok_qwen2, seed=3)
    prompt, ref = "def add(a, b):", tok_qwen2.encode(" return a + b")
    ids = tok_qwen2.encode(prompt) + ref[:2]
    target.reset()
    top = torch.topk(target.extend(ids, last=1)[-1], 2).values
    target.extend([5])  # a cache the margin must not read
    margin = bench_run.logit_margin(target, prompt, ref, 2)
    assert margin == pytest.approx(float(top[0] - top[1]), abs=1e-6) and margin >= 0
    assert target.num_cached == 0


def test_a_second_draft_dtype_runs_as_a_variant_in_the_same_rotation(tmp_path, tok_qwen2, tok_smollm2):
    target, draft, prompts = tiny_pair(tmp_path, tok_qwen2, tok_smollm2, ["Write code.", "Say hello."])
    settings = BenchSettings(str(target), str(draft), [prompts], ["target", "anyspec-slem"], max_new_tokens=5,
                             dtype="fp32", draft_dtype="fp32", also_draft_dtypes=["bf16"])
    log = []
    result = bench_run.run_bench(settings, log=log.append)
    assert any(line.startswith(f"loaded {draft} again (bf16)") for line in log)
    runs = result["runs"]
    assert sorted({r["method"] for r in runs}) == ["anyspec-slem", "anyspec-slem@bf16", "target"]
    assert [r["order"] for r in runs if r["prompt"] == "p0" and r["method"] == "anyspec-slem@bf16"] != \
        [r["order"] for r in runs if r["prompt"] == "p1" and r["method"] == "anyspec-slem@bf16"]
    assert all(r["identical"] for r in runs if r["method"].startswith("anyspec"))
    assert result["config"]["draft_dtype"] == "fp32" and result["config"]["also_draft_dtypes"] == ["bf16"]
    rows = {r["method"]: r for r in result["summary"] if r["set"] == "all"}
    variant = rows["anyspec-slem@bf16"]
    assert variant["speedup"] is not None and variant["draft_ms_per_token"] > 0
    assert rows["target"]["draft_ms_per_token"] is None
    assert "| all | anyspec-slem@bf16 |" in report.markdown(result)
    with pytest.raises(ConfigError, match="unknown draft dtype 'bf17'"):
        bench_run.run_bench(BenchSettings(str(target), str(draft), [prompts], ["anyspec-slem"],
                                          also_draft_dtypes=["bf17"]), log=lambda s: None)


def test_rounds_by_cause_and_the_ngram_methods_reach_the_summary(tmp_path, tok_qwen2, tok_smollm2):
    target, draft, prompts = tiny_pair(tmp_path, tok_qwen2, tok_smollm2, ["a b a b a b a"])
    methods = ["target", "target-ngram", "anyspec-slem", "anyspec-slem-ngram"]
    result = bench_run.run_bench(BenchSettings(str(target), str(draft), [prompts], methods, max_new_tokens=12,
                                               dtype="fp32", speculative=SpeculativeConfig(ngram=1)),
                                 log=lambda s: None)
    assert result["config"]["ngram"] == 1
    rows = {r["method"]: r for r in result["summary"] if r["set"] == "all"}
    for m in methods[1:]:
        assert rows[m]["identical"] == "1/1" and sum(rows[m]["ended_by"].values()) == rows[m]["rounds"]
    assert set(rows["target"]["ended_by"]) == {"none"}
    assert any(c.startswith("ngram:") for c in rows["target-ngram"]["ended_by"])
    assert rows["target-ngram"]["ngram_acceptance"] is not None
    table = report.markdown(result)
    assert "Why rounds ended" in table and "| anyspec-slem | " in table.split("Why rounds ended")[1]


def test_the_ngram_methods_always_look_up_and_the_others_run_as_configured():
    assert bench_run.lookup_setting(None, draft=True, forced=True) == AUTO_NGRAM
    assert bench_run.lookup_setting(0, draft=True, forced=True) == AUTO_NGRAM
    assert bench_run.lookup_setting(3, draft=False, forced=True) == 3
    assert bench_run.lookup_setting(None, draft=True, forced=False) is None  # the engine's default
    assert bench_run.lookup_setting(3, draft=True, forced=False) == 3  # --ngram as in generate
    assert bench_run.lookup_setting(3, draft=False, forced=False) == 0  # the target alone


def test_the_predicted_methods_give_each_prompt_its_prediction(tmp_path, tok_qwen2, tok_smollm2):
    """``target-predicted`` and ``anyspec-slem-predicted``: the prompt's ``prediction`` reaches the
    engine (its tokens counted, some taken), the answers stay the target alone's; prompts without
    one are refused before loading."""
    target, draft, prompts = tiny_pair(tmp_path, tok_qwen2, tok_smollm2, ["Write code."])
    alone = bench_run.run_bench(BenchSettings(str(target), str(draft), [prompts], ["target"],
                                              max_new_tokens=16, dtype="fp32"), log=lambda s: None)
    answer = alone["runs"][0]["text"]
    row = json.loads(prompts.read_text()) | {"prediction": answer}
    prompts.write_text(json.dumps(row) + "\n")
    methods = ["target", "target-predicted", "anyspec-slem", "anyspec-slem-predicted"]
    result = bench_run.run_bench(BenchSettings(str(target), str(draft), [prompts], methods, max_new_tokens=16,
                                               dtype="fp32"), log=lambda s: None)
    runs = {r["method"]: r for r in result["runs"]}
    assert all(r["identical"] for m, r in runs.items() if m != "target")
    for m in ("target-predicted", "anyspec-slem-predicted"):
        assert runs[m]["prediction_tokens"] > 8 and runs[m]["prediction_accepted"] > 4, runs[m]
    assert runs["target"]["prediction_tokens"] == runs["anyspec-slem"]["prediction_tokens"] == 0
    assert runs["target-predicted"]["rounds"] < runs["target"]["rounds"]
    plain = tmp_path / "plain.jsonl"
    plain.write_text(json.dumps({"id": "x", "prompt": "hi"}) + "\n")
    with pytest.raises(ConfigError, match="target-predicted need prompts that carry a 'prediction'"):
        bench_run.run_bench(BenchSettings(str(target), str(draft), [plain], ["target", "target-predicted"]),
                            log=lambda s: None)
    plain.write_text(json.dumps({"id": "x", "prompt": "hi", "prediction": 3}) + "\n")
    with pytest.raises(ConfigError, match="'prediction' must be a non-empty text"):
        bench_prompts.load_prompts(plain)
