"""``anyspec generate``: bad input fails in one line before any model loads; --json on tiny models."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from anyspec.cli import main


@pytest.fixture(scope="module")
def tiny_dirs(folders):
    return {"target": str(folders[0]), "draft": str(folders[1])}


BAD = [
    (["--method", "ngram"], "unknown speculative method"),
    (["--num-speculative-tokens", "0"], "error: --num-speculative-tokens (k) must be an integer from 1"),
    (["--algorithm", "slem", "--draft-context", "token-map"], "needs draft_context='retokenize'"),
    (["--draft-context", "guess"], "draft_context"),
    (["--draft-sample-method", "beam"], "draft_sample_method"),
    (["--temperature", "-0.5"], "error: --temperature must be a finite number >= 0"),
    (["--top-p", "0"], "error: --top-p must be in (0, 1], got 0.0"),
    (["--top-p", "1.5"], "error: --top-p must be in (0, 1], got 1.5"),
    (["--top-k", "-1"], "error: --top-k must be an integer >= 0"),
    (["--typical-p", "0"], "error: --typical-p must be in (0, 1]"),
    (["--top-n-sigma", "-1"], "error: --top-n-sigma must be from 0 to 100"),
    (["--max-new-tokens", "0"], "--max-new-tokens must be at least 1, got 0"),
    (["--max-new-tokens", "-2"], "error: --max-new-tokens must be at least 1, got -2"),
    (["--target", "/no/such/model"], "/no/such/model"),
    (["--draft", "./missing.gguf"], "missing.gguf"),
    (["--draft", "not-a-builtin-name"], "not-a-builtin-name"),
    (["--dtype", "fp8"], "dtype"),
    (["--threads", "0"], "--threads must be >= 1, got 0"),
    (["--prompt", "caf\udce9"], "the prompt is not valid UTF-8"),  # what argv makes of a Latin-1 byte
    (["--stop", "\udcff"], "a stop string is not valid UTF-8"),
    (["--temperature", "inf"], "temperature must be a finite number"),
    (["--temperature", "nan"], "temperature must be a finite number"),
    (["--seed", "1180591620717411303424"], "seed must be an integer from 0 to 2**64 - 1, or -1 for none"),
    # float32 would make these inf/nan probabilities after the models load
    (["--temperature", "1e-300"], "temperature must be 0 (greedy) or at least 0.0001, got 1e-300"),
    (["--top-p", "1e-300"], "error: --top-p must be at least 1e-06"),
    (["--k", "1000000000000"], "--num-speculative-tokens (k) must be an integer from 1 to 64"),
    (["--threads", "100000"], "--threads must be at most this machine's"),
]


@pytest.mark.parametrize(("extra", "message"), BAD, ids=[" ".join(e) for e, _ in BAD])
def test_bad_input_fails_before_loading(no_loading, capsys, extra, message):
    rc = main(["generate", "--prompt", "hello", *extra])
    err = capsys.readouterr().err
    assert rc == 2
    assert message in err and err.count("\n") == 1 and "Traceback" not in err


@pytest.mark.parametrize("command", [["generate", "--prompt", "hi"], ["demo"]])
def test_more_new_tokens_than_the_context_holds_fails_before_loading(no_loading, capsys, tiny_dirs, command):
    import json
    from pathlib import Path

    context = json.loads((Path(tiny_dirs["target"]) / "config.json").read_text())["max_position_embeddings"]
    models = ["--target", tiny_dirs["target"], "--draft", tiny_dirs["draft"]]
    assert main([*command, *models, "--max-new-tokens", str(context)]) == 2
    err = capsys.readouterr().err
    says = f"--max-new-tokens {context} leaves no room for a prompt in the target's context of {context} "
    assert says in err and err.count("\n") == 1


def test_json_prompts_with_a_method_that_cannot_follow_schemas_fail_before_loading(no_loading, capsys,
                                                                                  tiny_dirs):
    models = ["--target", tiny_dirs["target"], "--draft", tiny_dirs["draft"]]
    assert main(["bench", *models, "--prompts", "json", "--methods", "target", "llama.cpp", "hf-uag"]) == 2
    err = capsys.readouterr().err
    assert "llama.cpp, hf-uag cannot follow the JSON schemas these prompts carry" in err
    assert err.count("\n") == 1


@pytest.mark.parametrize("command", [["demo"], ["bench", "--methods", "target"]])
def test_a_bad_thread_count_fails_before_loading(no_loading, capsys, folders, command):
    import torch

    before = torch.get_num_threads()
    models = ["--target", str(folders[0]), "--draft", str(folders[1])]
    assert main([*command, *models, "--threads", "-2"]) == 2
    err = capsys.readouterr().err
    assert "--threads must be >= 1, got -2" in err and err.count("\n") == 1
    assert torch.get_num_threads() == before


@pytest.mark.parametrize("command", [["generate", "--prompt", "hi"], ["serve"], ["bench"], ["demo"]])
def test_every_command_takes_k_under_one_name(command, capsys):
    from anyspec.cli.commands import build_parser

    parse = build_parser().parse_args
    for flag in ("-k", "--num-speculative-tokens", "--k"):  # --k: the older spelling, still accepted
        assert parse([*command, flag, "3"]).num_speculative_tokens == 3
    assert parse(command).num_speculative_tokens == 5
    with pytest.raises(SystemExit):
        parse([command[0], "--help"])
    shown = capsys.readouterr().out
    assert "-k K, --num-speculative-tokens K" in shown and "--k " not in shown


def test_empty_prompt_fails_before_loading(no_loading, capsys):
    assert main(["generate", "--prompt", ""]) == 2
    assert "prompt is empty" in capsys.readouterr().err


def one_line_error(capsys, argv: list[str], says: str) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert says in err and err.count("\n") == 1 and "Traceback" not in err, err


@pytest.mark.parametrize("prompt", ["", "   "])
def test_demo_refuses_an_empty_prompt_like_generate(no_loading, capsys, prompt):
    one_line_error(capsys, ["demo", "--prompt", "fine", "--prompt", prompt], "the prompt is empty")
    one_line_error(capsys, ["generate", "--prompt", prompt], "the prompt is empty")


def test_bench_output_that_cannot_be_written_fails_before_loading(no_loading, capsys, tmp_path):
    for option in ("--json", "--markdown", "--plot"):
        one_line_error(capsys, ["bench", option, str(tmp_path / "missing" / "out.json")], "does not exist")
    one_line_error(capsys, ["bench", "--json", str(tmp_path)], "is a folder")


@pytest.mark.parametrize("limit", ["0", "-3"])
def test_bench_limit_below_one_fails_before_loading(no_loading, capsys, limit):
    one_line_error(capsys, ["bench", "--limit", limit], f"--limit must be an integer >= 1, got {limit}")


@pytest.mark.parametrize("port", ["99999", "65536", "0"])
def test_serve_port_out_of_range_fails_before_loading(no_loading, capsys, port):
    one_line_error(capsys, ["serve", "--port", port], "--port must be")


@pytest.mark.parametrize("where", ["a file", "under a file"])
@pytest.mark.parametrize("command", [["models", "list"], ["generate", "--prompt", "hi"]])
def test_a_cache_dir_that_is_not_a_writable_folder_is_one_line(no_loading, capsys, tmp_path, monkeypatch,
                                                               where, command):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("ANYSPEC_CACHE_DIR", str(blocker if where == "a file" else blocker / "cache"))
    one_line_error(capsys, command, "set ANYSPEC_CACHE_DIR to a writable folder")


def test_bench_output_that_opens_but_cannot_be_written_fails_before_loading(no_loading, capsys):
    """/proc/version's folder passes os.access for root, yet the file takes no writes."""
    one_line_error(capsys, ["bench", "--json", "/proc/version"], "--json /proc/version cannot be written")


def test_checking_an_existing_output_leaves_it_as_it_is(tmp_path):
    from anyspec.cli.options import check_output

    old = tmp_path / "bench.json"
    old.write_text("earlier results\n")
    check_output(old, "--json")
    assert old.read_text() == "earlier results\n" and list(tmp_path.iterdir()) == [old]


def test_results_are_written_atomically(tmp_path):
    """A write that fails halfway leaves the earlier file whole, and no temporary file behind."""
    from anyspec.cli.options import write_atomically

    out = tmp_path / "bench.json"
    out.write_text("earlier results\n")
    out.chmod(0o640)
    with pytest.raises(RuntimeError), write_atomically(out) as tmp:
        tmp.write_text("half")
        raise RuntimeError("the run failed")
    assert out.read_text() == "earlier results\n" and list(tmp_path.iterdir()) == [out]
    with write_atomically(out) as tmp:
        assert tmp.parent == tmp_path and tmp.suffix == ".json"
        tmp.write_text("new results\n")
    assert out.read_text() == "new results\n" and list(tmp_path.iterdir()) == [out]
    assert out.stat().st_mode & 0o777 == 0o640  # the file it replaced had these permissions


def test_same_vocab_across_vocabularies_names_the_flag(tiny_dirs, capsys):
    assert main(["generate", "--target", tiny_dirs["target"], "--draft", tiny_dirs["draft"], "--prompt", "hi",
                 "--same-vocab", "--dtype", "fp32"]) == 2
    last = capsys.readouterr().err.splitlines()[-1]
    assert last.startswith("anyspec generate: error: the draft's vocabulary")
    assert "leave out --same-vocab" in last


def test_json_to_a_closed_pipe_is_quiet(tiny_dirs):
    """``anyspec generate --json | true``: no BrokenPipeError traceback, and the status of a command
    that SIGPIPE ended (141), as ``cat`` and ``yes`` give."""
    read, write = os.pipe()
    os.close(read)  # the reader is gone before anything is written
    argv = ["generate", "--target", tiny_dirs["target"], "--draft", tiny_dirs["draft"], "--prompt", "hi",
            "--max-new-tokens", "2", "--dtype", "fp32", "--threads", "1", "--json"]
    proc = subprocess.run([sys.executable, "-m", "anyspec", *argv], stdout=write, stderr=subprocess.PIPE,
                          text=True, timeout=600)
    os.close(write)
    assert "Traceback" not in proc.stderr and "BrokenPipeError" not in proc.stderr, proc.stderr
    assert proc.returncode == 141


def test_a_prompt_beyond_the_context_is_one_line(tiny_dirs, capsys):
    """The tiny target reads 256 tokens: a longer prompt is refused before the prefill (loading the
    models writes progress to stderr first)."""
    assert main(["generate", "--target", tiny_dirs["target"], "--draft", tiny_dirs["draft"],
                 "--prompt", "one two three " * 100, "--dtype", "fp32"]) == 2
    last = capsys.readouterr().err.splitlines()[-1]
    assert last.startswith("anyspec generate: error: the prompt has 301 tokens")
    assert "beyond the target's context of 256 tokens" in last


def test_json_output_and_no_draft_baseline(tiny_dirs, capsys):
    common = ["generate", "--target", tiny_dirs["target"], "--prompt", "def add(a, b):",
              "--max-new-tokens", "12", "--dtype", "fp32", "--json"]
    assert main([*common, "--draft", tiny_dirs["draft"], "-k", "3"]) == 0
    spec = json.loads(capsys.readouterr().out)
    assert main([*common, "--no-draft"]) == 0
    alone = json.loads(capsys.readouterr().out)
    assert set(spec) == {"text", "token_ids", "finish_reason", "stop_reason", "stats"}
    assert spec["finish_reason"] == "length" and spec["stop_reason"] is None
    assert set(spec["stats"]) == {"algorithm", "rounds", "drafted", "accepted", "acceptance_rate",
                                  "mean_accepted_length", "tokens_per_second", "draft_seconds",
                                  "target_seconds", "ended_by", "rejected_at", "ngram_proposed",
                                  "ngram_accepted"}
    assert spec["stats"]["algorithm"] == "slem" and alone["stats"]["algorithm"] == "none"  # auto, greedy
    assert spec["token_ids"] == alone["token_ids"] and spec["text"] == alone["text"]
    assert len(spec["token_ids"]) == 12
    assert spec["stats"]["drafted"] > 0 and alone["stats"]["drafted"] == 0
    assert sum(spec["stats"]["ended_by"].values()) == spec["stats"]["rounds"]
    assert alone["stats"]["ended_by"] == {"none": alone["stats"]["rounds"]}
    assert main([*common, "--no-draft", "--ngram", "1"]) == 0
    lookup = json.loads(capsys.readouterr().out)
    assert lookup["token_ids"] == alone["token_ids"] and lookup["stats"]["algorithm"] == "ngram"
    assert main([*common, "--no-draft", "--ngram", "9"]) == 2
    assert "ngram must be an integer from 0 (off) to 4" in capsys.readouterr().err


def test_seed_minus_one_is_no_seed(tiny_dirs, capsys):
    """``--seed -1`` (llama.cpp's "a random seed") draws a seed for each answer, as no --seed does,
    and reports it; that seed gives the answer again. It is not read as the seed 2**64 - 1."""
    common = ["generate", "--target", tiny_dirs["target"], "--draft", tiny_dirs["draft"], "--prompt", "Once",
              "--max-new-tokens", "8", "--dtype", "fp32", "--temperature", "1", "--json"]
    answers = []
    for seed in ("-1", "-1", str(2**64 - 1)):
        assert main([*common, "--seed", seed]) == 0
        answers.append(json.loads(capsys.readouterr().out))
    drawn = [a["seed"] for a in answers[:2]]
    assert drawn[0] != drawn[1] and all(0 <= s < 2**53 for s in drawn)
    assert answers[2]["seed"] == 2**64 - 1
    assert main([*common, "--seed", str(drawn[0])]) == 0
    assert json.loads(capsys.readouterr().out)["token_ids"] == answers[0]["token_ids"]


def test_a_chat_template_given_replaces_the_targets_own(tiny_dirs, capsys, tmp_path):
    """--chat with --chat-template answers the prompt the given template renders (the same as that
    text sent plainly), not the one the model's own template renders."""
    template = tmp_path / "qa.jinja"
    template.write_text("{% for m in messages %}Q: {{ m['content'] }}\n{% endfor %}A:")
    common = ["generate", "--target", tiny_dirs["target"], "--draft", tiny_dirs["draft"],
              "--max-new-tokens", "10",
              "--dtype", "fp32", "--json"]
    answers = []
    for extra in (["--prompt", "Name a prime.", "--chat", "--chat-template", str(template)],
                  ["--prompt", "Q: Name a prime.\nA:"], ["--prompt", "Name a prime.", "--chat"],
                  ["--prompt", "Name a prime.", "--chat", "--chat-template", template.read_text()]):
        assert main([*common, *extra]) == 0
        answers.append(json.loads(capsys.readouterr().out)["token_ids"])
    assert answers[0] == answers[1] == answers[3] != answers[2]


def test_json_output_under_a_schema_adds_the_grammars_counts(tiny_dirs, capsys, tmp_path):
    pytest.importorskip("llguidance")
    schema = tmp_path / "schema.json"
    schema.write_text('{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}')
    assert main(["generate", "--target", tiny_dirs["target"], "--draft", tiny_dirs["draft"], "--prompt", "{",
                 "--max-new-tokens", "8", "--dtype", "fp32", "--json", "--json-schema", str(schema)]) == 0
    stats = json.loads(capsys.readouterr().out)["stats"]
    assert {"forced", "grammar_seconds"} <= set(stats) and stats["grammar_seconds"] > 0


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


def test_choice_regex_and_grammar_hold_the_answer(tiny_dirs, capsys, tmp_path):
    """The tiny random model writes anything unconstrained; held, it writes one of the choices, what
    the regular expression matches, or what the GBNF grammar's ``root`` does."""
    pytest.importorskip("llguidance")
    import re

    gbnf = tmp_path / "pair.gbnf"
    gbnf.write_text('root ::= word "=" [0-9]+\nword ::= "x" | "yz"\n')

    common = ["generate", "--target", tiny_dirs["target"], "--draft", tiny_dirs["draft"], "--prompt", "Pick:",
              "--max-new-tokens", "12", "--dtype", "fp32", "--json"]
    for held, pattern in ((["--choice", "red", "--choice", "green blue"], "red|green blue"),
                          (["--regex", "[0-9]{3}-[a-z]{2}"], "[0-9]{3}-[a-z]{2}"),
                          (["--grammar-file", str(gbnf)], "(x|yz)=[0-9]+"), ([], None)):
        assert main([*common, *held]) == 0
        text = json.loads(capsys.readouterr().out)["text"]
        assert bool(pattern and re.fullmatch(pattern, text)) == bool(held), text


def test_an_fp16_kv_cache_generates_the_targets_own_answer(tiny_dirs, capsys):
    """``--kv-cache-dtype fp16`` on the lean kernels: the answer is the target alone's on the same cache."""
    common = ["generate", "--target", tiny_dirs["target"], "--prompt", "def add(a, b):",
              "--max-new-tokens", "12", "--dtype", "int8", "--kv-cache-dtype", "fp16", "--json"]
    assert main([*common, "--draft", tiny_dirs["draft"], "--draft-dtype", "int8", "-k", "3"]) == 0
    spec = json.loads(capsys.readouterr().out)
    assert main([*common, "--no-draft"]) == 0
    alone = json.loads(capsys.readouterr().out)
    assert spec["stats"]["drafted"] > 0 and spec["token_ids"] == alone["token_ids"]


@pytest.mark.parametrize("command", [["generate", "--prompt", "hi"], ["chat"], ["serve"]])
@pytest.mark.parametrize(("flags", "says"), [
    (["--tree", "2"], "tree (--tree) only acts on a draft's rounds"),
    (["-k", "8"], "num_speculative_tokens (-k/--num-speculative-tokens) only acts on a draft's rounds (k on "
                  "prompt lookup's too, --ngram)"),
    (["--algorithm", "tli", "--adaptive-k"], "algorithm (--algorithm), adaptive_k (--adaptive-k) only act"),
    (["--draft-dtype", "int8"], "--draft-dtype int8 is for a draft and there is none")])
def test_no_draft_refuses_the_drafts_settings_before_loading(no_loading, capsys, command, flags, says):
    one_line_error(capsys, [*command, "--no-draft", *flags], says)


def test_no_draft_takes_k_for_prompt_lookup(no_loading):
    with pytest.raises(AssertionError, match="a model was loaded"):  # past every check, to the loading
        main(["generate", "--prompt", "hi", "--no-draft", "--ngram", "2", "-k", "8"])


def test_a_prompt_file_or_standard_input_gives_the_same_answer_as_the_prompt(tiny_dirs, capsys, tmp_path,
                                                                              monkeypatch):
    import io

    text = "def add(a, b):\n    # añadir, 加える\n"
    path = tmp_path / "prompt.txt"
    path.write_text(text, encoding="utf-8")
    common = ["generate", "--target", tiny_dirs["target"], "--draft", tiny_dirs["draft"],
              "--max-new-tokens", "8", "--dtype", "fp32", "--json"]
    answers = []
    for given in (["--prompt", text], ["--prompt-file", str(path)], ["--prompt-file", "-"]):
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(text.encode())))
        assert main([*common, *given]) == 0
        answers.append(json.loads(capsys.readouterr().out)["token_ids"])
    other = tmp_path / "other.txt"
    other.write_text("Once upon a time")
    assert main([*common, "--prompt-file", str(other)]) == 0
    assert answers[0] == answers[1] == answers[2] != json.loads(capsys.readouterr().out)["token_ids"]


@pytest.mark.parametrize(("content", "says"), [
    (None, "--prompt-file: cannot read PATH: No such file or directory"),
    (b"caf\xe9!", "--prompt-file: PATH is not valid UTF-8 text (invalid continuation byte at byte 3)"),
    (b" \n\t", "--prompt-file: PATH holds no text"),
    ("hi".encode("utf-16"), "--prompt-file: PATH is UTF-16 text (it starts with UTF-16's byte order mark)"),
    ("FOLDER", "--prompt-file: cannot read PATH: Is a directory")])
def test_a_bad_prompt_file_is_one_line_before_loading(no_loading, capsys, tmp_path, content, says):
    path = tmp_path / "prompt.txt"
    if content == "FOLDER":
        path = tmp_path
    elif content is not None:
        path.write_bytes(content)
    one_line_error(capsys, ["generate", "--prompt-file", str(path)], says.replace("PATH", str(path)))
    if content is None and os.path.exists("/dev/zero"):  # endless: read as far as the limit only
        one_line_error(capsys, ["generate", "--prompt-file", "/dev/zero"],
                       "--prompt-file: /dev/zero is larger than 64 MiB")


def test_a_byte_order_mark_is_no_part_of_a_files_text(tmp_path):
    from anyspec.cli.options import read_text

    path = tmp_path / "bom.txt"
    path.write_bytes("\ufeffCafé".encode())
    assert read_text(path, "--prompt-file") == "Café"


def test_a_prediction_file_is_taken_where_the_answer_repeats_it(tiny_dirs, capsys, tmp_path):
    common = ["generate", "--target", tiny_dirs["target"], "--no-draft", "--prompt", "def add(a, b):",
              "--max-new-tokens", "24", "--dtype", "fp32", "--json"]
    assert main(common) == 0
    alone = json.loads(capsys.readouterr().out)
    assert "prediction_accepted" not in alone["stats"] and alone["stats"]["algorithm"] == "none"
    predicted = tmp_path / "answer.txt"
    predicted.write_text(alone["text"], encoding="utf-8")
    assert main([*common, "--prediction-file", str(predicted)]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["token_ids"] == alone["token_ids"] and got["stats"]["algorithm"] == "ngram"
    assert got["stats"]["prediction_accepted"] > 12 and got["stats"]["rounds"] < alone["stats"]["rounds"] / 2
    assert got["stats"]["prediction_tokens"] > 12
    one_line_error(capsys, [*common, "--prediction-file", str(tmp_path / "none.txt")],
                   "--prediction-file: cannot read")
    one_line_error(capsys, ["generate", "--prompt-file", "-", "--prediction-file", "-"],
                   "--prompt-file and --prediction-file cannot both read standard input")


def test_the_stats_line_counts_the_draft_only_where_one_ran():
    from anyspec.cli.generate import stats_line
    from anyspec.config import SpeculativeConfig
    from anyspec.engine.output import GenerationResult
    from anyspec.engine.stats import Stats

    lookup_alone = Stats(algorithm="none", rounds=2, generated=7, accepted_hist=[0] * 6, ngram_proposed=6,
                         ngram_accepted=6)
    line = stats_line(GenerationResult("x", [1] * 7, "length", lookup_alone), SpeculativeConfig(), False)
    assert line.startswith("[target only] 7 tokens in ") and "rounds 2; " in line
    assert "drafted" not in line and "histogram" not in line and "prompt lookup accepted 6/6" in line
    drafted = Stats(algorithm="slem", rounds=1, drafted=5, accepted=1, generated=1, accepted_hist=[0, 1, 0])
    line = stats_line(GenerationResult("x", [1], "stop", drafted), SpeculativeConfig(adaptive_k=True), False)
    assert line.startswith("[slem k<=5] 1 token in ")
    assert "drafted 5, accepted 1 (20.0%)" in line and "histogram 0:0 1:1 2:0" in line
