"""Structured output and tools asked for wrongly (a bad schema, grammar or tool, a tool_choice naming
no tool, two kinds at once): each is a 400 naming the field, and the server keeps serving."""

import pytest

pytest.importorskip("fastapi")

from live_server import CHAT_OK, OK, assert_error  # noqa: E402


def test_legacy_function_calling_is_refused_not_ignored(post):
    r = post("/v1/chat/completions", json=CHAT_OK | {"functions": [{"name": "f", "parameters": {}}]})
    assert_error(r, 400, "functions", "unsupported_parameter", "not supported")


def test_a_bad_grammar_is_one_short_line_that_quotes_little_of_it(post):
    """A long regex with a syntax error is refused with llguidance's reason and the regex's first
    characters, not all of it; a GBNF grammar nested too deeply for the converter says so."""
    regex = "(unclosed" + "x" * 400
    error = assert_error(post("/v1/completions", json=OK | {"guided_regex": regex}), 400, "guided_regex",
                         "invalid_value", "unclosed group")
    assert len(error["message"]) < 300 and '"(unclosedxxx' in error["message"], error["message"]
    deep = "root ::= " + "(" * 1000 + '"a"' + ")" * 1000
    error = assert_error(post("/v1/chat/completions", json=CHAT_OK | {"guided_grammar": deep}), 400,
                         "guided_grammar", "invalid_value", "nests groups too deeply")
    assert "recursion" not in error["message"]


TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}


PREFILLED = {"messages": [{"role": "user", "content": "A dog as JSON."},
                         {"role": "assistant", "content": '{"name": "Rex"'}], "continue_final_message": True}


def schema_format(schema) -> dict:
    return {"response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}}


@pytest.mark.parametrize(("path", "extra", "param", "code", "says"), [
    ("/v1/chat/completions", schema_format({"type": "nope"}), "response_format.json_schema.schema",
     "invalid_value", "not a valid JSON Schema"),
    ("/v1/completions", schema_format({"$ref": "#/nowhere"}), "response_format.json_schema.schema",
     "invalid_value", "not a valid JSON Schema"),
    ("/v1/chat/completions", schema_format({"not": {"type": "string"}}), "response_format.json_schema.schema",
     "invalid_value", "unsupported JSON Schema feature"),
    ("/v1/chat/completions", {"response_format": {"type": "xml"}}, "response_format.type", "invalid_value",
     "must be one of"),
    ("/v1/chat/completions", {"response_format": {"type": "json_schema", "json_schema": {"schema": {}}}},
     "response_format.json_schema.name", "invalid_value", "non-empty string"),
    ("/v1/chat/completions", {"tools": [{"type": "function", "function": {"parameters": {}}}]},
     "tools[0].function.name", "missing_required_parameter", "is required"),
    ("/v1/chat/completions", {"tools": [TOOL, {"type": "function", "function": {"name": "g", "parameters": {
        "type": "object", "properties": {"a": {"not": {}}}}}}]}, "tools[1].function.parameters",
     "invalid_value", "unsupported JSON Schema feature"),
    ("/v1/chat/completions", {"tools": [TOOL], "tool_choice": {"type": "function", "function": {
        "name": "g"}}}, "tool_choice.function.name", "invalid_value", "'g', which is not in 'tools' (f)"),
    ("/v1/chat/completions", {"tool_choice": "required"}, "tool_choice", "invalid_value", "needs 'tools'"),
    ("/v1/chat/completions", {"tools": [TOOL], "tool_choice": {"type": "allowed_tools", "allowed_tools": {
        "mode": "auto", "tools": []}}}, "tool_choice.type", "unsupported_parameter",
     "'allowed_tools' is not"),
    ("/v1/chat/completions", {"tools": [TOOL], "tool_choice": "required", "response_format": {
        "type": "json_object"}}, "response_format", "invalid_value", "cannot be used together"),
    ("/v1/completions", {"tools": [TOOL]}, "tools", "unsupported_parameter", "a chat field"),
    ("/v1/completions", {"guided_regex": "(unclosed"}, "guided_regex", "invalid_value",
     "not a valid regular expression"),
    ("/v1/completions", {"guided_choice": []}, "guided_choice", "invalid_value", "non-empty array"),
    ("/v1/completions", {"guided_choice": ["a", 1]}, "guided_choice", "invalid_value", "non-empty strings"),
    ("/v1/chat/completions", {"guided_grammar": "start: nope"}, "guided_grammar", "invalid_value",
     "not a valid Lark or GBNF grammar"),
    ("/v1/chat/completions", {"guided_json": "{not json"}, "guided_json", "invalid_value", "not valid JSON"),
    ("/v1/completions", {"guided_json": False}, "guided_json", "invalid_value", "the schema false"),
    ("/v1/completions", {"guided_grammar": 'root ::= "a" b'}, "guided_grammar", "invalid_value",
     "not a valid GBNF grammar (Rule 'b' not found)"),
    ("/v1/chat/completions", {"grammar": 'root ::= "a'}, "grammar", "invalid_value",
     "not a valid GBNF grammar (Unexpected end of input"),
    ("/v1/completions", {"json_schema": {"type": "nope"}}, "json_schema", "invalid_value",
     "not a valid JSON Schema"),
    ("/v1/chat/completions", {"grammar": 'root ::= "a"', "guided_regex": "a"}, "grammar", "invalid_value",
     "'guided_regex' and 'grammar' cannot be used together"),
    ("/v1/chat/completions", {"json_schema": {}, "response_format": {"type": "json_object"}},
     "response_format", "invalid_value", "'response_format' and 'json_schema' cannot be used together"),
    ("/v1/completions", {"guided_regex": "a", "guided_choice": ["b"]}, "guided_choice", "invalid_value",
     "cannot be used together"),
    ("/v1/completions", {"structured_outputs": {"regex": "a", "choice": ["b"]}}, "structured_outputs.choice",
     "invalid_value", "cannot be used together"),
    ("/v1/completions", {"structured_outputs": {"structural_tag": "x"}}, "structured_outputs.structural_tag",
     "unsupported_parameter", "not supported"),
    ("/v1/completions", {"structured_outputs": "regex"}, "structured_outputs", "invalid_type", "an object"),
    ("/v1/chat/completions", {"guided_regex": "a", "response_format": {"type": "json_object"}},
     "response_format", "invalid_value", "cannot be used together"),
    ("/v1/chat/completions", {"guided_choice": ["a"], "tools": [TOOL]}, "tools", "invalid_value",
     "cannot be used together"),
    ("/v1/chat/completions", {"guided_regex": "(", "response_format": {"type": "json_object"}},
     "response_format", "invalid_value", "cannot be used together"),  # told before the regex compiles
    ("/v1/chat/completions", {"response_format": {"type": "json_object"}, "ignore_eos": True}, "ignore_eos",
     "invalid_value", "the grammar's"),
    ("/v1/completions", {"response_format": {"type": "json_object"}, "min_tokens": 2}, "min_tokens",
     "invalid_value", "the grammar's"),
    ("/v1/chat/completions", {"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
     "response_format.json_schema.schema", "missing_required_parameter", "is required"),
    ("/v1/completions", {"response_format": {"type": "json_schema", "json_schema": {"name": "x",
                                                                                    "schema": None}}},
     "response_format.json_schema.schema", "missing_required_parameter", "is required"),
    ("/v1/completions", {"response_format": {"type": "json_object", "schema": {"type": "nope"}}},
     "response_format.schema", "invalid_value", "not a valid JSON Schema"),
    ("/v1/completions", {"structured_outputs": {}}, "structured_outputs", "invalid_value",
     "asks for nothing; it takes one of json, regex, choice, grammar or json_object: true"),
    ("/v1/chat/completions", {"structured_outputs": {"json_object": False, "regex": None}},
     "structured_outputs", "invalid_value", "asks for nothing"),
    ("/v1/chat/completions", PREFILLED | {"response_format": {"type": "json_object"}},
     "continue_final_message", "invalid_value", "'continue_final_message' (a prefilled assistant message) "
     "and 'response_format' cannot be used together"),
    ("/v1/chat/completions", PREFILLED | {"guided_regex": "[a-z]+"}, "continue_final_message",
     "invalid_value", "and 'guided_regex' cannot be used together"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Call f."}, {
        "role": "assistant", "content": '<tool_call>\n{"name": "f", "arguments": {"a'}],
        "continue_final_message": True, "tools": [TOOL]}, "continue_final_message", "invalid_value",
     "ends inside a <tool_call>"),
])
def test_bad_structured_output_fields_are_400s_naming_the_field(post, path, extra, param, code, says):
    body = (OK if path == "/v1/completions" else CHAT_OK) | extra
    assert_error(post(path, json=body), 400, param, code, says)


def test_tools_on_a_template_without_tool_support_are_a_400(post):
    r = post("/v1/chat/completions", json=CHAT_OK | {"tools": [TOOL]})
    assert_error(r, 400, "tools", "unsupported_parameter", "chat template has no tool support")


def test_their_harmless_defaults_are_accepted(post):
    body = CHAT_OK | {"tools": [], "tool_choice": "auto", "response_format": {"type": "text"}}
    assert post("/v1/chat/completions", json=body).status_code == 200


def function(**fields) -> list[dict]:
    return [{"type": "function", "function": {"name": "f"} | fields}]


def called(**call) -> dict:
    """Messages whose first is an assistant's with the one tool call ``call``."""
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}} | call
    return {"messages": [{"role": "assistant", "content": None, "tool_calls": [call]},
                         {"role": "user", "content": "hi"}]}


@pytest.mark.parametrize(("extra", "param"), [
    ({"tools": False}, "tools"), ({"tools": 0}, "tools"), ({"tools": ""}, "tools"), ({"tools": {}}, "tools"),
    ({"tools": False, "guided_regex": "a+"}, "tools"),
    ({"tools": function(parameters=[])}, "tools[0].function.parameters"),
    ({"tools": function(parameters=0)}, "tools[0].function.parameters"),
    ({"tools": function(parameters=True)}, "tools[0].function.parameters"),
    ({"tools": function(description=5)}, "tools[0].function.description"),
    ({"tools": function(strict="yes")}, "tools[0].function.strict"),
    ({"messages": [{"role": "user", "content": "hi", "name": 5}]}, "messages[0].name"),
    ({"messages": [{"role": "user", "content": "hi", "name": ["bob"]}]}, "messages[0].name"),
    ({"messages": [{"role": "user", "content": "hi"}, {"role": "tool", "content": "x", "tool_call_id": 5}]},
     "messages[1].tool_call_id"),
    (called(id=5), "messages[0].tool_calls[0].id"),
    (called(function={"name": "f", "arguments": 5}), "messages[0].tool_calls[0].function.arguments"),
    ({"structured_outputs": {"regex": "a+", "json_object": 0}}, "structured_outputs.json_object"),
    ({"structured_outputs": {"json_object": 1}}, "structured_outputs.json_object"),
])
def test_a_wrong_type_is_a_400_naming_the_field_not_taken_as_absent(post, extra, param):
    assert_error(post("/v1/chat/completions", json=CHAT_OK | extra), 400, param, "invalid_type")


def test_null_is_still_absent_and_a_name_is_taken(post):
    body = CHAT_OK | {"tools": None, "messages": [{"role": "user", "content": "hi", "name": None}]}
    assert post("/v1/chat/completions", json=body).status_code == 200
    body["messages"][0]["name"] = "bob"
    assert post("/v1/chat/completions", json=body).status_code == 200


def test_llama_cpps_json_object_with_a_schema_is_held_to_the_schema(post):
    """llama.cpp reads ``{"type": "json_object", "schema": {...}}`` as an answer that matches the schema."""
    fixed = {"type": "object", "properties": {"k": {"const": "fixed"}}, "required": ["k"],
             "additionalProperties": False}
    body = CHAT_OK | {"max_tokens": 16, "temperature": 0,
                      "response_format": {"type": "json_object", "schema": fixed}}
    r = post("/v1/chat/completions", json=body)
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == '{"k": "fixed"}', r.text


def test_a_prefilled_message_without_a_format_goes_on(post):
    body = CHAT_OK | PREFILLED | {"max_tokens": 4}
    assert post("/v1/chat/completions", json=body).status_code == 200
