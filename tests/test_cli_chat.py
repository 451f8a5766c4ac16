"""``anyspec chat`` on tiny models: each line a user message, each answer the engine's for the whole
conversation so far, ``/reset`` starting over, a turn beyond the context said in one line."""

from __future__ import annotations

import io

import pytest

from anyspec.cli import main
from anyspec.config import SamplingParams

SYSTEM = "You are terse."


def chat(folders, monkeypatch, capsys, lines: str | bytes, *extra: str) -> tuple[int, str, str]:
    raw = lines if isinstance(lines, bytes) else lines.encode()
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(raw), encoding="utf-8"))
    rc = main(["chat", "--target", str(folders[0]), "--draft", str(folders[1]), "--dtype", "fp32",
               "--draft-dtype", "fp32", "--system", SYSTEM, *extra])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_each_answer_is_the_engines_for_the_conversation_so_far(folders, reference, monkeypatch, capsys):
    lines = "Name a prime.\n\n/help\nAnd another?\n/reset\nName a prime.\n"
    rc, out, err = chat(folders, monkeypatch, capsys, lines, "--max-new-tokens", "10", "--temperature", "1",
                        "--seed", "3")
    params = SamplingParams(temperature=1.0, seed=3, max_new_tokens=10)
    system = {"role": "system", "content": SYSTEM}
    first = [system, {"role": "user", "content": "Name a prime."}]
    a1 = reference.generate(first, params).text
    second = [*first, {"role": "assistant", "content": a1}, {"role": "user", "content": "And another?"}]
    a2 = reference.generate(second, params).text
    assert a2 != reference.generate([system, second[-1]], params).text  # the answer reads the turns before
    assert rc == 0 and out == f"{a1}\n{a2}\n{a1}\n"
    assert err.count("tok/s, acceptance") == 3 and "(a new conversation)" in err
    assert "anyspec chat: /help is not a command; /reset starts a new conversation" in err  # not sent


def test_each_turn_renders_and_encodes_the_conversation_once(folders, reference, monkeypatch, capsys):
    """The conversation goes through the target's chat template and tokenizer once a turn: the ids
    that measure the room left are those the engine reads."""
    import anyspec.pair

    calls = {"apply_chat_template": 0, "encode": 0}
    load = anyspec.pair.load_pair

    def counted(plan, *args, **kwargs):
        pair = load(plan, *args, **kwargs)
        tokenizer = pair.target.tokenizer
        for name in calls:
            setattr(tokenizer, name, counting(getattr(tokenizer, name), name))
        return pair

    def counting(method, name):
        def call(*args, **kwargs):
            calls[name] += SYSTEM in str(args[0])  # the conversation, not the pieces SLEM re-encodes
            return method(*args, **kwargs)
        return call

    monkeypatch.setattr(anyspec.pair, "load_pair", counted)
    rc, out, _ = chat(folders, monkeypatch, capsys, "Name a prime.\nAnd another?\n", "--max-new-tokens", "4")
    system = {"role": "system", "content": SYSTEM}
    first = [system, {"role": "user", "content": "Name a prime."}]
    a1 = reference.generate(first, SamplingParams(max_new_tokens=4)).text
    second = [*first, {"role": "assistant", "content": a1}, {"role": "user", "content": "And another?"}]
    a2 = reference.generate(second, SamplingParams(max_new_tokens=4)).text
    assert rc == 0 and out == f"{a1}\n{a2}\n"
    assert calls == {"apply_chat_template": 2, "encode": 2}


def test_a_turn_beyond_the_context_is_one_line_and_the_session_goes_on(folders, reference, monkeypatch,
                                                                       capsys):
    too_long = "word " * 300
    rc, out, err = chat(folders, monkeypatch, capsys, f"{too_long}\nName a prime.\n/exit\nnever read\n",
                        "--max-new-tokens", "6")
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Name a prime."}]
    want = reference.generate(messages, SamplingParams(max_new_tokens=6)).text
    assert rc == 0 and out == f"{want}\n"
    said = [line for line in err.splitlines() if line.startswith("anyspec chat:")]
    assert len(said) == 1 and "no room left in the target's context of 256 tokens" in said[0]
    assert said[0].endswith("/reset starts a new conversation")


def test_a_turn_near_the_context_gets_the_room_left(folders, reference, monkeypatch, capsys):
    """The conversation leaves fewer tokens than --max-new-tokens: the answer gets those, as the
    target alone gives it with that many, and the next turn is refused in one line."""
    from anyspec.engine.prompt import encode_prompt

    long = "word " * 220
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": long}]
    room = 256 - len(encode_prompt(reference.target.tokenizer, messages)[0])
    assert 0 < room < 40
    rc, out, err = chat(folders, monkeypatch, capsys, f"{long}\nmore\n", "--max-new-tokens", "40",
                        "--ignore-eos")
    want = reference.generate(messages, SamplingParams(max_new_tokens=room, ignore_eos=True)).text
    assert rc == 0 and out == f"{want}\n"
    assert f"[context full; {room} tokens" in err
    said = [line for line in err.splitlines() if line.startswith("anyspec chat:")]
    assert len(said) == 1 and "no room left in the target's context of 256 tokens" in said[0]


def test_a_line_that_is_not_utf8_is_refused_and_the_session_goes_on(folders, reference, monkeypatch, capsys):
    rc, out, err = chat(folders, monkeypatch, capsys, b"caf\xe9\nName a prime.\n", "--max-new-tokens", "4")
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Name a prime."}]
    want = reference.generate(messages, SamplingParams(max_new_tokens=4)).text
    said = [line for line in err.splitlines() if line.startswith("anyspec chat:")]
    assert rc == 0 and out == f"{want}\n" and len(said) == 1
    assert said[0].startswith("anyspec chat: the prompt is not valid UTF-8")
    assert said[0].endswith("the line was not sent")


@pytest.mark.parametrize(("extra", "message"), [(["--temperature", "-1"], "temperature"),
                                                (["--system", " "], "--system is empty")])
def test_bad_settings_fail_before_loading(no_loading, capsys, extra, message):
    assert main(["chat", *extra]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_ctrl_c_stops_an_answer_and_the_conversation_goes_on_from_what_was_shown(folders, reference,
                                                                                 monkeypatch, capsys):
    """SIGINT after the first piece of the first answer: the answer stops there (its statistics line
    begins '[stopped; '), the text shown is the assistant's turn, and the next answer is the
    engine's for that conversation (the caches kept from the stopped turn hold nothing it did not
    commit)."""
    import os
    import signal

    from anyspec.engine import Engine

    real, calls = Engine.stream, []

    def interrupted(self, prompt, params=None, stop=None, **kwargs):
        inner = real(self, prompt, params, stop, **kwargs)
        calls.append(prompt)
        if len(calls) > 1:
            return inner

        def first_then_ctrl_c():
            yield next(inner)
            os.kill(os.getpid(), signal.SIGINT)
            return (yield from inner)
        return first_then_ctrl_c()

    monkeypatch.setattr(Engine, "stream", interrupted)
    rc, out, err = chat(folders, monkeypatch, capsys, "Name a prime.\nAnd another?\n",
                        "--max-new-tokens", "40")
    params = SamplingParams(max_new_tokens=40)
    system = {"role": "system", "content": SYSTEM}
    first = [system, {"role": "user", "content": "Name a prime."}]
    shown, second_answer = out.split("\n", 1)
    full = reference.generate(first, params).text
    assert rc == 0 and shown and full.startswith(shown) and shown != full
    assert err.count("[stopped; ") == 1 and err.count("tok/s, acceptance") == 2
    second = [*first, {"role": "assistant", "content": shown}, {"role": "user", "content": "And another?"}]
    assert calls[1] == second and second_answer == reference.generate(second, params).text + "\n"


def test_a_context_below_the_default_new_tokens_is_a_chat_of_short_answers(folders, reference, monkeypatch,
                                                                          capsys):
    """``--max-new-tokens`` (512 by default) is the most an answer gets: a context that holds fewer
    starts the chat all the same, each answer getting the room left (``--max-model-len 96``)."""
    from anyspec.engine.prompt import encode_prompt

    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Name a prime."}]
    room = 96 - len(encode_prompt(reference.target.tokenizer, messages)[0])
    rc, out, err = chat(folders, monkeypatch, capsys, "Name a prime.\n", "--max-model-len", "96",
                        "--ignore-eos")
    want = reference.generate(messages, SamplingParams(max_new_tokens=room, ignore_eos=True)).text
    assert rc == 0 and out == f"{want}\n" and f"[context full; {room} tokens" in err

