import json

import pytest

from anyspec import bench
from anyspec.errors import ConfigError


def test_shipped_prompt_files_load():
    for name in ("code", "prose"):
        rows = bench.load_prompts(bench.PROMPTS_DIR / f"{name}.jsonl")
        assert len(rows) >= 3 and all(r["set"] == name for r in rows)
        assert all(r["prompt"][0]["role"] == "user" and r["prompt"][0]["content"] for r in rows)
        assert len({r["id"] for r in rows}) == len(rows)


def test_bad_prompt_files_are_one_line_errors(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        bench.load_prompts(tmp_path / "nope.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "prompt": "x"}\n{not json\n')
    with pytest.raises(ConfigError, match="bad.jsonl:2"):
        bench.load_prompts(bad)
    bad.write_text(json.dumps({"id": "a", "text": "x"}) + "\n")
    with pytest.raises(ConfigError, match="neither"):
        bench.load_prompts(bad)


def test_first_difference():
    assert bench.first_difference([1, 2, 3], [1, 2, 3]) is None
    assert bench.first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert bench.first_difference([1, 2, 3], [1, 2]) == 2
    assert bench.first_difference([], []) is None


def run(method, prompt, n, seconds, s="code", **kw):
    return {"method": method, "prompt": prompt, "set": s, "ids": list(range(n)), "seconds": seconds,
            "drafted": kw.pop("drafted", None), "accepted": kw.pop("accepted", None), **kw}


def test_summary_speedups_acceptance_and_exactness():
    runs = [run("target", "a", 10, 2.0), run("anyspec-greedy", "a", 10, 1.0, drafted=8, accepted=6,
                                             identical=True),
            run("target", "b", 10, 2.0), run("anyspec-greedy", "b", 10, 1.0, drafted=8, accepted=2,
                                             identical=False, diff_pos=3, diff_margin=0.01),
            run("hf-target", "a", 10, 4.0, identical=True), run("hf-uag", "a", 10, 2.0, identical=True)]
    rows = {(r["set"], r["method"]): r for r in bench.summarize(runs)}
    g = rows[("code", "anyspec-greedy")]
    assert g["tokens_per_second"] == 10.0 and g["speedup"] == 2.0 and g["acceptance"] == 0.5
    assert g["identical"] == "1/2" and g["diffs"] == [("b", 3, 0.01)]
    assert rows[("code", "hf-uag")]["speedup"] == 2.0  # against hf-target, not target
    assert rows[("code", "target")]["speedup"] is None
    order = [r["method"] for r in bench.summarize(runs) if r["set"] == "all"]
    assert order == ["target", "anyspec-greedy", "hf-target", "hf-uag"]
    table = bench.markdown({"config": {"target": "t", "draft": "d", "dtype": "float32", "k": 4,
                                       "max_new_tokens": 8, "threads": 2, "temperature": 0.7},
                            "notes": {"vllm": "not installed"}, "runs": runs,
                            "summary": bench.summarize(runs)})
    assert "| code | anyspec-greedy | 20 | 10.00 | 2.00x (target) | 0.5 | 1/2 | b @3 (0.01) |" in table
    assert "- vllm: not installed" in table


def test_plot_writes_png(tmp_path):
    pytest.importorskip("matplotlib")
    runs = [run("target", "a", 10, 2.0), run("anyspec-greedy", "a", 10, 1.0, drafted=4, accepted=4,
                                             identical=True)]
    result = {"config": {"target": "t", "draft": "d", "dtype": "float32", "k": 4, "threads": 2},
              "summary": bench.summarize(runs)}
    bench.plot(result, tmp_path / "p.png")
    assert (tmp_path / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_unknown_method_is_refused_before_loading(monkeypatch):
    with pytest.raises(ConfigError, match="unknown method"):
        bench.run_bench("t", "d", [bench.PROMPTS_DIR / "code.jsonl"], ["target", "magic"])


def test_run_bench_end_to_end_on_tiny_models(tmp_path, tok_qwen2, tok_smollm2):
    from tiny_models import CHATML, save_tiny_model

    target = save_tiny_model(tok_qwen2, tmp_path / "target", "qwen2", seed=0, chat_template=CHATML)
    draft = save_tiny_model(tok_smollm2, tmp_path / "draft", "llama", seed=1, chat_template=CHATML)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("\n".join(json.dumps({"id": f"p{i}", "messages": [{"role": "user", "content": c}]})
                                 for i, c in enumerate(["Write code.", "Say hello."])) + "\n")
    methods = ["target", "anyspec-greedy", "anyspec-sampled", "hf-target", "hf-uag", "vllm"]
    result = bench.run_bench(str(target), str(draft), [prompts], methods, max_new_tokens=6, dtype="fp32",
                             log=lambda s: None)
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
    table = bench.markdown(result)
    assert "| all | anyspec-greedy |" in table and "(target)" in table and "(hf-target)" in table
