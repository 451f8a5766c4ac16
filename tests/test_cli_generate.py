"""``anyspec generate``: bad input fails in one line before any model loads; --json on tiny models."""

from __future__ import annotations

import json

import pytest

from anyspec.cli import main


@pytest.fixture(scope="module")
def tiny_dirs(folders):
    return {"target": str(folders[0]), "draft": str(folders[1])}


BAD = [
    (["--method", "ngram"], "unknown speculative method"),
    (["--k", "0"], "num_speculative_tokens"),
    (["--algorithm", "slem", "--draft-context", "token-map"], "needs draft_context='retokenize'"),
    (["--draft-context", "guess"], "draft_context"),
    (["--draft-sample-method", "beam"], "draft_sample_method"),
    (["--temperature", "-0.5"], "temperature"),
    (["--top-p", "0"], "top_p"),
    (["--top-p", "1.5"], "top_p"),
    (["--top-k", "-1"], "top_k"),
    (["--max-new-tokens", "0"], "max_new_tokens"),
    (["--target", "/no/such/model"], "/no/such/model"),
    (["--draft", "./missing.gguf"], "missing.gguf"),
    (["--draft", "not-a-builtin-name"], "not-a-builtin-name"),
    (["--dtype", "fp8"], "dtype"),
    (["--threads", "0"], "--threads must be >= 1, got 0"),
]


@pytest.mark.parametrize(("extra", "message"), BAD, ids=[" ".join(e) for e, _ in BAD])
def test_bad_input_fails_before_loading(no_loading, capsys, extra, message):
    rc = main(["generate", "--prompt", "hello", *extra])
    err = capsys.readouterr().err
    assert rc == 2
    assert message in err and err.count("\n") == 1 and "Traceback" not in err


@pytest.mark.parametrize("command", [["demo"], ["bench", "--methods", "target"]])
def test_a_bad_thread_count_fails_before_loading(no_loading, capsys, folders, command):
    import torch

    before = torch.get_num_threads()
    models = ["--target", str(folders[0]), "--draft", str(folders[1])]
    assert main([*command, *models, "--threads", "-2"]) == 2
    err = capsys.readouterr().err
    assert "--threads must be >= 1, got -2" in err and err.count("\n") == 1
    assert torch.get_num_threads() == before


def test_empty_prompt_fails_before_loading(no_loading, capsys):
    assert main(["generate", "--prompt", ""]) == 2
    assert "prompt is empty" in capsys.readouterr().err


def test_json_output_and_no_draft_baseline(tiny_dirs, capsys):
    common = ["generate", "--target", tiny_dirs["target"], "--prompt", "def add(a, b):",
              "--max-new-tokens", "12", "--dtype", "fp32", "--json"]
    assert main([*common, "--draft", tiny_dirs["draft"], "--k", "3"]) == 0
    spec = json.loads(capsys.readouterr().out)
    assert main([*common, "--no-draft"]) == 0
    alone = json.loads(capsys.readouterr().out)
    assert set(spec) == {"text", "token_ids", "stats"}
    assert set(spec["stats"]) == {"algorithm", "rounds", "drafted", "accepted", "acceptance_rate",
                                  "mean_accepted_length", "tokens_per_second", "draft_seconds",
                                  "target_seconds"}
    assert spec["stats"]["algorithm"] == "slem" and alone["stats"]["algorithm"] == "none"  # auto, greedy
    assert spec["token_ids"] == alone["token_ids"] and spec["text"] == alone["text"]
    assert len(spec["token_ids"]) == 12
    assert spec["stats"]["drafted"] > 0 and alone["stats"]["drafted"] == 0


def test_streams_text_to_stdout_and_stats_to_stderr(tiny_dirs, capsys):
    rc = main(["generate", "--target", tiny_dirs["target"], "--draft", tiny_dirs["draft"],
               "--prompt", "Hello", "--max-new-tokens", "6", "--dtype", "fp32", "--temperature", "0.8",
               "--seed", "1"])
    out = capsys.readouterr()
    assert rc == 0
    assert "acceptance" not in out.out and "accepted" in out.err and "tok/s" in out.err


def test_one_call_helper_checks_before_loading(no_loading):
    import anyspec
    from anyspec.errors import ConfigError

    with pytest.raises(ConfigError, match="empty"):
        anyspec.generate("")
    with pytest.raises(ConfigError, match="/no/such/dir"):
        anyspec.generate("hi", target="/no/such/dir")
    with pytest.raises(ConfigError, match="top_p"):
        anyspec.generate("hi", params=anyspec.SamplingParams(top_p=2.0))
