"""vLLM 0.32 on CPU with the anyspec plugin, SmolLM2-135M drafting for Qwen2.5-Coder-0.5B.

Four subprocesses of the vLLM venv: both mappings built side by side, then the same greedy
prompts with the target alone, TLI with vLLM's mapping (plugin off) and TLI with the plugin on.
Results and logs go to results/vllm/ (git-ignored).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from anyspec.integrations.vllm import ACTIVE_MESSAGE
from anyspec.models import fetch_model

HERE = Path(__file__).parent
RESULTS = HERE.parents[1] / "results" / "vllm"
VLLM_OWN_MESSAGE = "VocabMapping initialized"


def _run(python: Path, target: Path, draft: Path, *args: str) -> tuple[dict, str]:
    env = dict(os.environ, HF_HUB_OFFLINE="1", VLLM_CPU_KVCACHE_SPACE="1", TOKENIZERS_PARALLELISM="false",
               VLLM_LOGGING_LEVEL="INFO")
    cmd = ["nice", "-n", "19", str(python), str(HERE / "run_vllm.py"), "--target", str(target),
           "--draft", str(draft), *args]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1200)
    log = proc.stdout + proc.stderr
    name = "_".join([Path(draft).name, *(a.strip("-") for a in args)])
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{name}.log").write_text(log)
    assert proc.returncode == 0, f"{' '.join(cmd)} failed:\n{log[-4000:]}"
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, f"no RESULT line:\n{log[-4000:]}"
    return json.loads(lines[-1].removeprefix("RESULT ")), log


@pytest.fixture(scope="module")
def runs(vllm_python):
    target = fetch_model("qwen2.5-coder-0.5b", progress=False)
    draft = fetch_model("smollm2-135m", progress=False)
    out = {"compare": _run(vllm_python, target, draft, "--compare-mappings")}
    for mode in ("none", "builtin", "anyspec"):
        out[mode] = _run(vllm_python, target, draft, "--mode", mode)
    summary = {mode: {k: v for k, v in result.items() if k not in ("token_ids", "texts")}
               for mode, (result, _) in out.items()}
    summary["none"]["generated_outside_intersection"] = _outside(target, draft, out["none"][0]["token_ids"])
    (RESULTS / "summary.json").write_text(json.dumps(summary, indent=1))
    print("\n" + json.dumps(summary, indent=1))
    return out


def _outside(target: Path, draft: Path, token_ids: list[list[int]]) -> int:
    """How many generated target tokens the draft reads as its UNK (outside the intersection)."""
    import torch
    from transformers import AutoConfig, AutoTokenizer

    from anyspec.vocab import VocabMapping

    sizes = [AutoConfig.from_pretrained(path).vocab_size for path in (target, draft)]
    tokenizers = [AutoTokenizer.from_pretrained(path) for path in (target, draft)]
    mapping = VocabMapping(*tokenizers, *sizes)
    ids = torch.tensor([i for row in token_ids for i in row])
    return int((mapping.map_target_to_draft_ids(ids) < 0).sum())


def test_greedy_outputs_identical(runs):
    reference = runs["none"][0]["token_ids"]
    assert all(len(ids) > 0 for ids in reference)
    for mode in ("builtin", "anyspec"):
        got = runs[mode][0]["token_ids"]
        for i, (ids, ref) in enumerate(zip(got, reference, strict=True)):
            assert ids == ref, f"{mode}: prompt {i} differs from the target alone"


def test_plugin_mapping_in_use(runs):
    on, off = runs["anyspec"][1], runs["builtin"][1]
    assert ACTIVE_MESSAGE in on and VLLM_OWN_MESSAGE not in on
    assert VLLM_OWN_MESSAGE in off and ACTIVE_MESSAGE not in off
    assert "plugin off (ANYSPEC_VLLM_PLUGIN=0)" in off
    assert ACTIVE_MESSAGE not in runs["none"][1]


def test_acceptance_reported(runs):
    assert not runs["none"][0]["counters"].get("num_draft_tokens")
    for mode in ("builtin", "anyspec"):
        result = runs[mode][0]
        assert result["counters"]["num_draft_tokens"] > 0, mode
        assert 0 < result["acceptance_rate"] <= 1, mode
    for mode in ("none", "builtin", "anyspec"):
        result = runs[mode][0]
        rate = result["acceptance_rate"] or 0
        print(f"\n{mode:8s} acceptance {rate:.3f}  {result['tokens_per_s']:.1f} tok/s")


def test_mappings_side_by_side(runs):
    compare = runs["compare"][0]
    assert compare["anyspec_intersection"] > 30_000
    # One byte-level BPE family on both sides: bytes and normalised strings agree, and the ChatML
    # markers pair by name in both, so the two mappings are the same tables for this pair.
    assert compare["only_vllm"] == compare["only_anyspec"] == compare["paired_differently"] == 0
    assert compare["identical_tables"] and compare["same_unk_ids"]
    assert ACTIVE_MESSAGE in runs["compare"][1] and VLLM_OWN_MESSAGE in runs["compare"][1]


def test_cross_family_mappings(vllm_python):
    """Gemma 3 (SentencePiece-style, byte fallback) drafting for Qwen2.5 (byte-level BPE): vLLM's
    string match misses the non-ASCII tokens and pairs some tokens whose bytes differ."""
    target = fetch_model("qwen2.5-coder-0.5b", progress=False)
    draft = fetch_model("gemma3-270m", progress=False)
    compare, _ = _run(vllm_python, target, draft, "--compare-mappings")
    print("\n" + json.dumps(compare))
    assert compare["anyspec_intersection"] > compare["vllm_intersection"] + 10_000
    assert compare["paired_differently"] > 0
