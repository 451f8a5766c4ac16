"""OpenAI's Responses API (``POST /v1/responses``) over real HTTP, driven by the official ``openai``
client, on tiny random-weight models with real tokenizers: each answer is the engine's for the same
conversation, whole or streamed, a stored response continues as its whole conversation would, and
bad fields are 400s naming the Responses field."""

import copy
import json
import time

import pytest

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

from live_server import CHAT, MODEL_NAME, greedy, live_server, load_engine, one_thread  # noqa: E402, F401
from test_linear import needs_rowwise  # noqa: E402
from tiny_models import CHATML, save_tiny_model  # noqa: E402

from anyspec.engine import SamplingParams  # noqa: E402
from anyspec.server.response_store import Api  # noqa: E402


def test_a_response_is_the_engines_answer_to_the_conversation(client, reference):
    out = client.responses.create(model=MODEL_NAME, instructions="You are terse.", input="Name a prime.",
                                  max_output_tokens=8, temperature=0)
    alone = reference.generate(CHAT, greedy(8))
    assert out.object == "response" and out.id.startswith("resp_") and out.model == MODEL_NAME
    assert out.output_text == alone.text and len(out.output) == 1
    assert out.output[0].type == "message" and out.output[0].role == "assistant"
    assert out.usage.input_tokens == alone.stats.prompt_tokens
    assert out.usage.output_tokens == len(alone.token_ids)
    assert out.usage.total_tokens == out.usage.input_tokens + out.usage.output_tokens
    cut = alone.finish_reason == "length"
    assert out.status == ("incomplete" if cut else "completed")
    assert out.output[0].status == out.status
    details = out.incomplete_details
    assert (details is not None and details.reason == "max_output_tokens") == cut
    assert out.model_extra["anyspec"]["drafted"] > 0
    items = client.responses.create(model=MODEL_NAME, max_output_tokens=8, temperature=0, input=[
        {"role": "developer", "content": "You are terse."},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Name a prime."}]}])
    assert items.output_text == alone.text
    codex = client.responses.create(model=MODEL_NAME, instructions="You are terse.", input="Name a prime.",
                                    max_output_tokens=8, temperature=0, store=False,
                                    reasoning={"effort": "medium", "summary": "auto"},
                                    include=["reasoning.encrypted_content"])
    assert codex.output_text == alone.text  # no reasoning to do or to include


def test_a_streamed_response_gives_the_whole_answer_in_typed_events(client, reference):
    events = list(client.responses.create(model=MODEL_NAME, input=CHAT, max_output_tokens=12, temperature=0,
                                          stream=True))
    alone = reference.generate(CHAT, greedy(12))
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done",
                          "response.output_item.done",
                          "response.incomplete" if alone.finish_reason == "length" else "response.completed"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert len(deltas) > 1 and "".join(deltas) == alone.text == events[-4].text
    final = events[-1].response
    assert final.output_text == alone.text and final.usage.output_tokens == len(alone.token_ids)
    assert final.id == events[0].response.id and events[0].response.status == "in_progress"


def test_sampled_responses_follow_the_seed_and_extensions_pass_through(client, reference):
    kw = dict(model=MODEL_NAME, input=CHAT, max_output_tokens=10, temperature=0.9, top_p=0.95)
    a = client.responses.create(**kw, extra_body={"seed": 3, "top_k": 40}).output_text
    off = client.responses.create(**kw, extra_body={"seed": 3, "top_k": 40, "speculative": False})
    assert a == off.output_text == reference.generate(CHAT, SamplingParams(
        temperature=0.9, top_p=0.95, top_k=40, max_new_tokens=10, seed=3)).text
    assert off.model_extra["anyspec"]["speculative"] is False


def test_function_call_items_are_the_chats_tool_calls_and_tool_messages(client):
    """A conversation with a call and its output, as Responses items and as chat messages: the same
    answer."""
    call = {"city": "Oslo"}
    items = [{"role": "user", "content": "Weather in Oslo?"},
             {"type": "function_call", "call_id": "call_1", "name": "get_weather",
              "arguments": json.dumps(call)},
             {"type": "function_call_output", "call_id": "call_1", "output": "12 C and rain"}]
    messages = [{"role": "user", "content": "Weather in Oslo?"},
                {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function",
                 "function": {"name": "get_weather", "arguments": json.dumps(call)}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "12 C and rain"}]
    got = client.responses.create(model=MODEL_NAME, input=items, max_output_tokens=10, temperature=0)
    chat = client.chat.completions.create(model=MODEL_NAME, messages=messages, max_tokens=10, temperature=0)
    assert got.output_text == chat.choices[0].message.content
    assert got.usage.input_tokens == chat.usage.prompt_tokens
    bare = client.responses.create(model=MODEL_NAME, input=items[:1], max_output_tokens=10, temperature=0)
    assert bare.usage.input_tokens < got.usage.input_tokens


def test_text_format_holds_the_answer_to_the_schema(client):
    pytest.importorskip("llguidance")
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}},
              "required": ["n"], "additionalProperties": False}
    out = client.responses.create(model=MODEL_NAME, input="A digit as JSON.", max_output_tokens=16,
                                  temperature=0, text={"format": {"type": "json_schema", "name": "digit",
                                                                  "schema": schema, "strict": True}})
    assert 0 <= json.loads(out.output_text)["n"] <= 9
    assert out.text.format.type == "json_schema"
    chat = client.chat.completions.create(
        model=MODEL_NAME, messages=[{"role": "user", "content": "A digit as JSON."}], max_tokens=16,
        temperature=0, response_format={"type": "json_schema",
                                        "json_schema": {"name": "digit", "schema": schema}})
    assert out.output_text == chat.choices[0].message.content
    free = client.responses.create(model=MODEL_NAME, input="A digit as JSON.", max_output_tokens=16,
                                   temperature=0)
    assert free.output_text != out.output_text


@pytest.mark.parametrize(("extra", "param", "code", "says"), [
    ({"conversation": "conv_1"}, "conversation", "unsupported_parameter", "previous_response_id"),
    ({"messages": CHAT}, "messages", "unsupported_parameter", "it takes 'input'"),
    ({"max_tokens": 4}, "max_tokens", "unsupported_parameter", "it takes 'max_output_tokens'"),
    ({"input": []}, "input", "invalid_value", "non-empty array"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
     "input[0].content[0]", "invalid_value", "reads text only"),
    ({"input": [{"type": "reasoning", "summary": []}]}, "input[0].type", "invalid_value", "no 'reasoning'"),
    ({"input": [{"type": "function_call", "call_id": "c", "name": "f"}]}, "input[0].arguments",
     "invalid_type", "must be a string"),
    ({"tools": [{"type": "web_search"}]}, "tools[0].type", "unsupported_parameter", "no built-in tools"),
    ({"max_output_tokens": 0}, "max_output_tokens", "invalid_value", "max_output_tokens"),
    ({"temperature": -1}, "temperature", "invalid_value", "temperature"),
    ({"tool_choice": "required"}, "tool_choice", "invalid_value", "needs 'tools'"),
    ({"text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "nope"}}}},
     "text.format.schema", "invalid_value", "not a valid JSON Schema"),
    ({"include": ["message.output_text.logprobs"]}, "include", "unsupported_parameter", "not supported"),
    ({"background": 0}, "background", "unsupported_parameter", "not supported"),
    ({"top_logprobs": False}, "top_logprobs", "unsupported_parameter", "not supported"),
    ({"store": "no"}, "store", "invalid_type", "expected a boolean"),
    ({"metadata": "str"}, "metadata", "invalid_type", "expected an object"),
    ({"user": 5}, "user", "invalid_type", "expected a string"),
    ({"reasoning": "high"}, "reasoning", "invalid_type", "expected an object"),
    ({"service_tier": 1}, "service_tier", "invalid_type", "expected a string"),
    ({"prompt_cache_key": 7}, "prompt_cache_key", "invalid_type", "expected a string"),
    ({"safety_identifier": False}, "safety_identifier", "invalid_type", "expected a string"),
    ({"metadata": {"k": 5}}, "metadata.k", "invalid_type", "must be a string"),
    ({"stream_options": {"include_obfuscation": "no"}}, "stream_options.include_obfuscation", "invalid_type",
     "expected a boolean"),
    ({"tools": False}, "tools", "invalid_type", "must be an array"),
    ({"tools": [{"type": "function", "name": "f", "parameters": []}]}, "tools[0].parameters", "invalid_type",
     "JSON Schema object"),
    ({"tools": [{"type": "function", "name": "f", "description": 5}]}, "tools[0].description", "invalid_type",
     "must be a string"),
    ({"tools": [{"type": "function", "name": "f", "strict": "yes"}]}, "tools[0].strict", "invalid_type",
     "must be a boolean"),
    ({"previous_response_id": 123}, "previous_response_id", "invalid_type", "expected a string"),
    ({"input": [{"role": "user", "content": "hi"},
                {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{bad json"}]},
     "input[1].arguments", "invalid_value", "not valid JSON"),
    ({"text": {"format": {"type": "json_schema", "schema": {"type": "object"}}}}, "text.format.name",
     "invalid_value", "text.format.name"),
    ({"tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}], "tool_choice": "bogus"},
     "tool_choice", "invalid_value", "got 'bogus'"),
])
def test_bad_responses_fields_are_400s_naming_the_field(server, extra, param, code, says):
    body = {"model": MODEL_NAME, "input": "hi", "max_output_tokens": 4} | extra
    r = httpx.post(server + "/v1/responses", json=body, timeout=60)
    error = r.json()["error"]
    assert r.status_code == 400 and error["param"] == param and error["code"] == code, error
    assert says in error["message"], error["message"]


def test_previous_response_id_continues_the_stored_conversation(client):
    """A chain of three responses (the second streamed) answers as the whole conversation sent at
    once; the first request's instructions are not carried over, as OpenAI has it."""
    kw = dict(model=MODEL_NAME, max_output_tokens=6, temperature=0)
    first = client.responses.create(**kw, instructions="You are terse.", input="Name a prime.")
    assert first.store is True and first.previous_response_id is None
    second_events = list(client.responses.create(**kw, input="Another one.", previous_response_id=first.id,
                                                 stream=True))
    second = second_events[-1].response
    assert second.previous_response_id == first.id
    third = client.responses.create(**kw, input=[{"role": "user", "content": "And a third."}],
                                    previous_response_id=second.id, instructions="Answer in French.")
    whole = client.responses.create(**kw, instructions="Answer in French.", store=False, input=[
        {"role": "user", "content": "Name a prime."}, {"role": "assistant", "content": first.output_text},
        {"role": "user", "content": "Another one."}, {"role": "assistant", "content": second.output_text},
        {"role": "user", "content": "And a third."}])
    assert third.usage.input_tokens == whole.usage.input_tokens
    assert third.output_text == whole.output_text
    assert third.usage.input_tokens > second.usage.input_tokens > first.usage.input_tokens


@needs_rowwise
def test_a_continued_conversation_starts_from_the_prefix_cache(folders):
    """On a row-invariant model (int8, the lean stack) each turn's prompt reuses the one before it."""
    with live_server(load_engine(*folders, dtype="int8"), queue_size=4) as (url, _):
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
        kw = dict(model=MODEL_NAME, max_output_tokens=6, temperature=0)
        first = client.responses.create(**kw, input="Name a prime.")
        second = client.responses.create(**kw, input="Another one.", previous_response_id=first.id)
    assert first.usage.input_tokens_details.cached_tokens == 0
    cached = second.usage.input_tokens_details.cached_tokens
    assert first.usage.input_tokens <= cached < second.usage.input_tokens


def test_stored_responses_are_read_listed_and_deleted(client, server):
    kw = dict(model=MODEL_NAME, max_output_tokens=4, temperature=0)
    out = client.responses.create(**kw, input=[{"role": "user", "content": "One."},
                                                {"role": "assistant", "content": "Two."},
                                                {"role": "user", "content": "Three?"}])
    got = client.responses.retrieve(out.id)
    assert got.id == out.id and got.output_text == out.output_text and got.usage == out.usage
    items = client.responses.input_items.list(out.id)
    assert [i.content[0].text for i in items.data] == ["Three?", "Two.", "One."]
    assert [i.role for i in items.data] == ["user", "assistant", "user"]
    listed = f"{server}/v1/responses/{out.id}/input_items"
    page = httpx.get(listed, params={"order": "asc", "limit": 2}).json()
    assert [i["content"][0]["text"] for i in page["data"]] == ["One.", "Two."] and page["has_more"]
    rest = httpx.get(listed, params={"order": "asc", "after": page["last_id"]}).json()
    assert [i["content"][0]["text"] for i in rest["data"]] == ["Three?"] and not rest["has_more"]
    bad = httpx.get(listed, params={"limit": "abc"}).json()["error"]
    assert bad["param"] == "limit" and "got 'abc'" in bad["message"]
    client.responses.delete(out.id)
    for r in (httpx.get(f"{server}/v1/responses/{out.id}"), httpx.delete(f"{server}/v1/responses/{out.id}")):
        assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
    gone = httpx.post(server + "/v1/responses", json=kw | {"input": "Hi.", "previous_response_id": out.id})
    error = gone.json()["error"]
    assert gone.status_code == 404 and error["param"] == "previous_response_id"
    assert error["code"] == "previous_response_not_found"
    unstored = client.responses.create(**kw, input="Hi.", store=False)
    assert unstored.store is False and httpx.get(f"{server}/v1/responses/{unstored.id}").status_code == 404
    call = {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}
    mixed = client.responses.create(**kw, stream_options={"include_obfuscation": False}, stream=True, input=[
        {"role": "user", "content": [{"type": "input_text", "text": "Use f."}]}, call,
        {"type": "function_call_output", "call_id": "c1", "output": "done"}])
    mixed_id = list(mixed)[-1].response.id
    items = httpx.get(f"{server}/v1/responses/{mixed_id}/input_items", params={"order": "asc"}).json()["data"]
    assert [(i["type"], i["id"].split("_")[0]) for i in items] == [
        ("message", "msg"), ("function_call", "fc"), ("function_call_output", "fco")]


def test_the_store_keeps_the_most_recent_responses():
    """Unit level: the oldest response leaves the store first, and a request that never finished
    leaves nothing behind past the bound."""
    api = Api(2)
    ids = []
    for i in range(3):
        body = {"input": f"turn {i}"}
        api.chat_body(body)
        base = api.head(body, MODEL_NAME, 3, 0)
        api.keep(base | {"output": [{"type": "message", "id": "m", "status": "completed", "role": "assistant",
                                     "content": [{"type": "output_text", "text": f"answer {i}"}]}]})
        ids.append(base["id"])
    assert list(api.kept) == ids[1:] and not api.pending and not api.read
    with pytest.raises(Exception, match="not found"):
        api.chat_body({"input": "next", "previous_response_id": ids[0]})
    chained = {"input": "next", "previous_response_id": ids[2]}
    assert [m["content"] for m in api.chat_body(chained)["messages"]] == ["turn 2", "answer 2", "next"]
    for _ in range(100):  # admitted, never finished
        body = {"input": "x"}
        api.chat_body(body)
        api.head(body, MODEL_NAME, 1, 0)
    assert len(api.pending) <= 2 + 64 and len(api.read) <= 2 + 64
    assert all(Api(0).head({"input": "x"}, MODEL_NAME, 1, 0)["store"] is False for _ in range(2))
    with pytest.raises(Exception, match="keeps no responses"):
        Api(0).chat_body({"input": "next", "previous_response_id": ids[2]})


def test_a_streamed_response_is_readable_while_it_runs_and_after_it_ends(server):
    """Its id is out with ``response.created``: GET reads it as in_progress, with the text sent so
    far (and it cannot be continued yet), then as completed or incomplete; a stream the client
    leaves is cancelled."""
    body = {"model": MODEL_NAME, "input": "Count to twenty.", "max_output_tokens": 24, "temperature": 0,
            "stream": True, "ignore_eos": True}
    with httpx.stream("POST", server + "/v1/responses", json=body, timeout=60) as r:
        events = (json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: "))
        rid = next(events)["response"]["id"]
        sent = next(e for e in events if e["type"] == "response.output_text.delta")["delta"]
        running = httpx.get(f"{server}/v1/responses/{rid}").json()
        early = httpx.post(server + "/v1/responses", json={"model": MODEL_NAME, "input": "More.",
                                                           "previous_response_id": rid})
        rest = list(events)
    assert running["status"] == "in_progress" and running["output"][0]["status"] == "in_progress"
    assert running["output"][0]["content"][0]["text"].startswith(sent) and sent
    assert early.status_code == 400 and "in_progress" in early.json()["error"]["message"]
    final = httpx.get(f"{server}/v1/responses/{rid}").json()
    assert final["status"] == rest[-1]["response"]["status"] in ("completed", "incomplete")
    assert final["output"] == rest[-1]["response"]["output"]
    with httpx.stream("POST", server + "/v1/responses", json=body | {"max_output_tokens": 200},
                      timeout=60) as r:
        first = next(line for line in r.iter_lines() if line.startswith("data: "))
        rid = json.loads(first[6:])["response"]["id"]
    for _ in range(100):
        status = httpx.get(f"{server}/v1/responses/{rid}").json()["status"]
        if status != "in_progress":
            break
        time.sleep(0.1)
    assert status == "cancelled"


def test_a_stream_that_fails_is_kept_failed_with_its_error_and_output():
    """A generation that fails mid-stream: the stream's ``error`` event, and the kept response
    ``failed`` with that error and the text it had sent, its message ``incomplete``."""
    import asyncio

    from anyspec.server.scheduler import ShuttingDown

    api = Api(4)
    body = {"model": MODEL_NAME, "input": "Hi", "stream": True}
    base = api.head(body, MODEL_NAME, 3, 0)
    happened = iter([("text", "Hel"), ("text", "lo"), ("error", ShuttingDown())])

    async def next_event():
        return next(happened)

    async def run() -> list[dict]:
        return [json.loads(line[6:]) async for chunk in api.events(next_event, base, False)
                for line in chunk.splitlines() if line.startswith("data: ")]

    sent = asyncio.run(run())
    assert sent[-1]["type"] == "error" and sent[-1]["code"] == "server_shutting_down"
    kept = api.find(base["id"])[0]
    assert kept["status"] == "failed" and kept["error"]["code"] == "server_shutting_down"
    assert "shutting down" in kept["error"]["message"]
    assert kept["output"][0]["status"] == "incomplete" and kept["output"][0]["content"][0]["text"] == "Hello"


WEATHER = {"type": "function", "name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"enum": ["Paris", "Oslo"]}}, "required": ["city"],
    "additionalProperties": False}}
TOOLS_TEMPLATE = ("{% if tools %}<|im_start|>system\n{% for t in tools %}{{ t | tojson }}\n{% endfor %}"
                  "Call one as <tool_call>\n{\"name\": ..., \"arguments\": ...}\n</tool_call><|im_end|>\n"
                  "{% endif %}" + CHATML)


@pytest.fixture(scope="module")
def tool_client(tok_qwen2, tok_llama2, tmp_path_factory):
    """The ``openai`` client of a live server whose tiny target takes tools as Qwen2.5 does (its
    template shows them, its tokenizer has the ``<tool_call>`` marks), and the server's URL."""
    tokenizer = copy.deepcopy(tok_qwen2)
    tokenizer.add_tokens(["<tool_call>", "</tool_call>"])
    tokenizer.chat_template = TOOLS_TEMPLATE
    folder = tmp_path_factory.mktemp("tools")
    target = save_tiny_model(tokenizer, folder / "target", "qwen2", seed=0)
    draft = save_tiny_model(tok_llama2, folder / "draft", "llama", seed=1)
    with live_server(load_engine(target, draft), queue_size=4) as (url, _):
        yield openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0), url


@pytest.mark.parametrize(("path", "body", "param"), [
    ("/v1/responses", {"input": "hi", "max_output_tokens": 4, "tools": [WEATHER | {"parameters": True}]},
     "tools[0].parameters"),
    ("/v1/chat/completions", {"messages": CHAT, "max_tokens": 4, "tools": [{"type": "function", "function": {
        "name": "get_weather", "parameters": True}}]}, "tools[0].function.parameters")])
def test_parameters_not_a_schema_object_are_a_400_where_tools_are_rendered(tool_client, path, body, param):
    """The arguments of a call are an object: ``parameters: true`` is refused as it is read, not
    left to fail where the calls' grammar is built."""
    pytest.importorskip("llguidance")
    r = httpx.post(tool_client[1] + path, json={"model": MODEL_NAME} | body, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


@pytest.mark.parametrize("choice", ["required", {"type": "function", "name": "get_weather"}])
def test_a_forced_call_is_the_whole_output_streamed_or_not(tool_client, choice):
    """An answer that is only a call has no message item, whole, streamed or read back."""
    pytest.importorskip("llguidance")
    client, url = tool_client
    kw = dict(model=MODEL_NAME, input="Weather in Paris?", tools=[WEATHER], tool_choice=choice,
              parallel_tool_calls=False, max_output_tokens=40, temperature=0)
    whole = client.responses.create(**kw)
    events = list(client.responses.create(**kw, stream=True))
    streamed = events[-1].response
    assert [i.type for i in whole.output] == ["function_call"], whole.output
    added = [e.item.type for e in events if e.type == "response.output_item.added"]
    assert added == [i.type for i in streamed.output] == ["function_call"], streamed.output
    assert not [e for e in events if e.type.startswith(("response.output_text", "response.content_part"))]
    assert streamed.output[0].arguments == whole.output[0].arguments
    stored = httpx.get(f"{url}/v1/responses/{streamed.id}").json()
    assert [i["type"] for i in stored["output"]] == ["function_call"]


def test_a_stream_the_client_leaves_keeps_the_text_it_sent(client, server):
    """The stored response of a stream cut short: cancelled, with the message as far as it went."""
    body = {"model": MODEL_NAME, "input": "Count to twenty.", "max_output_tokens": 200, "temperature": 0,
            "stream": True}
    with httpx.stream("POST", server + "/v1/responses", json=body, timeout=60) as r:
        events = (json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: "))
        rid = next(events)["response"]["id"]
        deltas = (e["delta"] for e in events if e["type"] == "response.output_text.delta")
        seen = [next(deltas) for _ in range(4)]
    for _ in range(100):
        got = client.responses.retrieve(rid)
        if got.status != "in_progress":
            break
        time.sleep(0.1)
    whole = client.responses.create(**{k: v for k, v in body.items() if k != "stream"}, store=False)
    assert got.status == "cancelled" and [i.type for i in got.output] == ["message"]
    assert got.output[0].status == "incomplete"
    assert got.output_text.startswith("".join(seen)) and whole.output_text.startswith(got.output_text)
