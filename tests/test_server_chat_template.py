"""How a chat request is rendered beyond its messages: an answer that continues the last message
(vLLM's ``continue_final_message``, Anthropic's prefill, the library's ``prefix``), the template's own
variables (``chat_template_kwargs``), the ``developer`` role, and the fields refused rather than
ignored. Real tokenizer (Qwen2's template), tiny models over real HTTP."""

import copy
import functools
import re

import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

from live_server import CHAT_OK, MODEL_NAME, assert_error, greedy  # noqa: E402

from anyspec.errors import ConfigError  # noqa: E402
from anyspec.server.fields import ApiError  # noqa: E402
from anyspec.server.protocol import parse_request  # noqa: E402

QUESTION = {"role": "user", "content": "List three colors."}
PARTIAL = {"role": "assistant", "content": '["red",'}


def nested(levels: int) -> list:
    """An array ``levels`` deep."""
    return functools.reduce(lambda v, _: [v], range(levels), 1)


def parsed(tokenizer, **body):
    body = {"model": MODEL_NAME, "max_tokens": 4} | body
    return parse_request(body, True, (MODEL_NAME,), tokenizer, 256, 16)


def refused(tokenizer, param, says, **body):
    with pytest.raises(ApiError) as info:
        parsed(tokenizer, **body)
    assert info.value.status == 400 and info.value.param == param and says in info.value.message
    return info.value


def test_continue_final_message_ends_the_prompt_inside_the_last_message(tok_qwen2):
    go_on = parsed(tok_qwen2, messages=[QUESTION, PARTIAL], continue_final_message=True).prompts[0]
    answer = parsed(tok_qwen2, messages=[QUESTION, PARTIAL]).prompts[0]
    assert go_on.text.endswith('<|im_start|>assistant\n["red",') and go_on.sent[-1]["prefix"] is True
    assert answer.text.endswith('["red",<|im_end|>\n<|im_start|>assistant\n')
    assert "prefix" not in answer.sent[-1]
    assert go_on.ids == tok_qwen2.encode(go_on.text) and len(go_on.ids) < len(answer.ids)
    with_flag = parsed(tok_qwen2, messages=[QUESTION, PARTIAL], continue_final_message=True,
                       add_generation_prompt=False).prompts[0]
    assert with_flag.ids == go_on.ids


@pytest.mark.parametrize(("body", "param", "says"), [
    ({"messages": [QUESTION, PARTIAL], "continue_final_message": True, "add_generation_prompt": True},
     "add_generation_prompt", "cannot both be true"),
    ({"messages": [QUESTION], "add_generation_prompt": False}, "add_generation_prompt",
     "only with 'continue_final_message'"),
    ({"messages": [QUESTION], "continue_final_message": True}, "continue_final_message",
     "the last message to be an assistant's"),
    ({"messages": [QUESTION, PARTIAL], "continue_final_message": "yes"}, "continue_final_message",
     "expected a boolean"),
    ({"messages": [QUESTION], "chat_template_kwargs": {"tokenize": True}}, "chat_template_kwargs.tokenize",
     "a parameter of the rendering"),
    ({"messages": [QUESTION], "chat_template_kwargs": ["x"]}, "chat_template_kwargs", "expected an object"),
    ({"messages": [QUESTION], "chat_template_kwargs": {"messages": []}}, "chat_template_kwargs.messages",
     "the rendering sets it itself"),
    ({"messages": [QUESTION], "chat_template_kwargs": {"documents": []}}, "chat_template_kwargs.documents",
     "cannot set 'documents'"),
    ({"messages": [QUESTION], "chat_template_kwargs": {"raise_exception": 1}},
     "chat_template_kwargs.raise_exception", "the rendering sets it itself"),
    ({"messages": [QUESTION], "chat_template_kwargs": {"deep": nested(900)}},
     "chat_template_kwargs", "nested more than 64 levels deep"),
    ({"messages": [QUESTION], "stream_options": {"include_usage": True}}, "stream_options",
     "only with 'stream': true"),
    ({"messages": [QUESTION], "modalities": ["text", "audio"]}, "modalities", "not supported"),
    ({"messages": [QUESTION], "return_tokens_as_token_ids": True}, "return_tokens_as_token_ids",
     "not supported"),
])
def test_rendering_fields_that_cannot_be_honoured_are_refused(tok_qwen2, body, param, says):
    refused(tok_qwen2, param, says, **body)


def test_chat_template_kwargs_reach_the_template(tok_qwen2):
    tokenizer = copy.copy(tok_qwen2)
    tokenizer.chat_template = ("{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}{% if "
                               "add_generation_prompt %}{{ tone | default('plain') }} assistant:{% endif %}")
    plain = parsed(tokenizer, messages=[QUESTION]).prompts[0].text
    warm = parsed(tokenizer, messages=[QUESTION], chat_template_kwargs={"tone": "warm", "deep": nested(63)}
                  ).prompts[0].text
    assert plain.endswith("plain assistant:") and warm.endswith("warm assistant:")
    assert parsed(tokenizer, messages=[QUESTION], modalities=["text"]).prompts[0].text == plain


def test_a_developer_message_is_a_system_message(tok_qwen2):
    developer = parsed(tok_qwen2, messages=[{"role": "developer", "content": "Be terse."}, QUESTION])
    system = parsed(tok_qwen2, messages=[{"role": "system", "content": "Be terse."}, QUESTION])
    assert developer.prompts[0].ids == system.prompts[0].ids
    assert "<|im_start|>system\nBe terse." in developer.prompts[0].text


@pytest.mark.parametrize(("messages", "says"), [
    ([PARTIAL | {"prefix": True}, QUESTION], "message 0's prefix"),
    ([QUESTION | {"prefix": True}], "message 0's prefix"),
    ([QUESTION, PARTIAL | {"prefix": "yes"}], "message 1's prefix"),
    ([QUESTION, {"role": "assistant", "content": "", "prefix": True}], "message 1's prefix")])
def test_the_library_takes_prefix_on_the_last_assistant_message_only(no_loading, messages, says):
    import anyspec

    with pytest.raises(ConfigError, match=re.escape(says)):
        anyspec.generate(messages)


def test_the_answer_continues_the_last_message_over_http(server, reference):
    """Chat completions with ``continue_final_message`` and Anthropic's Messages API with a last
    assistant message give the engine's answer to the messages with that message marked ``prefix``."""
    alone = reference.generate([QUESTION, PARTIAL | {"prefix": True}], greedy(8))
    other = reference.generate([QUESTION, PARTIAL], greedy(8))
    assert alone.stats.prompt_tokens < other.stats.prompt_tokens  # no end of turn, no new turn
    chat = httpx.post(server + "/v1/chat/completions", timeout=120, json=CHAT_OK | {
        "messages": [QUESTION, PARTIAL], "continue_final_message": True, "max_tokens": 8,
        "temperature": 0}).json()
    assert chat["choices"][0]["message"]["content"] == alone.text
    assert chat["usage"]["prompt_tokens"] == alone.stats.prompt_tokens
    message = httpx.post(server + "/v1/messages", timeout=120, json={
        "model": MODEL_NAME, "max_tokens": 8, "temperature": 0, "messages": [QUESTION, PARTIAL]}).json()
    assert message["content"] == [{"type": "text", "text": alone.text}]
    usage = message["usage"]
    assert usage["input_tokens"] + usage["cache_read_input_tokens"] == alone.stats.prompt_tokens


def test_refusals_name_the_field_over_http(post):
    r = post("/v1/chat/completions", json=CHAT_OK | {"add_generation_prompt": False})
    assert_error(r, 400, "add_generation_prompt", "unsupported_parameter",
                 "only with 'continue_final_message'")
