"""The prompt sets beside code and prose (edit, doc, long, chat), conversations in the bench's
rotation, and the timing columns, all without a model."""

import json
import re
from types import SimpleNamespace

import pytest

from anyspec.bench import prompts as bench_prompts
from anyspec.bench import report
from anyspec.bench import run as bench_run
from anyspec.bench.context import BenchSettings
from anyspec.bench.timing import engine_timings, llama_timings
from anyspec.engine.loop import Stats
from anyspec.errors import ConfigError


@pytest.mark.parametrize("name", bench_prompts.SETS)
def test_every_shipped_set_loads_through_the_bench_checks(name):
    path = bench_prompts.PROMPTS_DIR / f"{name}.jsonl"
    lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    assert all(isinstance(json.loads(line), dict) for line in lines)
    rows = bench_prompts.load_prompts(path)
    assert len(rows) == len(lines) and len({r["id"] for r in rows}) == len(rows)
    assert all(r["set"] == name for r in rows)


def test_the_new_sets_are_not_in_the_default_run():
    assert [p.stem for p in bench_prompts.DEFAULT_PROMPTS] == ["code", "prose"]


def test_edit_prompts_paste_a_file_of_60_to_200_lines():
    rows = bench_prompts.load_prompts(bench_prompts.PROMPTS_DIR / "edit.jsonl")
    assert len(rows) >= 6
    for r in rows:
        blocks = re.findall(r"```\w+\n(.*?)```", r["prompt"][-1]["content"], re.S)
        assert len(blocks) == 1 and 60 <= blocks[0].count("\n") <= 200, r["id"]
        assert blocks[0] in r["prediction"] and len(r["prediction"]) < len(blocks[0]) + 20  # the file, fenced


def test_doc_and_long_prompts_are_long_and_chat_has_4_to_6_turns():
    docs = bench_prompts.load_prompts(bench_prompts.PROMPTS_DIR / "doc.jsonl")
    long = bench_prompts.load_prompts(bench_prompts.PROMPTS_DIR / "long.jsonl")
    assert len(docs) >= 6 and len(long) >= 4
    # at least ~1,000 tokens: English prose runs at about 4-5 characters a token
    assert all(len(r["prompt"][-1]["content"]) > 5000 for r in docs + long)
    chats = bench_prompts.load_prompts(bench_prompts.PROMPTS_DIR / "chat.jsonl")
    assert chats and all(4 <= len(r["turns"]) <= 6 for r in chats)
    assert all(r["prompt"][-1] == {"role": "user", "content": r["turns"][0]} for r in chats)


def test_bad_conversations_are_one_line_errors(tmp_path):
    bad = tmp_path / "c.jsonl"
    for line, match in (({"id": "a", "turns": ["only one"]}, "at least two"),
                        ({"id": "a", "turns": ["x", ""]}, "at least two non-empty"),
                        ({"id": "a", "turns": ["x", "y"], "system": 3}, "'system' must be"),
                        ({"id": "a", "turns": ["x", "y"], "messages": []}, "a prompt or a conversation")):
        bad.write_text(json.dumps(line) + "\n")
        with pytest.raises(ConfigError, match=rf"c.jsonl:1: .*{match}"):
            bench_prompts.load_prompts(bad)


def test_a_conversation_feeds_each_answer_back_before_the_next_turn():
    p = {"id": "c", "set": "chat", "turns": ["one", "two", "three"],
         "prompt": [{"role": "system", "content": "S"}, {"role": "user", "content": "one"}]}
    seen = []

    def answer(messages):
        seen.append(messages)
        return {"text": f"answer {len(seen)}"}

    got = list(bench_prompts.conversation(p, answer))
    assert [rid for rid, _, _ in got] == ["c/1", "c/2", "c/3"]
    assert seen[2] == [{"role": "system", "content": "S"}, {"role": "user", "content": "one"},
                       {"role": "assistant", "content": "answer 1"}, {"role": "user", "content": "two"},
                       {"role": "assistant", "content": "answer 2"}, {"role": "user", "content": "three"}]
    single = {"id": "x", "set": "code", "prompt": [{"role": "user", "content": "hi"}]}
    assert [rid for rid, _, _ in bench_prompts.conversation(single, answer)] == ["x"]


def test_conversations_run_turn_by_turn_in_each_method_with_the_prefix_cache_after_the_first(monkeypatch):
    calls = []

    def fake(name):
        def runner(ctx, prompt):
            calls.append((name, len(prompt), ctx.prefix_cache))
            return {"ids": [1, 2, len(prompt)], "text": f"reply to {len(prompt)}", "seconds": 0.5,
                    "drafted": None, "accepted": None}
        return runner

    monkeypatch.setitem(bench_run.RUNNERS, "target", fake("target"))
    monkeypatch.setitem(bench_run.RUNNERS, "target-ngram", fake("target-ngram"))
    ctx = SimpleNamespace(max_new_tokens=8, prefix_cache=False, target=None)
    chat = {"id": "c", "set": "chat", "turns": ["a", "b", "c"], "prompt": [{"role": "user", "content": "a"}]}
    single = {"id": "s", "set": "code", "prompt": [{"role": "user", "content": "hi"}]}
    runs = bench_run._run_all(ctx, [chat, single], ["target", "target-ngram"], {}, lambda *a: None)
    turns = [c for c in calls[2:] if c[1] in (1, 3, 5)][:6]  # past the warm-ups: the conversation
    assert turns == [("target", 1, False), ("target", 3, True), ("target", 5, True),
                     ("target-ngram", 1, False), ("target-ngram", 3, True), ("target-ngram", 5, True)]
    assert calls[-1][2] is False and ctx.prefix_cache is False  # a single prompt after it: no cache
    rows = {(r["method"], r["prompt"]): r for r in runs}
    assert rows["target-ngram", "c/3"]["turn"] == 3 and rows["target-ngram", "c/3"]["conversation"] == "c"
    assert all(rows["target-ngram", rid]["identical"] for rid in ("c/1", "c/2", "c/3", "s"))


def test_engine_timings_split_prefill_first_token_and_decode():
    stats = Stats(prompt_tokens=100, prompt_cached=40, prefill_seconds=0.5, first_token_seconds=0.8,
                  first_tokens=3, generated=33, total_seconds=2.3)
    t = engine_timings(stats)
    assert (t["ttft"], t["prefill_tokens"], t["prefill_seconds"]) == (0.8, 59, 0.5)  # the last row: verify's
    assert t["decode_tokens"] == 30 and t["decode_seconds"] == pytest.approx(1.5)
    none = engine_timings(Stats(prompt_tokens=5))
    assert none["ttft"] is None and none["decode_tokens"] is None


def test_llama_timings_need_every_field():
    assert llama_timings({"prompt_n": 3, "prompt_ms": None, "predicted_n": 2, "predicted_ms": 1.0}) == {}
    t = llama_timings({"prompt_n": 200, "prompt_ms": 500.0, "predicted_n": 11, "predicted_ms": 250.0})
    assert (t["ttft"], t["prefill_tokens"], t["decode_tokens"], t["decode_seconds"]) == (0.5, 200, 10, 0.25)


def test_summary_and_table_carry_the_timing_columns():
    def row(method, prompt, **kw):
        return {"method": method, "prompt": prompt, "set": "chat", "ids": [1] * 10, "seconds": 2.0,
                "drafted": None, "accepted": None, **kw}

    timed = {"prefill_tokens": 100, "prefill_seconds": 0.5, "decode_tokens": 9, "decode_seconds": 1.0}
    runs = [row("target", "c/1", ttft=0.4, turn=1, conversation="c", **timed),
            row("target", "c/2", ttft=0.1, turn=2, conversation="c", **timed),
            row("hf-target", "c/1", identical=True), row("hf-target", "c/2", identical=True)]
    rows = {(r["set"], r["method"]): r for r in report.summarize(runs)}
    t = rows["chat", "target"]
    assert (t["ttft_ms"], t["prefill_tokens_per_second"]) == (250.0, 200.0)
    assert t["decode_tokens_per_second"] == 9.0
    assert (t["ttft_ms_first_turn"], t["ttft_ms_later_turns"]) == (400.0, 100.0)
    assert rows["chat", "hf-target"]["ttft_ms"] is None
    table = report.markdown({"config": {"target": "t", "draft": "d", "dtype": "fp32", "k": 4,
                                        "max_new_tokens": 8, "threads": 2, "temperature": 0.7},
                             "notes": {}, "runs": runs, "summary": report.summarize(runs)})
    assert "| chat | target | 20 | 5.00 | - | 250 | 200.0 | 9.00 | 4.00 |" in table
    assert "| chat | hf-target | 20 | 5.00 | 1.00x (target) | - | - | - | 4.00 |" in table
    assert "| chat | target | 400 | 100 | 0.25 |" in table


def test_a_conversations_longest_request_counts_every_turn_and_answer(monkeypatch):
    monkeypatch.setattr(bench_prompts, "prompt_ids", lambda tok, messages: [0] * (10 * len(messages)))
    chat = {"id": "c", "set": "chat", "turns": ["a", "b", "c"], "prompt": [{"role": "user", "content": "a"}]}
    assert bench_prompts.longest_request(None, chat, 100) == 30 + 2 * 108
    single = {"id": "s", "set": "code", "prompt": [{"role": "user", "content": "hi"}]}
    assert bench_prompts.longest_request(None, single, 100) == 10


def test_prompts_name_a_shipped_set_unless_a_file_has_that_name(tmp_path, monkeypatch):
    assert bench_prompts.prompt_file("edit") == bench_prompts.PROMPTS_DIR / "edit.jsonl"
    assert str(bench_prompts.prompt_file("mine.jsonl")) == "mine.jsonl"
    monkeypatch.chdir(tmp_path)
    (tmp_path / "chat").write_text("")
    assert str(bench_prompts.prompt_file("chat")) == "chat"


def test_a_conversation_set_end_to_end_on_tiny_models(tmp_path, tok_qwen2, tok_smollm2):
    from test_bench import tiny_pair

    target, draft, _ = tiny_pair(tmp_path, tok_qwen2, tok_smollm2, ["unused"])
    chat = tmp_path / "chat.jsonl"
    turns = ["Hello.", "Again.", "Once more."]
    chat.write_text(json.dumps({"id": "c", "system": "Be brief.", "turns": turns}) + "\n")
    settings = BenchSettings(str(target), str(draft), [chat], ["target", "anyspec-greedy", "hf-target"],
                             max_new_tokens=4, dtype="fp32")
    result = bench_run.run_bench(settings, log=lambda s: None)
    rows = {(r["method"], r["prompt"]): r for r in result["runs"]}
    assert set(rows) == {(m, f"c/{n}") for m in ("target", "anyspec-greedy", "hf-target") for n in (1, 2, 3)}
    for n in (1, 2, 3):
        r = rows["anyspec-greedy", f"c/{n}"]
        assert r["turn"] == n and r["conversation"] == "c" and "identical" in r
        assert 0 < r["ttft"] <= r["seconds"] and 0 < r["prefill_seconds"] <= r["ttft"]
        assert r["prefill_tokens"] == r["prompt_tokens"] - r["prompt_cached"] - 1
        assert 0 <= r["decode_tokens"] <= len(r["ids"]) - 1  # the first commit's tokens are not decode's
        assert "ttft" not in rows["hf-target", f"c/{n}"]  # transformers' generate reports no such times
    # each turn holds the earlier ones and their answers
    assert rows["target", "c/1"]["prompt_tokens"] < rows["target", "c/2"]["prompt_tokens"] < \
        rows["target", "c/3"]["prompt_tokens"]
    summary = {(r["set"], r["method"]): r for r in result["summary"]}
    assert summary["chat", "anyspec-greedy"]["ttft_ms_first_turn"] > 0
    assert summary["chat", "hf-target"]["ttft_ms"] is None
    assert "| chat | anyspec-greedy |" in report.markdown(result)


def test_json_prompts_carry_schemas_the_grammar_takes():
    pytest.importorskip("llguidance")
    from anyspec.engine.grammar_text import check_grammar, schema_grammar

    rows = bench_prompts.load_prompts(bench_prompts.PROMPTS_DIR / "json.jsonl")
    assert len(rows) >= 6 and all(r["schema"]["type"] == "object" for r in rows)
    for r in rows:
        check_grammar(schema_grammar(r["schema"], r["id"]), r["id"])
    code = bench_prompts.load_prompts(bench_prompts.PROMPTS_DIR / "code.jsonl")
    assert all(r["schema"] is None for r in code)


def test_a_schema_is_refused_by_methods_that_cannot_follow_it():
    ctx = SimpleNamespace(prefix_cache=False)
    p = {"id": "j", "set": "json", "prompt": [{"role": "user", "content": "hi"}],
         "schema": {"type": "object"}}
    with pytest.raises(ConfigError, match="only anyspec's methods"):
        bench_run.run_turn(ctx, "llama.cpp", p["prompt"], p)


def test_the_bench_help_names_every_shipped_set():
    from anyspec.cli.commands import build_parser

    sub = next(a for a in build_parser()._actions if a.dest == "command").choices["bench"]
    text = " ".join(next(a for a in sub._actions if a.dest == "prompts").help.split())
    assert all(name in text.split(": ", 1)[1] for name in bench_prompts.SETS), text

