"""Grammars and schemas past llguidance's limits, and constraints no answer can meet, over real HTTP:
each is a 400 naming its field, in one line, before any generation starts, and the server lives on."""

import time

import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

from live_server import CHAT_OK, MODEL_NAME, OK  # noqa: E402


def deep(depth: int) -> dict:
    schema = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"a": schema}, "required": ["a"]}
    return schema


DEEP = deep(64)
CHAIN = "start: r0\n" + "".join(f"r{i}: r{i + 1}\n" for i in range(3000)) + 'r3000: "a"\n'
CHAT = "/v1/chat/completions"


def post(server, path: str, body: dict) -> httpx.Response:
    return httpx.post(server + path, json=body, timeout=120)


@pytest.mark.parametrize(("path", "body", "param"), [
    (CHAT, CHAT_OK | {"response_format": {"type": "json_schema",
                                          "json_schema": {"name": "s", "schema": DEEP}}},
     "response_format.json_schema.schema"),
    ("/v1/completions", OK | {"guided_json": DEEP}, "guided_json"),
    (CHAT, CHAT_OK | {"tools": [{"type": "function", "function": {"name": "f", "parameters": DEEP}}]},
     "tools[0].function.parameters"),
    ("/tokenize", {"model": MODEL_NAME, "messages": CHAT_OK["messages"],
                   "tools": [{"type": "function", "function": {"name": "f", "parameters": DEEP}}]},
     "tools[0].function.parameters"),
    ("/v1/responses", {"model": MODEL_NAME, "input": "hi", "max_output_tokens": 2,
                       "text": {"format": {"type": "json_schema", "name": "s", "schema": DEEP}}},
     "text.format.schema"),
    ("/v1/responses", {"model": MODEL_NAME, "input": "hi", "max_output_tokens": 2,
                       "tools": [{"type": "function", "name": "f", "parameters": DEEP}]},
     "tools[0].parameters"),
])
def test_a_schema_nested_too_deep_is_a_400_naming_its_field(server, path, body, param):
    r = post(server, path, body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and "nests objects and arrays" in error["message"]


@pytest.mark.parametrize("body", [
    {"tools": [{"name": "f", "input_schema": DEEP}]},
    {"output_config": {"format": {"type": "json_schema", "schema": DEEP}}},
])
def test_a_schema_nested_too_deep_is_a_400_in_anthropics_form(server, body):
    r = post(server, "/v1/messages", {"model": MODEL_NAME, "max_tokens": 2,
                                       "messages": [{"role": "user", "content": "hi"}]} | body)
    assert r.status_code == 400 and "nests objects and arrays" in r.json()["error"]["message"], r.text


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(("field", "value"), [("guided_regex", "(a{1000}){1000}"),
                                              ("guided_grammar", 'root ::= "a"{1000000}')])
def test_a_grammar_too_complex_for_the_lexer_is_a_400_before_generation(server, field, value, stream):
    r = post(server, CHAT, CHAT_OK | {field: value, "stream": stream})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == field and "too large or too complex" in error["message"]
    assert "\n" not in error["message"] and "<state>" not in error["message"]


def test_a_long_chain_of_rules_is_compiled_off_the_servers_stack(server):
    started = time.monotonic()
    r = post(server, CHAT, CHAT_OK | {"guided_grammar": CHAIN, "max_tokens": 4})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] == "a"
    assert time.monotonic() - started < 60


@pytest.mark.parametrize("grammar", [{"response_format": {"type": "json_object"}},
                                     {"guided_choice": ["yes", "no"]}, {"guided_regex": "[a-z]+"}])
@pytest.mark.parametrize("speculative", [True, False])
def test_allowed_token_ids_with_a_grammar_is_a_400(server, grammar, speculative):
    body = CHAT_OK | grammar | {"allowed_token_ids": [0, 1, 2], "speculative": speculative}
    r = post(server, CHAT, body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "allowed_token_ids"


@pytest.mark.parametrize("holding", [{"min_tokens": 8}, {"ignore_eos": True},
                                     {"min_tokens": 2, "stop_token_ids": [7]}])
def test_allowed_token_ids_of_held_back_tokens_alone_is_a_400(server, tok_qwen2, holding):
    allowed = [tok_qwen2.eos_token_id, *holding.get("stop_token_ids", [])]  # the tiny target's end token
    body = OK | {"max_tokens": 8, "allowed_token_ids": allowed} | holding
    r = post(server, "/v1/completions", body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "allowed_token_ids"
    assert post(server, "/v1/completions", body | {"allowed_token_ids": [*allowed, 11]}).status_code == 200
