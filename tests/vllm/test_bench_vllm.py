"""``anyspec bench --vllm-python``: the bench drives vLLM's own speculative decoding in the vLLM venv.

One code and one prose prompt, 32 greedy tokens, fp32, k=4, one thread: the target alone on
anyspec's loop against vLLM (SmolLM2-135M drafting for Qwen2.5-Coder-0.5B, the anyspec plugin on),
each prompt through both in the bench's rotating order, vLLM loaded once in its subprocess.
About 2.5 minutes on two cores.
"""

from __future__ import annotations

import json
from pathlib import Path

from anyspec.bench import prompts, report, run
from anyspec.bench.context import BenchSettings
from anyspec.config import SpeculativeConfig
from anyspec.models import fetch_model

RESULTS = Path(__file__).resolve().parents[2] / "results" / "vllm"


def test_bench_runs_vllm_in_its_venv(vllm_python):
    target = fetch_model("qwen2.5-coder-0.5b", progress=False)
    draft = fetch_model("smollm2-135m", progress=False)
    files = [prompts.PROMPTS_DIR / "code.jsonl", prompts.PROMPTS_DIR / "prose.jsonl"]
    settings = BenchSettings(str(target), str(draft), files, ["target", "vllm"], max_new_tokens=32,
                             speculative=SpeculativeConfig(num_speculative_tokens=4),
                             dtype="fp32", threads=1, limit=1, vllm_python=str(vllm_python))
    result = run.run_bench(settings)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "bench_vllm_python.json").write_text(json.dumps(result, indent=1) + "\n")
    print("\n" + report.markdown(result))
    assert result["notes"] == {}
    info = result["config"]["vllm"]["vllm"]
    assert info["vllm"] == "0.32.0" and info["mapping"] == "anyspec plugin"
    runs = [r for r in result["runs"] if r["method"] == "vllm"]
    assert len(runs) == 2
    for r in runs:
        assert r["ids"] and r["seconds"] > 0 and r["drafted"] > 0
        # greedy: identical to the target alone, or a difference at a near-tie of the target's logits
        assert r["identical"] or (r["diff_margin"] is not None and r["diff_margin"] < 0.5), r
