"""JSON schemas and tool calls through the ``openai`` client against a live server on the default pair
(Qwen2.5-Coder-1.5B target, SmolLM2-135M draft, GGUF on anyspec's kernels): every constrained answer
validates, and speculation under the grammar answers what the constrained target alone answers."""

from __future__ import annotations

import gc
import json
import re
from concurrent.futures import ThreadPoolExecutor

import pytest
from live_server import live_server

from anyspec.engine import Engine, SpeculativeConfig
from anyspec.errors import ConfigError

jsonschema = pytest.importorskip("jsonschema")
openai = pytest.importorskip("openai")
pytest.importorskip("llguidance")

pytestmark = pytest.mark.slow

NAME = {"type": "string", "maxLength": 12}
SCHEMAS = [
    {"type": "object", "properties": {"name": NAME, "age": {"type": "integer", "minimum": 0, "maximum": 120}},
     "required": ["name", "age"], "additionalProperties": False},
    {"type": "object", "properties": {"colour": {"enum": ["red", "green", "blue"]}}, "required": ["colour"]},
    {"type": "object", "properties": {"city": NAME, "country": NAME}, "required": ["city", "country"]},
    {"type": "object", "properties": {"tags": {"type": "array", "items": {"enum": ["fast", "safe", "cheap"]},
                                               "minItems": 1, "maxItems": 3}}, "required": ["tags"]},
    {"type": "object", "properties": {"user": {"type": "object", "properties": {
        "id": {"type": "integer", "minimum": 1, "maximum": 999}, "admin": {"type": "boolean"}},
        "required": ["id", "admin"]}}, "required": ["user"]},
    {"type": "object", "properties": {"ok": {"type": "boolean"}, "code": {"enum": [200, 404, 500]}},
     "required": ["ok", "code"]},
    {"type": "object", "properties": {"point": {"type": "object", "properties": {
        "x": {"type": "integer", "minimum": -99, "maximum": 99},
        "y": {"type": "integer", "minimum": -99, "maximum": 99}}, "required": ["x", "y"]}},
     "required": ["point"]},
    {"type": "object", "properties": {"language": {"enum": ["python", "rust", "go"]},
                                      "typed": {"type": "boolean"}}, "required": ["language", "typed"]},
    {"type": "object", "properties": {"primes": {"type": "array", "items": {"type": "integer", "minimum": 2,
                                                                            "maximum": 97},
                                                 "minItems": 2, "maxItems": 4}}, "required": ["primes"]},
    {"type": "object", "properties": {"title": NAME, "author": {"type": "object", "properties": {
        "first": NAME, "last": NAME}, "required": ["first", "last"]}}, "required": ["title", "author"]},
]
ASKS = [
    ("Describe a person called Ada as JSON.", "Describe a fictional teacher as JSON."),
    ("Pick the colour of grass as JSON.", "Pick the colour of the sky as JSON."),
    ("Where is the Eiffel Tower? Answer as JSON.", "Name a city in Japan as JSON."),
    ("Tag a bicycle as JSON.", "Tag a bank vault as JSON."),
    ("Make up a user record as JSON.", "Describe the administrator account as JSON."),
    ("Report a page that was not found as JSON.", "Report a healthy web request as JSON."),
    ("Give a point on a grid as JSON.", "Give the origin of the plane as JSON."),
    ("Which language is Cargo for? JSON.", "Which language has pip? JSON."),
    ("List a few small primes as JSON.", "List two primes above 50 as JSON."),
    ("Describe the book Dune as JSON.", "Describe a famous novel as JSON."),
]


def closed(schema):
    """Every object without further properties, as OpenAI's strict mode asks."""
    if isinstance(schema, dict):
        schema = {k: closed(v) for k, v in schema.items()}
        if schema.get("type") == "object":
            schema["additionalProperties"] = False
    elif isinstance(schema, list):
        schema = [closed(v) for v in schema]
    return schema


SCHEMAS = [closed(s) for s in SCHEMAS]
CASES = [(schema, ask) for schema, asks in zip(SCHEMAS, ASKS, strict=True) for ask in asks]
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                                    "unit": {"enum": ["celsius", "fahrenheit"]}},
                   "required": ["city"]}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "The local time in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
                   "required": ["city"]}}}


@pytest.fixture(scope="module")
def pair():
    """The default pair, loaded once the models earlier modules left in reference cycles (a server's
    app holds its engine) are collected, and collected in turn after the module."""
    from anyspec.backends.gguf import GGUFModel
    from anyspec.models import DEFAULT_DRAFT, DEFAULT_TARGET, gguf_path

    gc.collect()
    yield (GGUFModel(gguf_path(DEFAULT_TARGET), name="target"),
           GGUFModel(gguf_path(DEFAULT_DRAFT), name="draft"))
    gc.collect()


@pytest.fixture(scope="module")
def client(pair):
    engine = Engine(*pair, SpeculativeConfig(num_speculative_tokens=5, tree=2))
    with live_server(engine, max_batch=4) as (url, _):
        yield openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=600)


def ask_all(client, cases, **settings) -> list:
    """Every (schema, question) at once: the server runs them in batches."""
    def one(case):
        schema, ask = case
        extra = {"response_format": {"type": "json_schema", "json_schema": {
            "name": "answer", "schema": schema, "strict": True}}} if schema is not None else {}
        return client.chat.completions.create(model="tiny-qwen2", messages=[{"role": "user", "content": ask}],
                                              **extra | settings).choices[0]

    with ThreadPoolExecutor(4) as pool:
        return list(pool.map(one, cases))


def check(choices, cases) -> list[str]:
    texts = []
    for choice, (schema, _) in zip(choices, cases, strict=True):
        assert choice.finish_reason == "stop", choice.message.content
        jsonschema.validate(json.loads(choice.message.content), schema)
        texts.append(choice.message.content)
    return texts


def test_greedy_json_schema_answers_validate_and_are_the_target_alones(client):
    spec = check(ask_all(client, CASES, max_tokens=40, temperature=0), CASES)
    alone = ask_all(client, CASES, max_tokens=40, temperature=0, extra_body={"speculative": False})
    alone = check(alone, CASES)
    assert spec == alone
    free = ask_all(client, [(None, ask) for _, ask in CASES[:4]], max_tokens=40, temperature=0)
    assert not all(valid(c.message.content, s) for c, (s, _) in zip(free, CASES[:4], strict=True))


def valid(text: str, schema: dict) -> bool:
    try:
        jsonschema.validate(json.loads(text), schema)
    except (ValueError, jsonschema.ValidationError):
        return False
    return True


def test_sampled_json_schema_answers_validate_and_follow_the_seed(client):
    settings = dict(max_tokens=40, temperature=0.9, top_p=0.95, seed=11)
    spec = check(ask_all(client, CASES, **settings), CASES)
    alone = check(ask_all(client, CASES[::4], **settings, extra_body={"speculative": False}), CASES[::4])
    assert spec[::4] == alone


GUIDED = [
    ({"guided_choice": ["positive", "negative", "neutral"]}, "Classify: 'I loved this film!'",
     r"positive|negative|neutral"),
    ({"guided_regex": r"\d{3}-\d{3}-\d{4}"}, "Make up a US phone number.", r"\d{3}-\d{3}-\d{4}"),
    ({"structured_outputs": {"choice": ["Paris", "Lyon"]}}, "The capital of France?", "Paris|Lyon"),
    ({"structured_outputs": {"regex": r"(yes|no), because [a-z ]{5,30}\."}}, "Is water wet? Say why.",
     r"(yes|no), because [a-z ]{5,30}\."),
    ({"guided_grammar": 'start: "SELECT " COL " FROM users"\nCOL: "name" | "age" | "*"'},
     "A SQL query for every user's name.", r"SELECT (name|age|\*) FROM users"),
    ({"guided_json": {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"],
                      "additionalProperties": False}}, "Seven as JSON.", r'\{"n": -?\d+\}'),
    # llama.cpp's fields: a GBNF grammar, and a JSON Schema
    ({"grammar": 'root ::= "SELECT " col " FROM users"\ncol ::= "name" | "age" | "*"'},
     "A SQL query for every user's age.", r"SELECT (name|age|\*) FROM users"),
    ({"json_schema": {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
                      "additionalProperties": False}}, "Is the sky blue? Answer in JSON.",
     r'\{"ok": (true|false)\}'),
]


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_vllms_guided_decoding_holds_the_answer_and_is_the_target_alones(client, temperature):
    """vLLM's guided_choice, guided_regex, guided_grammar and guided_json, structured_outputs, and
    llama.cpp's grammar and json_schema:
    every answer matches, greedy and sampled, as the constrained target alone answers; the same
    questions unconstrained do not all match."""
    import re

    def ask(extra, question, **settings):
        return client.chat.completions.create(
            model="tiny-qwen2", messages=[{"role": "user", "content": question}], max_tokens=40,
            temperature=temperature, seed=5, extra_body=extra | settings).choices[0]

    free = []
    for extra, question, pattern in GUIDED:
        spec, alone = ask(extra, question), ask(extra, question, speculative=False)
        text = spec.message.content
        assert spec.finish_reason == "stop" and re.fullmatch(pattern, text), text
        assert spec.message.content == alone.message.content
        free.append(re.fullmatch(pattern, ask({}, question).message.content))
    assert not all(free)


def test_json_object_mode_on_both_endpoints(client):
    chat = client.chat.completions.create(
        model="tiny-qwen2", messages=[{"role": "user", "content": "A JSON object with one key, a."}],
        max_tokens=24, temperature=0, response_format={"type": "json_object"})
    assert isinstance(json.loads(chat.choices[0].message.content), dict)
    zero = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 0}},
            "required": ["n"], "additionalProperties": False}
    chat = client.chat.completions.create(
        model="tiny-qwen2", messages=[{"role": "user", "content": "Zero as JSON."}], max_tokens=24,
        temperature=0, response_format={"type": "json_schema", "json_schema": {"name": "z", "schema": zero}},
        logprobs=True, top_logprobs=3)
    assert json.loads(chat.choices[0].message.content) == {"n": 0}
    tops = [len(t.top_logprobs) for t in chat.choices[0].logprobs.content]
    assert min(tops) < 3  # where the grammar allows fewer tokens, fewer are listed
    schema = {"type": "json_schema", "json_schema": {"name": "c", "schema": SCHEMAS[1]}}
    text = client.completions.create(model="tiny-qwen2", prompt="A JSON object describing a cat:",
                                     max_tokens=32, temperature=0, extra_body={"response_format": schema})
    jsonschema.validate(json.loads(text.choices[0].text), SCHEMAS[1])


def streamed_calls(stream) -> tuple[str, list[dict], str]:
    """The content, the tool calls and the finish reason, gathered from the chunks as clients do."""
    content, calls, finish = "", {}, None
    for chunk in stream:
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        content += choice.delta.content or ""
        for call in choice.delta.tool_calls or []:
            got = calls.setdefault(call.index, {"id": "", "name": "", "arguments": ""})
            got["id"] += call.id or ""
            got["name"] += call.function.name or ""
            got["arguments"] += call.function.arguments or ""
        finish = choice.finish_reason or finish
    return content, [calls[i] for i in sorted(calls)], finish


@pytest.mark.parametrize("stream", [False, True])
def test_a_tool_calling_conversation(client, stream):
    messages = [{"role": "user", "content": "What is the weather in Paris right now?"}]
    settings = dict(model="tiny-qwen2", tools=[WEATHER, TIME], max_tokens=48, temperature=0)

    def turn(**extra):
        if not stream:
            choice = client.chat.completions.create(messages=messages, **settings | extra).choices[0]
            calls = [{"id": c.id, "name": c.function.name, "arguments": c.function.arguments}
                     for c in choice.message.tool_calls or []]
            return choice.message.content, calls, choice.finish_reason
        chunks = client.chat.completions.create(messages=messages, stream=True, **settings | extra)
        return streamed_calls(chunks)

    # with "auto" this model writes a ```json block; "required" makes it call
    content, calls, finish = turn(tool_choice="required", parallel_tool_calls=False)
    assert finish == "tool_calls" and [c["name"] for c in calls] == ["get_weather"], content
    assert json.loads(calls[0]["arguments"])["city"] == "Paris"
    messages += [{"role": "assistant", "content": None, "tool_calls": [
        {"id": calls[0]["id"], "type": "function", "function": {"name": "get_weather",
                                                               "arguments": calls[0]["arguments"]}}]},
                 {"role": "tool", "tool_call_id": calls[0]["id"],
                  "content": '{"temperature": 18, "sky": "clear"}'}]
    content, calls, finish = turn(tool_choice={"type": "function", "function": {"name": "get_time"}})
    assert finish == "tool_calls" and [c["name"] for c in calls] == ["get_time"]
    jsonschema.validate(json.loads(calls[0]["arguments"]), TIME["function"]["parameters"])
    messages += [{"role": "assistant", "content": None, "tool_calls": [
        {"id": calls[0]["id"], "type": "function", "function": {"name": "get_time",
                                                               "arguments": calls[0]["arguments"]}}]},
                 {"role": "tool", "tool_call_id": calls[0]["id"], "content": '"14:05"'}]
    content, calls, finish = turn(tool_choice="none", max_tokens=24)
    assert not calls and finish in ("stop", "length") and isinstance(content, str)


def test_tokenize_counts_a_chats_tools_as_the_chat_endpoint_does(client):
    """/tokenize with ``tools`` gives the ids the chat endpoint reads for the same messages and tools
    (its ``usage.prompt_tokens``), more than without them; a bad tool is the chat endpoint's 400."""
    import httpx

    messages = [{"role": "user", "content": "What is the weather in Paris right now?"}]
    url = str(client.base_url).removesuffix("/v1/")
    plain = httpx.post(url + "/tokenize", json={"messages": messages}).json()
    with_tools = httpx.post(url + "/tokenize", json={"messages": messages, "tools": [WEATHER, TIME]}).json()
    used = client.chat.completions.create(model="tiny-qwen2", messages=messages, tools=[WEATHER, TIME],
                                          tool_choice="none", max_tokens=1, temperature=0).usage
    assert with_tools["count"] == used.prompt_tokens > plain["count"]
    bad = httpx.post(url + "/tokenize", json={"messages": messages, "tools": [{"type": "function"}]})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "tools[0].function"


def flat(tool: dict) -> dict:
    """A chat tool as the Responses API writes it."""
    return {"type": "function"} | tool["function"]


@pytest.mark.parametrize("stream", [False, True])
def test_a_tool_calling_conversation_through_the_responses_api(client, stream):
    """The same turns through /v1/responses: a required call comes back as a function_call item (in
    its own events when streamed), the chat's call; its output sent back as an item gets an answer."""
    question = [{"role": "user", "content": "What is the weather in Paris right now?"}]
    settings = dict(model="tiny-qwen2", tools=[flat(WEATHER), flat(TIME)], max_output_tokens=48,
                    temperature=0)

    def respond(items, **extra):
        if not stream:
            return client.responses.create(input=items, **settings | extra)
        events = list(client.responses.create(input=items, stream=True, **settings | extra))
        assert [e.sequence_number for e in events] == list(range(len(events)))
        added = [e.item for e in events if e.type == "response.output_item.added"]
        done = [e.item for e in events if e.type == "response.output_item.done"]
        kinds = [i.type for i in events[-1].response.output]
        assert [i.type for i in added] == [i.type for i in done] == kinds
        for item in done:
            if item.type == "function_call":
                arguments = [e.delta for e in events if e.type == "response.function_call_arguments.delta"
                             and e.item_id == item.id]
                assert "".join(arguments) == item.arguments
        return events[-1].response

    out = respond(question, tool_choice="required", parallel_tool_calls=False)
    chat = client.chat.completions.create(model="tiny-qwen2", messages=question, tools=[WEATHER, TIME],
                                          max_tokens=48, temperature=0, tool_choice="required",
                                          parallel_tool_calls=False).choices[0].message.tool_calls
    calls = [item for item in out.output if item.type == "function_call"]
    assert out.status == "completed" and [c.name for c in calls] == ["get_weather"], out.output
    assert calls[0].arguments == chat[0].function.arguments
    assert json.loads(calls[0].arguments)["city"] == "Paris"
    items = question + [{"type": "function_call", "call_id": calls[0].call_id, "name": calls[0].name,
                         "arguments": calls[0].arguments},
                        {"type": "function_call_output", "call_id": calls[0].call_id,
                         "output": '{"temperature": 18, "sky": "clear"}'}]
    answer = respond(items, tool_choice="none", max_output_tokens=24)
    assert [item.type for item in answer.output] == ["message"] and answer.output_text


def test_anthropic_tool_use_round_trip_and_its_token_count(client):
    """/v1/messages on the default pair: tool_choice any gives a tool_use block; its result sent back
    as a tool_result block gets text; count_tokens counts the tools' rendering too."""
    import httpx

    url = str(client.base_url).removesuffix("/v1/").removesuffix("/v1")
    tools = [{"name": f["function"]["name"], "description": f["function"]["description"],
              "input_schema": f["function"]["parameters"]} for f in (WEATHER, TIME)]
    ask = [{"role": "user", "content": "What is the weather in Paris right now?"}]
    body = {"model": "tiny-qwen2", "max_tokens": 48, "temperature": 0, "tools": tools}

    def post(path, **more):
        r = httpx.post(url + path, json=body | more, timeout=600)
        assert r.status_code == 200, r.text
        return r.json()

    out = post("/v1/messages", messages=ask, tool_choice={"type": "any", "disable_parallel_tool_use": True})
    calls = [b for b in out["content"] if b["type"] == "tool_use"]
    assert out["stop_reason"] == "tool_use" and [c["name"] for c in calls] == ["get_weather"], out
    assert calls[0]["input"]["city"] == "Paris" and calls[0]["id"].startswith("toolu_")
    turn = ask + [{"role": "assistant", "content": out["content"]},
                  {"role": "user", "content": [{"type": "tool_result", "tool_use_id": calls[0]["id"],
                                                "content": '{"temperature": 18, "sky": "clear"}'}]}]
    answer = post("/v1/messages", messages=turn, tool_choice={"type": "none"}, max_tokens=24)
    assert [b["type"] for b in answer["content"]] == ["text"] and answer["content"][0]["text"]
    counted = post("/v1/messages/count_tokens", messages=turn)["input_tokens"]
    assert counted == answer["usage"]["input_tokens"] + answer["usage"]["cache_read_input_tokens"]
    body.pop("tools")
    assert post("/v1/messages/count_tokens", messages=turn)["input_tokens"] < counted


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_tli_chains_under_the_grammar_are_the_target_alones(pair, temperature):
    """The engine without the server (its grammars from ``Engine.guide``, as a library user makes
    them): TLI, a chain of 3 (the server's tests run SLEM with branches)."""
    from anyspec.engine import SamplingParams

    target, draft = pair
    alone, tli = Engine(target, None), Engine(target, draft, SpeculativeConfig(
        algorithm="tli", num_speculative_tokens=3, tree=0))
    forced = 0
    for schema, ask in CASES[1::5]:
        params = SamplingParams(temperature=temperature, max_new_tokens=40, seed=3,
                                grammar=tli.guide("json", schema))
        messages = [{"role": "user", "content": ask}]
        spec = tli.generate(messages, params)
        assert spec.token_ids == alone.generate(messages, params).token_ids
        jsonschema.validate(json.loads(spec.text), schema)
        forced += spec.stats.forced
    assert forced > 0  # the property names the schema fixes were proposed without the draft
    choice = SamplingParams(temperature=temperature, seed=3, grammar=alone.guide("choice", ["yes", "no"]))
    assert alone.generate("Is water wet? Answer:", choice).text in ("yes", "no")
    with pytest.raises(ConfigError, match="a guide's kind is one of json, regex, choice, grammar"):
        alone.guide("xml", "<a/>")


AUTO_WEATHER = {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
    "additionalProperties": False}}
TWO_LETTER_TIME = {"name": "get_time", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 2}}, "required": ["city"],
    "additionalProperties": False}}


def test_with_tool_choice_auto_text_is_free_and_an_opened_call_is_held_to_its_schema(pair):
    """The grammar a request with tools gets by default (``tool_choice: "auto"``), on the target's
    tokenizer, where ``<tool_call>`` is one token."""
    from anyspec.engine.grammar import Grammars
    from anyspec.engine.proposers import Proposal
    from anyspec.engine.stats import Stats
    from anyspec.server.structured import structure

    tok_qwen2 = pair[0].tokenizer
    grammars = Grammars(tok_qwen2, pair[0].vocab_size, {tok_qwen2.eos_token_id})

    def allowed(masks, row: int, token: int) -> bool:
        return bool((int(masks[row, token >> 5]) >> (token & 31)) & 1)

    text = tok_qwen2.encode("Sure, I will look that up.\n", add_special_tokens=False)
    opener = tok_qwen2.convert_tokens_to_ids("<tool_call>")
    call = tok_qwen2.encode('\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n',
                            add_special_tokens=False)
    wrong = tok_qwen2.encode('\n{"name": "get_time"', add_special_tokens=False)
    tools = [{"type": "function", "function": AUTO_WEATHER}]
    auto = structure({"tools": tools}, True, tok_qwen2, lambda: grammars).grammar.start(Stats())
    proposal, masks = auto.rows(Proposal(text + [opener] + call))
    assert proposal.ids == text + [opener] + call
    assert allowed(masks, len(text), tok_qwen2.eos_token_id)  # the answer may end after its text
    kept = auto.rows(Proposal(text + [opener] + wrong))[0].ids[len(text) + 1:]
    assert kept != wrong and '\n{"name": "get_weather"'.startswith(tok_qwen2.decode(kept))
    auto.advance(text + [opener])
    assert auto.rows(Proposal(text))[0].ids == []  # inside the call, no free text
    required = grammars.tool_calls([AUTO_WEATHER], one=True, field="tools").start(Stats())
    assert required.rows(Proposal(text))[0].ids == []


def test_parallel_calls_may_end_after_the_newline_the_model_writes(pair):
    """Qwen2.5 writes ``</tool_call>`` then a newline then the end of its turn; with parallel calls
    allowed that newline may still end the answer, or open another call."""
    from anyspec.engine.grammar import Grammars
    from anyspec.engine.proposers import Proposal
    from anyspec.engine.stats import Stats

    tok = pair[0].tokenizer
    grammars = Grammars(tok, pair[0].vocab_size, {tok.eos_token_id})
    opener, closer = (tok.convert_tokens_to_ids(t) for t in ("<tool_call>", "</tool_call>"))
    call = [opener, *tok.encode('\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n',
                                add_special_tokens=False), closer]
    newline = tok.encode("\n", add_special_tokens=False)
    for one in (False, True):
        calls = grammars.tool_calls([AUTO_WEATHER], one=one, field="tools").start(Stats())
        proposal, masks = calls.rows(Proposal(call + newline))
        assert proposal.ids == call + newline
        last = masks[len(proposal.ids)]
        assert (int(last[tok.eos_token_id >> 5]) >> (tok.eos_token_id & 31)) & 1
        assert bool((int(last[opener >> 5]) >> (opener & 31)) & 1) is not one


def test_required_calls_end_where_the_model_ends_them(client):
    """``tool_choice: "required"`` with parallel calls allowed (the default): one question, one
    call, and the answer ends there, as the model ends it."""
    choice = client.chat.completions.create(
        model="tiny-qwen2", messages=[{"role": "user", "content": "What is the weather in Paris right now?"}],
        tools=[WEATHER, TIME], tool_choice="required", max_tokens=200, temperature=0).choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    calls = [(c.function.name, json.loads(c.function.arguments)["city"]) for c in choice.message.tool_calls]
    assert calls == [("get_weather", "Paris")]


def test_tool_parameters_that_refer_to_their_own_parts_are_held_to_them(client):
    """Pydantic writes nested models as ``$defs`` and ``$ref``; a recursive schema refers to its
    root (``#``). Each function's parameters are their own schema: the pointers resolve in them,
    not in the call object around them."""
    query = {"type": "function", "function": {"name": "query", "parameters": {
        "type": "object", "properties": {"location": {"$ref": "#/$defs/Loc"}}, "required": ["location"],
        "$defs": {"Loc": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
                          "required": ["city"], "additionalProperties": False}}}}}
    tree = {"type": "function", "function": {"name": "make_tree", "parameters": {
        "type": "object", "properties": {"label": {"type": "string", "maxLength": 8}, "children": {
            "type": "array", "items": {"$ref": "#"}, "maxItems": 3}},
        "required": ["label", "children"], "additionalProperties": False}}}
    for tool, ask in ((query, "What is the weather in Oslo?"),
                      (tree, "Make a tree: root 'a' with children 'b' and 'c'.")):
        choice = client.chat.completions.create(
            model="tiny-qwen2", messages=[{"role": "user", "content": ask}], tools=[tool, TIME],
            tool_choice={"type": "function", "function": {"name": tool["function"]["name"]}},
            max_tokens=80, temperature=0).choices[0]
        assert choice.finish_reason == "tool_calls", choice.message.content
        arguments = json.loads(choice.message.tool_calls[0].function.arguments)
        jsonschema.validate(arguments, tool["function"]["parameters"])
        assert "name" not in json.dumps(arguments) or tool is query


def test_a_tool_schema_error_names_no_place_in_the_grammar_made_from_it(pair):
    """The calls' grammar is made from the schemas: llguidance's line and column in it mean nothing
    to a client, so a compile error says what is wrong alone."""
    from anyspec.engine.grammar import Grammars
    from anyspec.engine.grammar_text import GrammarError

    tok = pair[0].tokenizer
    grammars = Grammars(tok, pair[0].vocab_size, {tok.eos_token_id})
    broken = {"name": "broken", "parameters": {"type": "object", "properties": {"x": {"$ref": "#/$defs/No"}}}}
    with pytest.raises(GrammarError) as info:
        grammars.tool_calls([broken], one=True, field="tools")
    message = str(info.value)
    assert "Pointer '/$defs/No' does not exist" in message and not re.search(r"\bat \d+\(\d+\)", message)


def test_calls_written_as_text_are_held_to_their_parameters_and_required_makes_several(client):
    """The default target often writes ``<tool_call>`` as text pieces: each call is held to
    ``maxLength`` 2 all the same (it names the cities in two characters), greedy and sampled, as
    the target alone writes them; ``required`` makes as many calls as the model does,
    ``parallel_tool_calls: false`` one."""
    tool = {"type": "function", "function": TWO_LETTER_TIME}
    messages = [{"role": "system", "content": "You may emit several <tool_call> blocks in one answer, one "
                                              "per city."},
                {"role": "user", "content": "Use your tools: what's the local time in Paris, Tokyo and "
                                            "Lima?"}]

    def calls(**settings) -> list[dict]:
        choice = client.chat.completions.create(model="tiny-qwen2", messages=messages, tools=[tool],
                                                max_tokens=120, **{"temperature": 0} | settings).choices[0]
        assert choice.finish_reason == "tool_calls", choice.message.content
        found = [json.loads(c.function.arguments) for c in choice.message.tool_calls]
        for arguments in found:
            jsonschema.validate(arguments, TWO_LETTER_TIME["parameters"])
        return found

    auto = calls()
    assert len(auto) == 3 and auto == calls(extra_body={"speculative": False})
    sampled = dict(temperature=0.8, seed=7)
    assert calls(**sampled) == calls(**sampled, extra_body={"speculative": False})
    assert calls(tool_choice="required") == auto
    assert calls(tool_choice="required", parallel_tool_calls=False) == auto[:1]
