"""Every bad request gets an OpenAI-style error body with the right status, and the server keeps serving.

The tiny target has a 256-token context, so "beyond the context" is cheap to reach.
"""

import copy

import pytest

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

from live_server import CHAT_OK, MODEL_NAME, OK, assert_error, live_server, load_engine, one_thread  # noqa: E402, F401


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


def test_a_wrong_type_inside_stream_options_is_named_by_its_path(post):
    body = OK | {"stream": True, "stream_options": {"include_usage": "yes"}}
    assert_error(post("/v1/completions", json=body), 400, "stream_options.include_usage", "invalid_type",
                 "'stream_options.include_usage': expected a boolean")


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


def test_max_completion_tokens_beyond_context_is_named_as_sent(post):
    r = post("/v1/chat/completions", json=CHAT_OK | {"max_completion_tokens": 256})
    assert_error(r, 400, "max_completion_tokens", "context_length_exceeded", "or max_completion_tokens.")


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


@pytest.mark.parametrize("seed", [2**64, -2, -(2**63)])
def test_a_seed_beyond_64_bits_or_below_minus_one_is_a_400(post, seed):
    """A seed is 0 to 2**64 - 1, or -1 for none: a negative one is not read as its 64 bits."""
    assert_error(post("/v1/completions", json=OK | {"seed": seed}), 400, "seed", "invalid_value",
                 "from 0 to 2**64 - 1, or -1 for none")


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


@pytest.mark.parametrize("count", [0, 1])
def test_completions_top_logprobs_hold_the_chosen_token(post, count):
    """OpenAI's legacy API always adds the chosen token to ``top_logprobs``: ``logprobs`` + 1 entries
    where a sampled token is not among the likeliest (tiny random models sample many such)."""
    r = post("/v1/completions", json=OK | {"logprobs": count, "max_tokens": 12, "temperature": 1.5,
                                           "seed": 3})
    lp = r.json()["choices"][0]["logprobs"]
    for token, x, top in zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"], strict=True):
        assert top[token] == x and len(top) <= count + 1
    assert any(len(top) == count + 1 for top in lp["top_logprobs"])


def test_completions_logprobs_of_tokens_inside_a_character():
    """A token whose bytes end inside a UTF-8 character is written ``bytes:\\xNN`` (OpenAI's legacy
    form), keeps its own key among ``top_logprobs``, and every ``text_offset`` indexes the text, the
    count carried from one streamed chunk to the next."""
    from anyspec.server.answers import logprobs_json

    pieces = [b"!", b" \xf0\x9f", b"\x8d", b"\x95", "\U0001f354".encode(), b"\n"]
    entries = [(b, -0.5, [(b, -0.5), (b"\x8c", -1.0), (b"\x8e", -2.0)]) for b in pieces]
    whole, _ = logprobs_json(False, entries)
    text = b"".join(pieces).decode()
    assert whole["tokens"] == ["!", "bytes: \\xf0\\x9f", "bytes:\\x8d", "bytes:\\x95", "\U0001f354", "\n"]
    assert whole["text_offset"] == [0, 1, 2, 2, 3, 4] and text[2] == "\U0001f355" and text[3] == "\U0001f354"
    assert [len(top) for top in whole["top_logprobs"]] == [3] * 6  # three bytes, three keys
    first, at = logprobs_json(False, entries[:2])
    second, _ = logprobs_json(False, entries[2:], at)
    assert first["text_offset"] + second["text_offset"] == whole["text_offset"]


def test_chat_template_refusing_messages_is_a_400():
    """A template that raises (as many do on an unknown role) is the request's fault, not a crash."""
    from jinja2 import TemplateError

    from anyspec.server.fields import ApiError
    from anyspec.server.protocol import parse_request

    class Refusing:
        chat_template = "{{ raise_exception('roles must alternate') }}"

        def apply_chat_template(self, *args, **kwargs):
            raise TemplateError("roles must alternate")

    with pytest.raises(ApiError) as info:
        parse_request(CHAT_OK, True, (MODEL_NAME,), Refusing(), 256, 16)
    assert (info.value.status, info.value.param) == (400, "messages")
    assert "roles must alternate" in info.value.message


def test_unknown_fields_are_ignored(post):
    r = post("/v1/completions", json=OK | {"user": "me", "some_future_field": {"nested": [1, 2]}})
    assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] in ("stop", "length")


def test_openai_client_raises_bad_request(strict_server):
    client = openai.OpenAI(base_url=strict_server + "/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model=MODEL_NAME, prompt="hi", max_tokens=0)
    assert info.value.status_code == 400 and info.value.body["param"] == "max_tokens"
    with pytest.raises(openai.NotFoundError) as info:
        client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "hi"}])
    assert info.value.body["code"] == "model_not_found"


@pytest.mark.parametrize(("path", "body", "param"), [
    ("/v1/completions", b'{"prompt": "a \\ud800 b", "max_tokens": 2}', "prompt"),
    ("/v1/completions", b'{"prompt": "hi", "stop": ["\\udfff"], "max_tokens": 2}', "stop[0]"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "x\\ud800"}], "max_tokens": 2}',
     "messages[0].content"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": [{"type": "text", "text": '
                             b'"\\udc00"}]}], "max_tokens": 2}', "messages[0].content[0].text"),
    ("/v1/completions", b'{"prompt": "hi", "guided_regex": "a\\ud800", "max_tokens": 2}', "guided_regex"),
    ("/v1/completions", b'{"prompt": "hi", "guided_json": {"enum": ["\\ud800"]}, "max_tokens": 2}',
     "guided_json.enum[0]"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": '
                             b'"function", "function": {"name": "f", "description": "\\ud800"}}]}',
     "tools[0].function.description"),
    ("/tokenize", b'{"prompt": "\\udfff"}', "prompt"),
    ("/v1/completions", b'{"prompt": "hi", "logit_bias": {"\\ud800": 1}}', "logit_bias"),
    ("/v1/completions", b'{"prompt": "\\ud83d\\ude00 ok", "max_tokens": 1, "stop": "\\udfff"}', "stop"),
])
def test_lone_surrogate_is_a_400_naming_the_field(post, path, body, param):
    r = post(path, content=body, headers={"content-type": "application/json"})
    assert_error(r, 400, param, "invalid_value", "lone surrogate")


@pytest.mark.parametrize(("field", "value", "says"), [
    ("temperature", 1e-300, "temperature must be 0 (greedy) or at least 0.0001"),
    ("top_p", 1e-300, "top_p must be at least 1e-06"),
])
def test_vanishing_sampling_settings_are_a_400(post, field, value, says):
    """Values float32 turns into inf/nan probabilities: refused before the generation starts."""
    assert_error(post("/v1/completions", json=OK | {field: value}), 400, field, "invalid_value", says)


def test_lone_surrogate_in_a_messages_request_names_its_field(post):
    body = b'{"system": "s\\ud800", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}'
    r = post("/v1/messages", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    assert r.json()["error"]["message"].startswith("'system' is not valid Unicode text (a lone surrogate")


def test_lone_surrogate_in_model_is_a_400(post):
    r = post("/v1/completions", content=b'{"model": "\\ud800", "prompt": "hi", "max_tokens": 2}',
             headers={"content-type": "application/json"})
    assert_error(r, 400, "model", "invalid_value", "lone surrogate")


def test_unknown_chat_role_is_a_400_naming_the_roles(post):
    body = CHAT_OK | {"messages": [{"role": "wizard", "content": "hi"}]}
    assert_error(post("/v1/chat/completions", json=body), 400, "messages[0].role", "invalid_value",
                 "must be one of system, user, assistant, tool, developer, got 'wizard'")


def test_user_message_with_null_content_is_a_400(post):
    body = CHAT_OK | {"messages": [{"role": "user", "content": None}]}
    assert_error(post("/v1/chat/completions", json=body), 400, "messages[0].content", "invalid_type",
                 "null is allowed only for an assistant message")


def test_prompt_tokens_beyond_the_servers_cap_are_a_400(tok_qwen2):
    from anyspec.server.fields import ApiError
    from anyspec.server.protocol import parse_request

    parse_request(OK | {"prompt": "one two three"}, False, (MODEL_NAME,), tok_qwen2, 256, 16,
                  max_prompt_tokens=3)
    with pytest.raises(ApiError) as info:
        parse_request(OK | {"prompt": "one two three four"}, False, (MODEL_NAME,), tok_qwen2, 256, 16,
                      max_prompt_tokens=3)
    assert (info.value.status, info.value.param, info.value.code) == (400, "prompt", "prompt_too_long")
    assert "4 tokens; this server takes at most 3" in info.value.message


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


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
@pytest.mark.parametrize(("field", "value", "alike"), [
    ("best_of", True, 1), ("mirostat", False, 0), ("skip_special_tokens", 1, True),
    ("use_beam_search", 0, False), ("repeat_penalty", True, 1.0)])
def test_a_harmless_value_of_another_type_is_still_refused(post, path, field, value, alike):
    """``true`` is not ``1`` and ``0`` is not ``false``: only a value that changes nothing, of its
    type (``1.0`` for ``1``), is let through."""
    body = (OK if path == "/v1/completions" else CHAT_OK) | {field: value}
    assert_error(post(path, json=body), 400, field, "unsupported_parameter", "not supported")
    assert post(path, json=body | {field: alike}).status_code == 200


def test_a_suffix_needs_fill_in_the_middle_tokens_and_text_prompts(post):
    """The tiny target's tokenizer has no FIM tokens (the real pair's test fills in the middle)."""
    r = post("/v1/completions", json=OK | {"suffix": " end"})
    assert_error(r, 400, "suffix", "unsupported_parameter", "needs a model with fill-in-the-middle tokens")
    assert_error(post("/v1/completions", json=OK | {"prompt": [1, 2], "suffix": "x"}), 400, "suffix",
                 "invalid_value", "text prompts")
    assert post("/v1/completions", json=OK | {"suffix": ""}).status_code == 200


def test_echo_with_a_suffix_is_refused(post, tok_qwen2):
    """The prompt a suffix runs is the fill-in-the-middle one, which ``echo`` would give back instead
    of the prompt sent: refused, as OpenAI refuses it, with FIM tokens or without."""
    from anyspec.server.fields import ApiError
    from anyspec.server.protocol import parse_request

    body = OK | {"prompt": "def f(", "suffix": "  return 1\n", "echo": True, "max_tokens": 3}
    assert_error(post("/v1/completions", json=body), 400, "suffix", "unsupported_parameter",
                 "'echo' cannot be used with 'suffix'")
    fim = copy.deepcopy(tok_qwen2)
    fim.add_tokens(["<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"], special_tokens=True)
    infill = parse_request(body | {"echo": False}, False, (MODEL_NAME,), fim, 256, 16).prompts[0]
    assert infill.sent.startswith("<|fim_prefix|>def f(")
    with pytest.raises(ApiError) as refused:
        parse_request(body, False, (MODEL_NAME,), fim, 256, 16)
    assert refused.value.param == "suffix" and "'echo'" in refused.value.message
    echoed = post("/v1/completions", json=body | {"suffix": ""}).json()["choices"][0]["text"]
    assert echoed.startswith("def f(")


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


def test_a_prediction_is_encoded_with_the_prompt(tok_qwen2):
    """The prediction's tokens are counted where the request is read, not on the generations'
    thread, where a long one would hold up every generation of the batch."""
    from anyspec.server.protocol import parse_request

    text = "def add(a, b):\n    return a + b\n" * 50
    parts = [{"type": "text", "text": text[:7]}, {"type": "text", "text": text[7:]}]
    for content in (text, parts):
        parsed = parse_request(OK | {"prompt": "one", "prediction": {"type": "content", "content": content}},
                               False, (MODEL_NAME,), tok_qwen2, 2048, 16)
        assert parsed.params.prediction == tok_qwen2.encode(text, add_special_tokens=False)
    empty = parse_request(OK | {"prompt": "one", "prediction": {"type": "content", "content": ""}}, False,
                          (MODEL_NAME,), tok_qwen2, 2048, 16)
    assert empty.params.prediction is None
