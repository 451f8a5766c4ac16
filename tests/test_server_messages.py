"""Anthropic's Messages API (``POST /v1/messages``) over real HTTP on tiny random-weight models with
real tokenizers: each answer is the engine's (or the chat endpoint's) for the same conversation,
whole or streamed, and bad requests are 400s in Anthropic's error form."""

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

from live_server import CHAT, MODEL_NAME, greedy, live_server, load_engine, one_thread  # noqa: E402, F401
from test_linear import needs_rowwise  # noqa: E402


def ask(server, **body):
    r = httpx.post(server + "/v1/messages", json={"model": MODEL_NAME, "temperature": 0} | body, timeout=120)
    return r.status_code, r.json()


def streamed(server, **body) -> list[tuple[str, dict]]:
    """The stream's events, ``(name, data)``."""
    with httpx.stream("POST", server + "/v1/messages", timeout=120,
                      json={"model": MODEL_NAME, "temperature": 0, "stream": True} | body) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        text = r.read().decode()
    out = []
    for block in text.strip().split("\n\n"):
        name, data = block.split("\n")
        out.append((name.removeprefix("event: "), json.loads(data.removeprefix("data: "))))
    assert all(data["type"] == name for name, data in out)
    return out


def test_a_message_is_the_engines_answer_to_the_conversation(server, reference):
    status, out = ask(server, system="You are terse.", max_tokens=8,
                      messages=[{"role": "user", "content": [{"type": "text", "text": "Name a prime."}]}])
    alone = reference.generate(CHAT, greedy(8))
    assert status == 200 and out["type"] == "message" and out["role"] == "assistant"
    assert out["id"].startswith("msg_") and out["model"] == MODEL_NAME
    assert out["content"] == [{"type": "text", "text": alone.text}]
    assert out["stop_reason"] == ("max_tokens" if alone.finish_reason == "length" else "end_turn")
    usage = out["usage"]
    assert usage["input_tokens"] + usage["cache_read_input_tokens"] == alone.stats.prompt_tokens
    assert usage["cache_creation_input_tokens"] == 0  # Anthropic's client adds all three
    assert usage["output_tokens"] == len(alone.token_ids) and out["anyspec"]["drafted"] > 0


def test_a_stop_sequence_ends_the_message_and_is_named(server, reference):
    question = [{"role": "user", "content": "Once upon a time"}]
    full = reference.generate(question, greedy(16)).text
    stop = full[len(full) // 2: len(full) // 2 + 2]
    assert stop.strip(), f"pick a visible stop string from {full!r}"
    status, out = ask(server, max_tokens=16, stop_sequences=[stop, "never-seen"], messages=question)
    assert status == 200 and out["content"][0]["text"] == full[:full.index(stop)]
    assert out["stop_reason"] == "stop_sequence" and out["stop_sequence"] == stop
    events = streamed(server, max_tokens=16, stop_sequences=[stop], messages=question)
    assert events[-2][1]["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": stop}
    _, plain = ask(server, max_tokens=16, messages=question)
    assert plain["stop_sequence"] is None and plain["content"][0]["text"] == full


def test_a_streamed_message_gives_the_whole_answer_in_its_events(server, reference):
    events = streamed(server, max_tokens=12, system="You are terse.",
                      messages=[{"role": "user", "content": "Name a prime."}])
    alone = reference.generate(CHAT, greedy(12))
    names = [name for name, _ in events]
    assert names[:2] == ["message_start", "content_block_start"] and names[-3:] == [
        "content_block_stop", "message_delta", "message_stop"]
    deltas = [data["delta"]["text"] for name, data in events if name == "content_block_delta"]
    assert len(deltas) > 1 and "".join(deltas) == alone.text
    start, end = events[0][1]["message"], events[-2][1]
    assert start["content"] == [] and start["stop_reason"] is None
    assert end["delta"]["stop_reason"] == ("max_tokens" if alone.finish_reason == "length" else "end_turn")
    assert end["usage"]["output_tokens"] == len(alone.token_ids)


@needs_rowwise
def test_message_start_counts_the_prompt_tokens_read_from_the_prefix_cache(folders):
    """On a row-invariant model (int8, the lean stack) a streamed message's first event already splits
    its prompt into ``input_tokens`` and ``cache_read_input_tokens``, as its ``message_delta`` does."""
    with live_server(load_engine(*folders, dtype="int8"), queue_size=4) as (url, _):
        turns = [streamed(url, max_tokens=4, system="You are terse.", messages=[
            {"role": "user", "content": question}]) for question in ("Name a prime.", "Name an even number.")]
    usage = [(events[0][1]["message"]["usage"], events[-2][1]["usage"]) for events in turns]
    for start, end in usage:
        assert {k: start[k] for k in ("input_tokens", "cache_read_input_tokens")} == {
            k: end[k] for k in ("input_tokens", "cache_read_input_tokens")}
        assert start["output_tokens"] == 0 < end["output_tokens"]
    assert usage[0][0]["cache_read_input_tokens"] == 0 < usage[1][0]["cache_read_input_tokens"]


def test_tool_use_and_tool_result_blocks_are_the_chats_calls_and_tool_messages(server):
    call = {"city": "Oslo"}
    blocks = [{"role": "user", "content": "Weather in Oslo?"},
              {"role": "assistant", "content": [{"type": "text", "text": "Let me look."}, {
                  "type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": call}]},
              {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                            "content": [{"type": "text", "text": "12 C and rain"}]},
                                           {"type": "text", "text": "Is that cold?"}]}]
    messages = [{"role": "user", "content": "Weather in Oslo?"},
                {"role": "assistant", "content": "Let me look.", "tool_calls": [{
                    "id": "toolu_1", "type": "function",
                    "function": {"name": "get_weather", "arguments": json.dumps(call)}}]},
                {"role": "tool", "tool_call_id": "toolu_1", "content": "12 C and rain"},
                {"role": "user", "content": "Is that cold?"}]
    status, out = ask(server, max_tokens=10, messages=blocks)
    chat = httpx.post(server + "/v1/chat/completions", timeout=120, json={
        "model": MODEL_NAME, "temperature": 0, "max_tokens": 10, "messages": messages}).json()
    assert status == 200 and out["content"][0]["text"] == chat["choices"][0]["message"]["content"]
    def prompt(usage: dict) -> int:
        return usage["input_tokens"] + usage["cache_read_input_tokens"]

    assert prompt(out["usage"]) == chat["usage"]["prompt_tokens"]
    bare = ask(server, max_tokens=10, messages=blocks[:1])[1]
    assert prompt(bare["usage"]) < chat["usage"]["prompt_tokens"]


def test_output_config_format_holds_the_answer_to_the_schema(server):
    pytest.importorskip("llguidance")
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}},
              "required": ["n"], "additionalProperties": False}
    question = [{"role": "user", "content": "A digit as JSON."}]
    status, out = ask(server, max_tokens=16, messages=question,
                      output_config={"format": {"type": "json_schema", "schema": schema}})
    assert status == 200 and 0 <= json.loads(out["content"][0]["text"])["n"] <= 9
    _, free = ask(server, max_tokens=16, messages=question)
    assert free["content"][0]["text"] != out["content"][0]["text"]


@pytest.mark.parametrize(("body", "says"), [
    ({"max_tokens": None}, "'max_tokens' is required"),
    ({"max_tokens": 0}, "'max_tokens' must be at least 1"),
    ({"temperature": 1.5}, "'temperature' must be between 0 and 1, got 1.5"),
    ({"temperature": -0.1}, "'temperature' must be between 0 and 1, got -0.1"),
    ({"messages": []}, "'messages' must be a non-empty array"),
    ({"messages": [{"role": "user", "content": []}]}, "'messages[0].content' is empty"),
    ({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": []},
                   {"role": "user", "content": "hi"}]}, "'messages[1].content' is empty"),
    ({"messages": [{"role": "user", "content": [{"type": "text"}]}]},
     "'messages[0].content[0].text' must be a string"),
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]},
     "'messages[0].content[0].type' must be text or tool_result in a user message"),
    ({"messages": [{"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f"}]}]},
     "an object 'input'"),
    ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "runs no server tools"),
    ({"tool_choice": {"type": "some"}}, "'tool_choice.type' must be auto, any, tool or none"),
    ({"tool_choice": {"type": "any"}}, "'tool_choice' of type any needs 'tools'"),
    ({"thinking": {"type": "enabled", "budget_tokens": 1024}}, "'thinking' is not supported"),
    ({"n": 8}, "'n' is not supported"),
    ({"n": True}, "'n' is not supported"),
    ({"stop_sequences": [1]}, "'stop_sequences': expected a string or an array of strings"),
    ({"output_config": {"format": {"type": "json_schema", "schema": {"type": "nope"}}}},
     "'output_config.format.schema' cannot be used"),
    ({"tools": [{"name": "f", "input_schema": {"type": "nope"}}]}, "tools[0].input_schema"),
    ({"tools": [{"name": "f", "input_schema": {"type": "object"}}, {"name": "g"}]},
     "'tools[1].input_schema' is required"),
    ({"output_config": {"format": {"type": "json_schema"}}}, "'output_config.format' must be {type: "
                                                              "'json_schema', schema}"),
    ({"messages": [{"role": "user", "content": "A dog as JSON."}, {"role": "assistant", "content": '{"a"'}],
      "output_config": {"format": {"type": "json_schema", "schema": {"type": "object"}}}},
     "'messages' (a prefilled assistant message) and 'output_config.format' cannot be used together"),
])
def test_bad_requests_are_400s_in_anthropics_form(server, body, says):
    status, out = ask(server, **{"max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]} | body)
    assert status == 400 and out["type"] == "error" and out["error"]["type"] == "invalid_request_error", out
    assert says in out["error"]["message"], out["error"]["message"]


TOOL = {"name": "f", "input_schema": {"type": "object"}}


@pytest.mark.parametrize(("body", "field"), [
    ({"system": False}, "system"), ({"system": 0}, "system"), ({"system": {}}, "system"),
    ({"tool_choice": "auto"}, "tool_choice"),
    ({"tools": [TOOL], "tool_choice": {"type": "auto", "disable_parallel_tool_use": 1}},
     "tool_choice.disable_parallel_tool_use"),
    ({"tools": [TOOL | {"description": 5}]}, "tools[0].description"),
    ({"tools": [TOOL | {"input_schema": []}]}, "tools[0].input_schema"),
    ({"metadata": "me"}, "metadata"), ({"metadata": {"user_id": 5}}, "metadata.user_id"),
    ({"service_tier": 1}, "service_tier"), ({"cache_control": "ephemeral"}, "cache_control"),
    ({"output_config": {"effort": 3}}, "output_config.effort"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t",
                                                 "is_error": "no"}]}]}, "messages[0].content[0].is_error"),
])
def test_a_wrong_type_is_a_400_naming_the_field(server, body, field):
    status, out = ask(server, **{"max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]} | body)
    said = out["error"]["message"]
    assert status == 400 and out["error"]["type"] == "invalid_request_error", out
    assert f"'{field}' must be" in said or f"Invalid type for '{field}'" in said, said


@pytest.mark.parametrize(("field", "value", "instead"), [
    ("logprobs", True, None), ("top_logprobs", 2, None), ("stop", ["x"], "stop_sequences"),
    ("max_completion_tokens", 3, "max_tokens"), ("response_format", {"type": "json_object"},
                                                 "output_config.format"),
    ("parallel_tool_calls", False, "tool_choice.disable_parallel_tool_use"),
    ("continue_final_message", True, "messages")])
def test_the_chats_own_fields_are_refused_not_run(server, field, value, instead):
    """A message carries no logprobs and has its own stop, limit and format fields: the chat's are
    refused, not silently computed or applied."""
    status, out = ask(server, max_tokens=4, messages=[{"role": "user", "content": "hi"}], **{field: value})
    assert status == 400, out
    assert f"'{field}' is a chat completions field" in out["error"]["message"], out["error"]["message"]
    assert instead is None or f"it takes '{instead}'" in out["error"]["message"]


def test_an_empty_or_null_system_is_no_system_message(server):
    question = [{"role": "user", "content": "Name a prime."}]
    _, alone = ask(server, max_tokens=4, messages=question)
    for system in (None, "", []):
        status, out = ask(server, max_tokens=4, messages=question, system=system)
        assert status == 200 and out["content"] == alone["content"], out


def test_an_empty_last_assistant_message_is_no_prefill(server):
    question = [{"role": "user", "content": "Name a prime."}]
    status, out = ask(server, max_tokens=6, messages=[*question, {"role": "assistant", "content": []}])
    assert status == 200 and out["content"] == ask(server, max_tokens=6, messages=question)[1]["content"]


def test_count_tokens_is_what_the_message_holds(server):
    tools = [{"name": "get_weather", "description": "The weather in a city",
              "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}]
    question = {"system": "You are terse.", "messages": [{"role": "user", "content": "Weather in Oslo?"}]}

    def count(**body) -> int:
        r = httpx.post(server + "/v1/messages/count_tokens", json={"model": MODEL_NAME} | body, timeout=60)
        assert r.status_code == 200, r.text
        return r.json()["input_tokens"]

    _, out = ask(server, max_tokens=2, **question)
    assert count(**question) == out["usage"]["input_tokens"] + out["usage"]["cache_read_input_tokens"]
    assert count(**question | {"system": "You are terse and kind."}) > count(**question)
    r = httpx.post(server + "/v1/messages/count_tokens", timeout=60,
                   json={"model": MODEL_NAME, "tools": tools} | question)  # a template without tools
    assert r.status_code == 400 and "no tool support" in r.json()["error"]["message"]
    r = httpx.post(server + "/v1/messages/count_tokens", json={"model": MODEL_NAME, "messages": []},
                   timeout=60)
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    long = {"messages": [{"role": "user", "content": "word " * 400}]}  # beyond the context's 256 tokens
    assert count(**long) > 256  # counted, as a client checks whether it fits
    assert ask(server, max_tokens=2, **long)[0] == 400


SCALARS = (st.none() | st.booleans() | st.integers(-3, 10**6)
           | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=6))
JSON = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=3)
                    | st.dictionaries(st.text(max_size=6), inner, max_size=3), max_leaves=8)
FIELDS = {"/v1/responses": ["input", "instructions", "max_output_tokens", "text", "tools", "tool_choice",
                            "temperature", "top_p", "reasoning", "include", "store", "stream",
                            "parallel_tool_calls", "metadata"],
          "/v1/messages": ["messages", "system", "max_tokens", "tools", "tool_choice", "stop_sequences",
                           "temperature", "top_k", "output_config", "thinking", "metadata", "stream"],
          "/v1/chat/completions": ["messages", "max_tokens", "tools", "tool_choice", "response_format",
                                   "stop", "logprobs", "top_logprobs", "n", "seed", "logit_bias",
                                   "stream_options", "guided_json", "structured_outputs", "min_tokens",
                                   "stop_token_ids"],
          "/v1/completions": ["prompt", "suffix", "echo", "logprobs", "n", "best_of", "stop", "max_tokens",
                              "guided_regex", "guided_choice", "grammar", "json_schema", "allowed_token_ids",
                              "typical_p", "top_n_sigma", "repetition_penalty"]}
VALID = {"/v1/responses": {"model": MODEL_NAME, "input": "hi", "max_output_tokens": 1},
         "/v1/messages": {"model": MODEL_NAME, "max_tokens": 1,
                          "messages": [{"role": "user", "content": "hi"}]},
         "/v1/chat/completions": {"model": MODEL_NAME, "max_tokens": 1,
                                  "messages": [{"role": "user", "content": "hi"}]},
         "/v1/completions": {"model": MODEL_NAME, "max_tokens": 1, "prompt": "hi"}}
ITEM_KEYS = ["role", "content", "type", "call_id", "name", "arguments", "output", "input", "id", "tool_calls"]
ITEM_WORDS = ["user", "assistant", "message", "text", "function_call", "tool_use"]


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.sampled_from(list(VALID)), st.data())
def test_any_value_in_any_field_is_answered_or_refused_never_a_crash(server, path, data):
    """A valid request (Messages, Responses, a chat completion or a completion) with one field (or
    one of its items) set to any JSON value: 200 or a 400, never a 500."""
    body = dict(VALID[path])
    name = data.draw(st.sampled_from(FIELDS[path]))
    value = data.draw(JSON)
    if data.draw(st.booleans()) and name in ("input", "messages", "prompt"):
        value = [data.draw(st.dictionaries(st.sampled_from(ITEM_KEYS), JSON | st.sampled_from(ITEM_WORDS),
                                           max_size=4))]
    body[name] = value
    r = httpx.post(server + path, json=body, timeout=120)
    assert r.status_code in (200, 400), (body, r.status_code, r.text)
