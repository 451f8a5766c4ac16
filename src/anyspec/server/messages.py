"""Anthropic's Messages API (``POST /v1/messages``) on the chat pipeline, as ``responses.py`` does
OpenAI's Responses: a request is read into a chat completion's body (``chat_body``), generated as
one, and answered as a message, whole (``whole``) or as the Messages stream's events (``events``).

``system`` (a string or text blocks) is a system message; ``messages`` hold text blocks, the
assistant's ``tool_use`` blocks (the chat's ``tool_calls``) and the user's ``tool_result`` blocks
(tool messages, ``is_error`` not among what they hold); ``tools`` (``name``, ``description``,
``input_schema``) and ``tool_choice`` (``auto``, ``any``, ``tool``, ``none``;
``disable_parallel_tool_use``) are the chat's function tools; ``output_config.format`` (a JSON
Schema) its ``response_format``; ``stop_sequences`` its ``stop``. A last message of the assistant's
with text is continued: the answer goes on from it (Anthropic's prefill). ``cache_control`` and
``output_config.effort`` change nothing here (prompts are cached anyway; the models do not reason
first). The chat's own fields (``logprobs``, ``stop``, ``response_format``, ...) answer 400: a
message has its own or cannot carry what they ask for; its sampling extensions (``seed``,
``min_p``, ``speculative``, ...) pass through. ``stop_reason`` is ``end_turn``, ``max_tokens``,
``stop_sequence`` (with ``stop_sequence``) or ``tool_use``. ``usage.input_tokens`` counts the
prompt tokens not read from the prefix cache, ``cache_read_input_tokens`` those that were
(``cache_creation_input_tokens`` is 0: no request writes a cache entry of its own). Errors are
Anthropic's ``{"type": "error", "error": {"type", "message"}}``.
"""

from __future__ import annotations

import json
import uuid

from anyspec.server.answers import as_api_error, bad, choice_stats, usage
from anyspec.server.fields import ApiError, body_field, check_own_fields, number
from anyspec.server.scheduler import Outcome
from anyspec.server.structured import CallStream, read_tool_calls

OWN = ("system", "messages", "tools", "tool_choice", "stop_sequences", "metadata", "thinking", "service_tier",
       "max_tokens", "output_config", "cache_control")
REFUSED = {"thinking": (None, {"type": "disabled"}), "container": (None,), "mcp_servers": (None, []),
           "n": (None, 1)}  # a message is one answer: the chat's n would run answers none receives
CHAT_FIELDS = {  # the chat's own fields, which a message has its own for or cannot answer with
    "stop": "stop_sequences", "max_completion_tokens": "max_tokens",
    "response_format": "output_config.format",
    "parallel_tool_calls": "tool_choice.disable_parallel_tool_use", "continue_final_message": "messages",
    "add_generation_prompt": "messages", "functions": "tools", "function_call": "tool_choice",
    "logprobs": None, "top_logprobs": None, "echo": None, "suffix": None}
TYPES = [("metadata", dict), ("service_tier", str), ("cache_control", dict), ("output_config", dict)]
RENAMED = [(r"stop\b", "stop_sequences"),
           (r"response_format\.json_schema\.schema", "output_config.format.schema"),
           (r"response_format", "output_config.format"),
           (r"(tools\[\d+\])\.function\.parameters", r"\1.input_schema"),
           (r"(tools\[\d+\])\.function", r"\1"), (r"tool_choice\.function", "tool_choice"),
           (r"parallel_tool_calls", "tool_choice.disable_parallel_tool_use"),
           (r"tool_choice': 'required'", "tool_choice' of type any"), (r"continue_final_message", "messages")]
CHOICES = {"auto": "auto", "any": "required", "none": "none"}
ERRORS = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
          404: "not_found_error", 408: "timeout_error", 413: "request_too_large", 429: "rate_limit_error",
          503: "overloaded_error"}


def _text(content, param: str) -> str:
    """A string, or text blocks joined."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list) or not all(isinstance(b, dict) and b.get("type") == "text"
                                                and isinstance(b.get("text"), str) for b in content):
        raise bad(f"'{param}' must be a string or an array of text blocks.", param, "invalid_type")
    return "".join(b["text"] for b in content)


def _blocks(message: dict, i: int, last: bool) -> list[dict]:
    """``messages[i]`` as chat messages: its text, tool calls and tool results; ``last``: it ends
    the conversation."""
    role, content, param = message.get("role"), message.get("content"), f"messages[{i}]"
    if role not in ("user", "assistant"):
        raise bad(f"'{param}.role' must be user or assistant.", f"{param}.role")
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    if not isinstance(content, list):
        raise bad(f"'{param}.content' must be a string or an array of content blocks.", f"{param}.content",
                   "invalid_type")
    if not content and not (last and role == "assistant"):
        raise bad(f"'{param}.content' is empty; only the last message, an assistant's, may be.",
                  f"{param}.content")
    text, calls, results = [], [], []
    allowed = ("text", "tool_use") if role == "assistant" else ("text", "tool_result")
    for j, block in enumerate(content):
        at = f"{param}.content[{j}]"
        kind = block.get("type") if isinstance(block, dict) else None
        if kind not in allowed:
            raise bad(f"'{at}.type' must be {' or '.join(allowed)} in a{'n' * (role == 'assistant')} {role} "
                       f"message (this server reads text and tools only), got {kind!r}.", f"{at}.type")
        if kind == "text":
            if not isinstance(block.get("text"), str):
                raise bad(f"'{at}.text' must be a string.", f"{at}.text", "invalid_type")
            text.append(block["text"])
        elif kind == "tool_use":
            if not isinstance(block.get("id"), str) or not isinstance(block.get("name"), str) \
                    or not isinstance(block.get("input"), dict):
                raise bad(f"'{at}' must have a string 'id' and 'name' and an object 'input'.", at)
            calls.append({"id": block["id"], "type": "function", "function": {
                "name": block["name"], "arguments": json.dumps(block["input"], ensure_ascii=False)}})
        else:
            if not isinstance(block.get("tool_use_id"), str):
                raise bad(f"'{at}.tool_use_id' must be a string.", f"{at}.tool_use_id", "invalid_type")
            body_field(block, "is_error", (bool,), within=at)
            results.append({"role": "tool", "tool_call_id": block["tool_use_id"],
                            "content": _text(block.get("content", ""), f"{at}.content")})
    said = [{"role": role, "content": "".join(text)} | ({"tool_calls": calls} if calls else {})]
    return results + (said if text or calls else [])


def _tools(tools) -> list[dict] | None:
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise bad("'tools' must be an array of tools.", "tools", "invalid_type")
    out = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or tool.get("type", "custom") != "custom":
            kind = tool.get("type") if isinstance(tool, dict) else None
            raise bad(f"'tools[{i}]' must be a custom tool ({{name, description, input_schema}}); this "
                       f"server runs no server tools, got type {kind!r}.", f"tools[{i}].type",
                       "unsupported_parameter")
        if tool.get("input_schema") is None:
            raise bad(f"'tools[{i}].input_schema' is required: the JSON Schema of the tool's input.",
                      f"tools[{i}].input_schema", "missing_required_parameter")
        function = {"name": tool.get("name"), "parameters": tool["input_schema"]}
        out.append({"type": "function", "function": function | (
            {"description": tool["description"]} if "description" in tool else {})})
    return out


def _tool_choice(choice, sent: dict) -> None:
    if choice is None:
        return
    if not isinstance(choice, dict):
        raise bad("'tool_choice' must be an object ({type: auto, any, tool or none}).", "tool_choice",
                  "invalid_type")
    if choice.get("type") not in (*CHOICES, "tool"):
        raise bad("'tool_choice.type' must be auto, any, tool or none.", "tool_choice.type")
    kind = choice["type"]
    sent["tool_choice"] = ({"type": "function", "function": {"name": choice.get("name")}} if kind == "tool"
                           else CHOICES[kind])
    if body_field(choice, "disable_parallel_tool_use", (bool,), False, "tool_choice"):
        sent["parallel_tool_calls"] = False


def _refused(body: dict) -> None:
    """Fields a message cannot honour (``REFUSED``), the chat's own (``CHAT_FIELDS``), and the
    types of the fields that change nothing here."""
    check_own_fields(body, "/v1/messages", REFUSED, CHAT_FIELDS, TYPES)
    body_field(body.get("metadata") or {}, "user_id", (str,), within="metadata")
    body_field(body.get("output_config") or {}, "effort", (str,), within="output_config")


def chat_body(body) -> dict:
    """The chat completion's body that answers the Messages request ``body``."""
    if not isinstance(body, dict):
        raise bad("The request body must be a JSON object.", None, "invalid_type")
    _refused(body)
    if body.get("max_tokens") is None:
        raise bad("'max_tokens' is required.", "max_tokens", "missing_required_parameter")
    temperature = body.get("temperature")  # Anthropic's range; the rest of the checks are the chat's
    numeric = isinstance(temperature, (int, float)) and not isinstance(temperature, bool)
    if numeric and not 0 <= temperature <= 1:
        raise bad(f"'temperature' must be between 0 and 1, got {number(temperature)}.", "temperature",
                  "invalid_value")
    given = body.get("messages")
    if not isinstance(given, list) or not given:
        raise bad("'messages' must be a non-empty array of messages.", "messages",
                   "missing_required_parameter" if given is None else "invalid_value")
    system = body.get("system")
    system = _text(system, "system") if system is not None else ""
    messages = [{"role": "system", "content": system}] if system else []
    for i, message in enumerate(given):
        if not isinstance(message, dict):
            raise bad(f"'messages[{i}]' must be an object.", f"messages[{i}]", "invalid_type")
        messages += _blocks(message, i, i == len(given) - 1)
    sent = {k: v for k, v in body.items() if k not in OWN} | {"messages": messages,
                                                               "max_tokens": body["max_tokens"]}
    last = messages[-1] if messages else {"role": "user"}
    if last["role"] == "assistant" and last["content"] and not last.get("tool_calls"):
        sent["continue_final_message"] = True  # Anthropic's: the answer goes on from the assistant's text
    if (tools := _tools(body.get("tools"))) is not None:
        sent["tools"] = tools
    _tool_choice(body.get("tool_choice"), sent)
    config = body_field(body, "output_config", (dict,), {})
    if config.get("format") is not None:
        fmt = config["format"]
        if not isinstance(fmt, dict) or fmt.get("type") != "json_schema" or fmt.get("schema") is None:
            raise bad("'output_config.format' must be {type: 'json_schema', schema}.",
                       "output_config.format")
        sent["response_format"] = {"type": "json_schema", "json_schema": {"name": "output",
                                                                          "schema": fmt.get("schema")}}
    stops = body_field(body, "stop_sequences", (list,))
    if stops is not None:
        sent["stop"] = stops
    return sent


def error(exc: ApiError) -> dict:
    """An error in Anthropic's form."""
    return {"type": "error", "error": {"type": ERRORS.get(exc.status, "api_error"), "message": exc.message}}


def head(body: dict, model_name: str, prompt_tokens: int, cached: int) -> dict:
    """The message before any content; ``cached``: its prompt tokens read from the prefix cache."""
    return {"id": f"msg_{uuid.uuid4().hex}", "type": "message", "role": "assistant", "model": model_name,
            "content": [], "stop_reason": None, "stop_sequence": None,
            "usage": {"input_tokens": prompt_tokens - cached, "cache_read_input_tokens": cached,
                      "cache_creation_input_tokens": 0, "output_tokens": 0}}


def _call(call: dict) -> dict:
    function = call["function"]
    return {"type": "tool_use", "id": f"toolu_{call['id'].removeprefix('call_')}", "name": function["name"],
            "input": json.loads(function["arguments"])}


def _ending(outcome: Outcome, calls: list) -> dict:
    counts = usage([outcome])
    cached = (counts.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    if outcome.finish_reason == "length":
        reason = "max_tokens"
    elif isinstance(outcome.stop_reason, str):
        reason = "stop_sequence"
    else:
        reason = "tool_use" if calls else "end_turn"
    sequence = outcome.stop_reason if reason == "stop_sequence" else None
    return {"stop_reason": reason, "stop_sequence": sequence,
            "usage": {"input_tokens": counts["prompt_tokens"] - cached, "cache_read_input_tokens": cached,
                      "cache_creation_input_tokens": 0, "output_tokens": counts["completion_tokens"]}}


def whole(base: dict, outcome: Outcome, read_calls: bool) -> dict:
    """The message answering a request that does not stream."""
    content, calls = read_tool_calls(outcome.text) if read_calls else (outcome.text, [])
    blocks = [{"type": "text", "text": content or ""}] if content or not calls else []
    return base | {"content": blocks + [_call(c) for c in calls]} | _ending(outcome, calls) | {
        "anyspec": choice_stats(outcome)}


def _sse(kind: str, data: dict) -> str:
    return f"event: {kind}\ndata: {json.dumps({'type': kind} | data, ensure_ascii=False)}\n\n"


async def events(next_event, base: dict, read_calls: bool):
    """The server-sent events of a streamed message from its job's events: ``message_start``, a text
    block's deltas, each ``tool_use`` block, ``message_delta`` (the stop reason, the usage) and
    ``message_stop``; an ``error`` event where the generation fails."""
    yield _sse("message_start", {"message": base})
    calls = CallStream() if read_calls else None
    opened = False
    while True:
        kind, value = await next_event()
        if kind == "text" and (piece := calls.feed(value) if calls else value):
            if not opened:
                opened = True
                yield _sse("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}})
            yield _sse("content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": piece}})
        elif kind == "error":
            yield _sse("error", error(as_api_error(value)))
            return
        elif kind == "done":
            break
    rest, found = calls.finish() if calls else (None, [])
    if rest or (not found and not opened):
        if not opened:
            yield _sse("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}})
        if rest:
            yield _sse("content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": rest}})
        opened = True
    if opened:
        yield _sse("content_block_stop", {"index": 0})
    for index, call in enumerate(found, start=int(opened)):
        block = _call(call)
        yield _sse("content_block_start", {"index": index, "content_block": block | {"input": {}}})
        yield _sse("content_block_delta", {"index": index, "delta": {
            "type": "input_json_delta", "partial_json": json.dumps(block["input"], ensure_ascii=False)}})
        yield _sse("content_block_stop", {"index": index})
    ending = _ending(value, found)
    yield _sse("message_delta", {"delta": {k: ending[k] for k in ("stop_reason", "stop_sequence")},
                                 "usage": ending["usage"]})
    yield _sse("message_stop", {})
