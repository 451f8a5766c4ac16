"""Every bad request gets an OpenAI-style error body with the right status, and the server keeps serving.

The tiny target has a 256-token context, so "beyond the context" is cheap to reach.
"""

import json

import pytest

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

from live_server import MODEL_NAME, live_server, load_engine, one_thread, tiny_pair  # noqa: E402, F401

BODY_LIMIT = 4000
BODY_TIMEOUT = 2.0
OK = {"model": MODEL_NAME, "prompt": "hello", "max_tokens": 2, "temperature": 0}
CHAT_OK = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


@pytest.fixture(scope="module")
def server(tok_qwen2, tok_llama2, tmp_path_factory):
    folders = tiny_pair(tok_qwen2, tok_llama2, tmp_path_factory.mktemp("tiny"))
    with live_server(load_engine(*folders), max_body_bytes=BODY_LIMIT, body_timeout=BODY_TIMEOUT) as (url, _):
        yield url


@pytest.fixture
def post(server):
    """POST to a path; after the test, the server must still answer a good request."""
    with httpx.Client(base_url=server, timeout=60) as http:
        yield lambda path, **kw: http.post(path, **kw)
        assert http.get("/health").json()["status"] == "ok"
        assert http.post("/v1/completions", json=OK).status_code == 200


def assert_error(response, status, param=None, code=None, says=""):
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and says.lower() in error["message"].lower()
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param
    assert error["code"] == code
    return error


def test_invalid_json(post):
    r = post("/v1/completions", content=b'{"prompt": "hi",', headers={"content-type": "application/json"})
    assert_error(r, 400, None, "invalid_json", "not valid JSON")


def test_body_not_an_object(post):
    assert_error(post("/v1/chat/completions", json=["hi"]), 400, None, "invalid_type", "JSON object")


@pytest.mark.parametrize(("field", "value", "want"), [
    ("max_tokens", "ten", "an integer"),
    ("max_tokens", 2.5, "an integer"),
    ("temperature", "hot", "a number"),
    ("stream", "yes", "a boolean"),
    ("stop", 7, "a string or an array"),
    ("seed", True, "an integer"),
    ("model", 3, "a string"),
    ("min_tokens", 1.5, "an integer"),
    ("stop_token_ids", 3, "an array"),
    ("ignore_eos", "yes", "a boolean"),
    ("user", 5, "a string"),
])
def test_wrong_type(post, field, value, want):
    r = post("/v1/completions", json=OK | {field: value})
    assert_error(r, 400, field, "invalid_type", f"expected {want}")


def test_wrong_type_in_stop_list(post):
    assert_error(post("/v1/completions", json=OK | {"stop": ["a", 1]}), 400, "stop", "invalid_type")


def test_messages_not_a_list(post):
    r = post("/v1/chat/completions", json=CHAT_OK | {"messages": "hi"})
    assert_error(r, 400, "messages", "invalid_type", "expected an array")


def test_message_without_role(post):
    r = post("/v1/chat/completions", json=CHAT_OK | {"messages": [{"content": "hi"}]})
    assert_error(r, 400, "messages[0]", "invalid_type", "role")


@pytest.mark.parametrize("max_tokens", [0, -3])
def test_max_tokens_not_positive(post, max_tokens):
    r = post("/v1/completions", json=OK | {"max_tokens": max_tokens})
    assert_error(r, 400, "max_tokens", "invalid_value", "at least 1")


def test_max_completion_tokens_wins_over_max_tokens(post):
    body = CHAT_OK | {"temperature": 0, "max_completion_tokens": 3, "max_tokens": 5, "ignore_eos": True}
    assert post("/v1/chat/completions", json=body).json()["usage"]["completion_tokens"] == 3
    body |= {"max_completion_tokens": 0}
    assert_error(post("/v1/chat/completions", json=body), 400, "max_completion_tokens", "invalid_value")


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_max_tokens_beyond_context(post, path):
    body = OK if path == "/v1/completions" else CHAT_OK
    r = post(path, json=body | {"max_tokens": 256})
    assert_error(r, 400, "max_tokens", "context_length_exceeded", "maximum context length is 256")


def test_prompt_beyond_context(post):
    r = post("/v1/completions", json=OK | {"prompt": "word " * 300})
    assert_error(r, 400, "prompt", "context_length_exceeded", "maximum context length is 256")


def test_empty_prompt(post):
    assert_error(post("/v1/completions", json=OK | {"prompt": ""}), 400, "prompt", "invalid_value", "empty")


def test_missing_prompt(post):
    body = {k: v for k, v in OK.items() if k != "prompt"}
    assert_error(post("/v1/completions", json=body), 400, "prompt", "missing_required_parameter")


@pytest.mark.parametrize(("prompt", "param", "code", "says"), [
    ([], "prompt", "invalid_type", "non-empty array"),
    ({"text": "hi"}, "prompt", "invalid_type", "array of token ids"),
    ([1, 2.5], "prompt", "invalid_type", "array of token ids"),
    ([1, True], "prompt", "invalid_type", "array of token ids"),
    ([1, -1], "prompt", "invalid_value", "token id -1"),
    ([1, 10**9], "prompt", "invalid_value", "token id 1000000000"),
    (["hi", ""], "prompt[1]", "invalid_value", "empty"),
    (["hi", []], "prompt[1]", "invalid_value", "empty"),
    (["hi", [1, None]], "prompt[1]", "invalid_type", "string or an array of token ids"),
    (["hi", "word " * 300], "prompt[1]", "context_length_exceeded", "maximum context length is 256"),
    (["hi"] * 17, "prompt", "invalid_value", "at most 16 on this server"),
])
def test_bad_prompts(post, prompt, param, code, says):
    assert_error(post("/v1/completions", json=OK | {"prompt": prompt}), 400, param, code, says)


def test_prompts_times_n_beyond_the_limit(post):
    r = post("/v1/completions", json=OK | {"prompt": ["a", "b", "c"], "n": 50})
    assert_error(r, 400, "n", "invalid_value", "150 choices; at most 128")


def test_empty_message_list(post):
    r = post("/v1/chat/completions", json=CHAT_OK | {"messages": []})
    assert_error(r, 400, "messages", "empty_array", "non-empty")


def test_unknown_model(post):
    """404 model_not_found, as OpenAI (and vLLM) answer an unknown model."""
    r = post("/v1/chat/completions", json=CHAT_OK | {"model": "gpt-4o"})
    assert_error(r, 404, "model", "model_not_found", "gpt-4o")


def test_oversized_body(post):
    """400 request_too_large (not 413): OpenAI reports request problems as 400 invalid_request_error."""
    r = post("/v1/completions", json=OK | {"prompt": "x" * (BODY_LIMIT + 10)})
    assert_error(r, 400, None, "request_too_large", f"limit of {BODY_LIMIT} bytes")


def test_oversized_body_without_content_length(post):
    def chunks():
        body = json.dumps(OK | {"prompt": "y" * (BODY_LIMIT + 10)}).encode()
        for i in range(0, len(body), 1000):
            yield body[i:i + 1000]

    r = post("/v1/completions", content=chunks(), headers={"content-type": "application/json"})
    assert "content-length" not in r.request.headers
    assert_error(r, 400, None, "request_too_large")


@pytest.mark.parametrize(("n", "says"), [(0, "from 1 to 128"), (129, "from 1 to 128"),
                                         (17, "at most 16 on this server (--queue-size)")])
def test_n_out_of_range(post, n, says):
    assert_error(post("/v1/completions", json=OK | {"n": n}), 400, "n", "invalid_value", says)


@pytest.mark.parametrize(("field", "value"), [("temperature", 2.5), ("temperature", -1)])
def test_temperature_out_of_range(post, field, value):
    r = post("/v1/completions", json=OK | {field: value})
    assert_error(r, 400, field, "invalid_value", "between 0 and 2")


@pytest.mark.parametrize(("field", "value", "says"), [("top_p", 0, "top_p"), ("top_p", 1.5, "top_p"),
                                                      ("stop", [""], "stop"),
                                                      ("min_tokens", -1, "min_tokens"),
                                                      ("min_tokens", 10**6, "from 0 to the most new tokens"),
                                                      ("repetition_penalty", 0, "above 0"),
                                                      ("repetition_penalty", -1.5, "above 0")])
def test_engine_rejects_sampling_setting(post, field, value, says):
    assert_error(post("/v1/completions", json=OK | {field: value}), 400, field, "invalid_value", says)


@pytest.mark.parametrize("seed", [2**64, -(2**63) - 1])
def test_seed_beyond_64_bits(post, seed):
    assert_error(post("/v1/completions", json=OK | {"seed": seed}), 400, "seed", "invalid_value", "64 bits")


@pytest.mark.parametrize(("field", "value", "says"), [
    ("presence_penalty", 2.5, "from -2 to 2"), ("frequency_penalty", -3, "from -2 to 2"),
    ("logit_bias", {"abc": 1}, "token ids from 0 to"), ("logit_bias", {"99999999": 1}, "token ids from 0 to"),
    ("logit_bias", {"-1": 1}, "token ids from 0 to"), ("logit_bias", {"15": 101}, "from -100 to 100"),
    ("logit_bias", {"15": "1"}, "from -100 to 100"), ("logit_bias", {"15": True}, "from -100 to 100"),
    ("stop_token_ids", [1, -2], "token ids from 0 to"), ("stop_token_ids", [10**9], "token ids from 0 to"),
    ("allowed_token_ids", [10**9], "token ids from 0 to"), ("allowed_token_ids", [], "non-empty list")])
def test_penalties_and_logit_bias_out_of_range(post, field, value, says):
    assert_error(post("/v1/completions", json=OK | {field: value}), 400, field, "invalid_value", says)


@pytest.mark.parametrize("value", [-0.1, 1.5])
def test_min_p_out_of_range(post, value):
    r = post("/v1/completions", json=OK | {"min_p": value})
    assert_error(r, 400, "min_p", "invalid_value", "from 0 to 1")


@pytest.mark.parametrize(("field", "value", "says"), [("typical_p", 0, "above 0 and at most 1 (1 = off)"),
                                                     ("typical_p", 1.5, "above 0 and at most 1"),
                                                     ("top_n_sigma", 101, "at most 100 (0 or below = off)"),
                                                     ("top_n_sigma", "2", "number")])
def test_typical_p_and_top_n_sigma_out_of_range(post, field, value, says):
    r = post("/v1/completions", json=OK | {field: value})
    assert_error(r, 400, field, "invalid_type" if isinstance(value, str) else "invalid_value", says)
    assert post("/v1/completions", json=OK | {field: -1 if field == "top_n_sigma" else 1}).status_code == 200


def test_top_k_below_minus_one(post):
    assert_error(post("/v1/completions", json=OK | {"top_k": -5}), 400, "top_k", "invalid_value", "top_k")


@pytest.mark.parametrize(("path", "field", "value", "says"), [
    ("/v1/chat/completions", "echo", True, "completions field"),
    ("/v1/completions", "best_of", 2, "not supported"),
])
def test_unsupported_parameter(post, path, field, value, says):
    body = (OK if path == "/v1/completions" else CHAT_OK) | {field: value}
    assert_error(post(path, json=body), 400, field, "unsupported_parameter", says)


@pytest.mark.parametrize(("path", "extra", "field", "says"), [
    ("/v1/chat/completions", {"top_logprobs": 2}, "top_logprobs", "needs 'logprobs': true"),
    ("/v1/chat/completions", {"logprobs": True, "top_logprobs": 21}, "top_logprobs", "from 0 to 20"),
    ("/v1/chat/completions", {"logprobs": 1}, "logprobs", "boolean"),
    ("/v1/completions", {"logprobs": -1}, "logprobs", "from 0 to 20"),
    ("/v1/completions", {"logprobs": True}, "logprobs", "integer"),
    ("/v1/completions", {"top_logprobs": 2}, "top_logprobs", "chat field"),
    ("/v1/completions", {"logprobs": 2, "echo": True, "stream": True}, "echo", "without 'stream'"),
])
def test_bad_logprobs_are_a_400_naming_the_field(post, path, extra, field, says):
    body = (OK if path == "/v1/completions" else CHAT_OK) | extra
    response = post(path, json=body)
    error = response.json()["error"]
    assert response.status_code == 400 and error["param"] == field and says in error["message"]


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_logprobs_come_with_each_token(post, path):
    chat = path == "/v1/chat/completions"
    body = (CHAT_OK | {"logprobs": True, "top_logprobs": 2}) if chat else (OK | {"logprobs": 2})
    r = post(path, json=body | {"max_tokens": 5, "temperature": 0})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    if chat:
        tokens = choice["logprobs"]["content"]
        spelled = b"".join(bytes(t["bytes"]) for t in tokens)
        assert spelled.decode("utf-8", errors="replace") == choice["message"]["content"]
        assert all(len(t["top_logprobs"]) == 2 for t in tokens)
        assert all(t["top_logprobs"][0]["logprob"] >= t["logprob"] for t in tokens)
    else:
        lp = choice["logprobs"]
        assert len(lp["tokens"]) == len(lp["token_logprobs"]) == r.json()["usage"]["completion_tokens"]
        tops = zip(lp["top_logprobs"], lp["token_logprobs"], strict=True)
        assert all(max(top.values()) >= x for top, x in tops)
        assert lp["text_offset"][0] == 0


def test_chat_template_refusing_messages_is_a_400():
    """A template that raises (as many do on an unknown role) is the request's fault, not a crash."""
    from jinja2 import TemplateError

    from anyspec.server.protocol import ApiError, parse_request

    class Refusing:
        chat_template = "{{ raise_exception('roles must alternate') }}"

        def apply_chat_template(self, *args, **kwargs):
            raise TemplateError("roles must alternate")

    with pytest.raises(ApiError) as info:
        parse_request(CHAT_OK, True, MODEL_NAME, Refusing(), 256, 16)
    assert (info.value.status, info.value.param) == (400, "messages")
    assert "roles must alternate" in info.value.message


def test_unknown_route(post):
    assert_error(post("/v1/embeddings", json={"input": "hi"}), 404, None, None, "not found")


def test_unknown_fields_are_ignored(post):
    r = post("/v1/completions", json=OK | {"user": "me", "some_future_field": {"nested": [1, 2]}})
    assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] in ("stop", "length")


def test_openai_client_raises_bad_request(server):
    client = openai.OpenAI(base_url=server + "/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model=MODEL_NAME, prompt="hi", max_tokens=0)
    assert info.value.status_code == 400 and info.value.body["param"] == "max_tokens"
    with pytest.raises(openai.NotFoundError) as info:
        client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "hi"}])
    assert info.value.body["code"] == "model_not_found"


@pytest.mark.parametrize(("path", "body", "param"), [
    ("/v1/completions", b'{"prompt": "a \\ud800 b", "max_tokens": 2}', "prompt"),
    ("/v1/completions", b'{"prompt": "hi", "stop": ["\\udfff"], "max_tokens": 2}', "stop"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "x\\ud800"}], "max_tokens": 2}',
     "messages[0].content"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": [{"type": "text", "text": '
                             b'"\\udc00"}]}], "max_tokens": 2}', "messages[0].content"),
])
def test_lone_surrogate_is_a_400_naming_the_field(post, path, body, param):
    r = post(path, content=body, headers={"content-type": "application/json"})
    assert_error(r, 400, param, "invalid_value", "lone surrogate")


def test_a_crash_is_a_500_counted_in_metrics(server, monkeypatch):
    """The catch-all handler answers outside the app's own middleware; /metrics still counts it."""
    from anyspec.server import app

    def crash(*args, **kwargs):
        raise RuntimeError("a bug")

    key = 'anyspec_requests_total{path="/v1/completions",status="500"}'

    def count() -> float:
        line = next((x for x in httpx.get(server + "/metrics").text.splitlines() if x.startswith(key)), None)
        return float(line.split()[-1]) if line else 0.0

    before = count()
    monkeypatch.setattr(app, "parse_request", crash)
    with httpx.Client(base_url=server, timeout=60) as http:
        r = http.post("/v1/completions", json=OK)
    assert r.status_code == 500 and r.json()["error"]["type"] == "server_error"
    assert count() == before + 1


@pytest.mark.parametrize(("field", "value", "says"), [
    ("temperature", 1e-300, "temperature must be 0 (greedy) or at least 0.0001"),
    ("top_p", 1e-300, "top_p must be at least 1e-06"),
])
def test_vanishing_sampling_settings_are_a_400(post, field, value, says):
    """Values float32 turns into inf/nan probabilities: refused before the generation starts."""
    assert_error(post("/v1/completions", json=OK | {field: value}), 400, field, "invalid_value", says)


def test_deeply_nested_json_is_a_400(post):
    r = post("/v1/completions", content=b"[" * 3000, headers={"content-type": "application/json"})
    assert_error(r, 400, None, "invalid_json", "nested too deeply")


def test_lone_surrogate_in_model_is_a_400(post):
    r = post("/v1/completions", content=b'{"model": "\\ud800", "prompt": "hi", "max_tokens": 2}',
             headers={"content-type": "application/json"})
    assert_error(r, 400, "model", "invalid_value", "lone surrogate")


def test_unknown_chat_role_is_a_400_naming_the_roles(post):
    body = CHAT_OK | {"messages": [{"role": "wizard", "content": "hi"}]}
    assert_error(post("/v1/chat/completions", json=body), 400, "messages[0].role", "invalid_value",
                 "must be one of system, user, assistant, tool, got 'wizard'")


def test_user_message_with_null_content_is_a_400(post):
    body = CHAT_OK | {"messages": [{"role": "user", "content": None}]}
    assert_error(post("/v1/chat/completions", json=body), 400, "messages[0].content", "invalid_type",
                 "null is allowed only for an assistant message")


def test_legacy_function_calling_is_refused_not_ignored(post):
    r = post("/v1/chat/completions", json=CHAT_OK | {"functions": [{"name": "f", "parameters": {}}]})
    assert_error(r, 400, "functions", "unsupported_parameter", "not supported")


TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}


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
    ("/v1/chat/completions", {"response_format": {"type": "json_object"}, "ignore_eos": True}, "ignore_eos",
     "invalid_value", "the grammar's"),
    ("/v1/completions", {"response_format": {"type": "json_object"}, "min_tokens": 2}, "min_tokens",
     "invalid_value", "the grammar's"),
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


def test_prompt_tokens_beyond_the_servers_cap_are_a_400(tok_qwen2):
    from anyspec.server.protocol import ApiError, parse_request

    parse_request(OK | {"prompt": "one two three"}, False, MODEL_NAME, tok_qwen2, 256, 16,
                  max_prompt_tokens=3)
    with pytest.raises(ApiError) as info:
        parse_request(OK | {"prompt": "one two three four"}, False, MODEL_NAME, tok_qwen2, 256, 16,
                      max_prompt_tokens=3)
    assert (info.value.status, info.value.param, info.value.code) == (400, "prompt", "prompt_too_long")
    assert "4 tokens; this server takes at most 3" in info.value.message


@pytest.mark.parametrize("field", ["top_p", "temperature"])
def test_a_number_beyond_floats_is_a_400_naming_the_field(post, field):
    r = post("/v1/completions", content=json.dumps(OK | {field: 10**400}),
             headers={"content-type": "application/json"})
    error = assert_error(r, 400, field, "invalid_value", f"'{field}' must be")
    assert "an integer of 401 digits" in error["message"]


def test_an_integer_too_long_to_parse_is_named_as_such():
    import asyncio

    from starlette.requests import Request

    from anyspec.server.app import read_json
    from anyspec.server.protocol import ApiError

    body = f'{{"prompt": "hi", "seed": {"7" * 5000}}}'.encode()
    scope = {"type": "http", "method": "POST", "path": "/v1/completions",
             "headers": [(b"content-length", str(len(body)).encode())]}

    async def receive():
        return {"type": "http.request", "body": body, "more_body": False}

    with pytest.raises(ApiError) as err:
        asyncio.run(read_json(Request(scope, receive), 1_000_000))
    assert err.value.status == 400 and err.value.code == "invalid_json"
    assert "has more than 4300 digits" in str(err.value) and "not valid JSON" not in str(err.value)


@pytest.mark.parametrize(("field", "value"), [("repeat_penalty", 1.2), ("mirostat", 2),
                                              ("bad_words", ["x"]), ("skip_special_tokens", False),
                                              ("n_predict", 8)])
def test_sampling_fields_the_server_cannot_honour_are_refused(post, field, value):
    """OpenAI's, and other servers' that would change the answer: refused, not ignored, unless they
    change nothing."""
    assert_error(post("/v1/completions", json=OK | {field: value}), 400, field, "unsupported_parameter",
                 "not supported")
    defaults = {"repeat_penalty": 1, "mirostat": 0, "bad_words": [], "skip_special_tokens": True}
    if field in defaults:
        assert post("/v1/completions", json=OK | {field: defaults[field]}).status_code == 200


def test_a_suffix_needs_fill_in_the_middle_tokens_and_text_prompts(post):
    """The tiny target's tokenizer has no FIM tokens (the real pair's test fills in the middle)."""
    r = post("/v1/completions", json=OK | {"suffix": " end"})
    assert_error(r, 400, "suffix", "unsupported_parameter", "needs a model with fill-in-the-middle tokens")
    assert_error(post("/v1/completions", json=OK | {"prompt": [1, 2], "suffix": "x"}), 400, "suffix",
                 "invalid_value", "text prompts")
    assert post("/v1/completions", json=OK | {"suffix": ""}).status_code == 200


def metric(server: str, path: str, status: int) -> float:
    key = f'anyspec_requests_total{{path="{path}",status="{status}"}}'
    line = next((x for x in httpx.get(server + "/metrics").text.splitlines() if x.startswith(key)), None)
    return float(line.split()[-1]) if line else 0.0


def test_a_client_that_hangs_up_mid_body_is_not_a_500(server):
    import socket
    import time
    from urllib.parse import urlsplit

    where = urlsplit(server)
    before_500, before_499 = metric(server, "/v1/completions", 500), metric(server, "/v1/completions", 499)
    for _ in range(3):
        with socket.create_connection((where.hostname, where.port), timeout=10) as sock:
            sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 1000\r\n\r\n" + b'{"prompt": "half a bo')
    deadline = time.monotonic() + 10
    while metric(server, "/v1/completions", 499) < before_499 + 3 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert metric(server, "/v1/completions", 499) == before_499 + 3
    assert metric(server, "/v1/completions", 500) == before_500


def test_a_body_that_stalls_is_a_408_after_the_timeout(server):
    import socket
    import time
    from urllib.parse import urlsplit

    where = urlsplit(server)
    with socket.create_connection((where.hostname, where.port), timeout=30) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 1000\r\n\r\n" + b'{"prompt": "and then noth')
        t = time.monotonic()
        answer = b""
        while b"\r\n\r\n" not in answer and (chunk := sock.recv(4096)):
            answer += chunk
        waited = time.monotonic() - t
    assert answer.startswith(b"HTTP/1.1 408 "), answer
    assert BODY_TIMEOUT - 0.5 < waited < BODY_TIMEOUT + 10


@pytest.mark.parametrize(("path", "body", "param", "code"), [
    ("/tokenize", {}, "prompt", "missing_required_parameter"),
    ("/tokenize", {"prompt": 7}, "prompt", "invalid_type"),
    ("/tokenize", {"prompt": "hi", "add_special_tokens": False}, "add_special_tokens",
     "unsupported_parameter"),
    ("/tokenize", {"messages": []}, "messages", "empty_array"),
    ("/tokenize", {"prompt": "hi", "model": "other"}, "model", "model_not_found"),
    ("/detokenize", {}, "tokens", "missing_required_parameter"),
    ("/detokenize", {"tokens": [1, -1]}, "tokens", "invalid_value"),
    ("/detokenize", {"tokens": [10**9]}, "tokens", "invalid_value"),
    ("/detokenize", {"tokens": [True]}, "tokens", "invalid_value")])
def test_bad_tokenize_and_detokenize_bodies_name_the_field(post, path, body, param, code):
    r = post(path, json=body)
    assert_error(r, 404 if code == "model_not_found" else 400, param, code)
