"""OpenAI's Responses API (``POST /v1/responses``) on the chat pipeline: a request is read into the
body of a chat completion (``chat_body``), generated as one, and its outcome written as a response
object, whole (``whole``) or as the Responses stream's typed events (``events``).

``input`` is a string or an array of items: messages (``user``, ``assistant``, ``system``,
``developer``; text content), ``function_call`` and ``function_call_output``. ``instructions`` is a
system message before them, ``max_output_tokens`` the chat's ``max_tokens``, ``text.format`` its
``response_format`` and the function ``tools`` (flat, as Responses writes them) and
``tool_choice`` its own. The chat's sampling fields and extensions (``seed``, ``top_k``,
``speculative``, ...) pass through. ``reasoning`` changes nothing (the models answer without
reasoning first); ``conversation``, built-in tools (web search, files, ...) and non-text content
answer 400. Errors name the Responses fields.

``previous_response_id`` continues a conversation the server keeps (``response_store.py``).
"""

from __future__ import annotations

import itertools
import json
import time
import uuid

from anyspec.server.answers import as_api_error, bad, choice_stats, usage
from anyspec.server.fields import body_field, check_own_fields
from anyspec.server.scheduler import Outcome
from anyspec.server.structured import CallStream, read_tool_calls

ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}
TEXT_PARTS = ("input_text", "output_text")
OWN = ("input", "instructions", "max_output_tokens", "text", "tools", "tool_choice", "store", "metadata",
       "user", "service_tier", "prompt_cache_key", "safety_identifier", "reasoning", "truncation", "include",
       "top_logprobs", "background", "max_tool_calls", "previous_response_id", "stream_options")
REFUSED = {  # Responses fields this server cannot honour, and the values that change nothing
    "conversation": (None,), "background": (None, False), "prompt": (None,),
    "include": (None, [], ["reasoning.encrypted_content"]), "truncation": (None, "disabled"),
    "top_logprobs": (None, 0), "max_tool_calls": (None,)}  # reasoning: the models do not reason first
CHAT_FIELDS = {"messages": "input", "max_tokens": "max_output_tokens",
               "max_completion_tokens": "max_output_tokens", "response_format": "text.format", "n": None,
               "logprobs": None, "functions": "tools", "function_call": "tool_choice",
               "echo": None, "suffix": None}
TYPES = [("store", bool), ("metadata", dict), ("stream_options", dict), ("user", str), ("reasoning", dict),
         ("service_tier", str), ("prompt_cache_key", str), ("safety_identifier", str)]  # read nowhere else
RENAMED = [(r"messages(\[\d+\])?(\.[\w.\[\]]+)?", "input"), (r"max_tokens", "max_output_tokens"),
           (r"response_format\.json_schema\.(\w+)", r"text.format.\1"),
           (r"response_format", "text.format"),
           (r"(tools\[\d+\])\.function", r"\1"), (r"tool_choice\.function", "tool_choice")]


def _text(content, param: str) -> str:
    """A message's text: a string, or its ``input_text``/``output_text`` parts joined."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad(f"'{param}' must be a string or an array of text parts.", param, "invalid_type")
    out = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in TEXT_PARTS or not isinstance(part.get("text"), str):
            raise bad(f"'{param}[{j}]' must be a text part (input_text or output_text with a string "
                       f"'text'); this server reads text only, got type {kind!r}.", f"{param}[{j}]")
        out.append(part["text"])
    return "".join(out)


def _string(item: dict, name: str, param: str) -> str:
    if not isinstance(item.get(name), str):
        raise bad(f"'{param}.{name}' must be a string.", f"{param}.{name}", "invalid_type")
    return item[name]


def _item(item, i: int, out: list[dict]) -> None:
    """``input[i]`` added to the chat messages ``out``."""
    param = f"input[{i}]"
    if not isinstance(item, dict):
        raise bad(f"'{param}' must be an object.", param, "invalid_type")
    kind = item.get("type", "message")
    if kind == "message":
        if not isinstance(item.get("role"), str) or item["role"] not in ROLES:
            raise bad(f"'{param}.role' must be one of {', '.join(ROLES)}.", f"{param}.role")
        out.append({"role": ROLES[item["role"]], "content": _text(item.get("content"), f"{param}.content")})
    elif kind == "function_call_output":
        out.append({"role": "tool", "tool_call_id": _string(item, "call_id", param),
                    "content": _text(item.get("output"), f"{param}.output")})
    elif kind == "function_call":
        function = {name: _string(item, name, param) for name in ("name", "arguments")}
        try:
            json.loads(function["arguments"])
        except ValueError:
            raise bad(f"'{param}.arguments' is not valid JSON.", f"{param}.arguments") from None
        call = {"id": _string(item, "call_id", param), "type": "function", "function": function}
        if out and out[-1]["role"] == "assistant":
            out[-1].setdefault("tool_calls", []).append(call)
        else:
            out.append({"role": "assistant", "content": None, "tool_calls": [call]})
    else:
        raise bad(f"'{param}.type' must be message, function_call or function_call_output; this server "
                   f"takes no {kind!r} items.", f"{param}.type")


def _tools(tools) -> list[dict] | None:
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise bad("'tools' must be an array of function tools.", "tools", "invalid_type")
    out = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or tool.get("type") != "function":
            kind = tool.get("type") if isinstance(tool, dict) else None
            raise bad(f"'tools[{i}]' must be a function tool ({{type: 'function', name, parameters}}); this "
                       f"server runs no built-in tools, got type {kind!r}.", f"tools[{i}].type",
                       "unsupported_parameter")
        out.append({"type": "function", "function": {
            k: tool[k] for k in ("name", "description", "parameters", "strict") if k in tool}})
    return out


def _tool_choice(choice):
    if isinstance(choice, dict) and choice.get("type") == "function":
        return {"type": "function", "function": {"name": choice.get("name")}}
    if isinstance(choice, dict):
        raise bad(f"'tool_choice.type' must be 'function', got {choice.get('type')!r}.", "tool_choice.type")
    return choice


def _format(text) -> dict | None:
    if text is None:
        return None
    if not isinstance(text, dict):
        raise bad("'text' must be an object.", "text", "invalid_type")
    if text.get("verbosity") not in (None, "medium"):
        raise bad("'text.verbosity' is not supported by this server; leave it out.", "text.verbosity",
                   "unsupported_parameter")
    fmt = text.get("format")
    if fmt is None or not isinstance(fmt, dict) or fmt.get("type") != "json_schema":
        return fmt
    inner = {k: v for k, v in fmt.items() if k in ("name", "schema", "strict")}
    return {"type": "json_schema", "json_schema": inner}


def own_items(body) -> list:
    """The request's ``input`` as an array of items."""
    given = body.get("input")
    if isinstance(given, str):
        return [{"type": "message", "role": "user", "content": given}]
    if not isinstance(given, list) or not given:
        raise bad("'input' must be a string or a non-empty array of items.", "input",
                   "missing_required_parameter" if given is None else "invalid_value")
    return given


def chat_body(body, earlier: list[dict] = ()) -> dict:
    """The chat completion's body that answers the Responses request ``body``, after the items
    ``earlier`` of the conversation it continues."""
    if not isinstance(body, dict):
        raise bad("The request body must be a JSON object.", None, "invalid_type")
    check_own_fields(body, "/v1/responses", REFUSED, CHAT_FIELDS, TYPES, lambda name: (
        "send the conversation in 'input', or continue one with 'previous_response_id'"
        if name == "conversation" else "leave it out"))
    body_field(body.get("stream_options") or {}, "include_obfuscation", (bool,), within="stream_options")
    for key, value in (body.get("metadata") or {}).items():
        if not isinstance(value, str):
            raise bad(f"'metadata.{key}' must be a string: metadata maps keys to strings.", f"metadata.{key}",
                      "invalid_type")
    given = own_items(body)
    instructions = body_field(body, "instructions", (str,))
    messages = [{"role": "system", "content": instructions}] if instructions else []
    for item in earlier:
        _item(item, 0, messages)
    for i, item in enumerate(given):
        _item(item, i, messages)
    sent = {k: v for k, v in body.items() if k not in OWN} | {"messages": messages}
    for name, value in (("max_tokens", body.get("max_output_tokens")), ("tools", _tools(body.get("tools"))),
                        ("tool_choice", _tool_choice(body.get("tool_choice"))),
                        ("response_format", _format(body.get("text")))):
        if value is not None:
            sent[name] = value
    return sent


def head(body: dict, model_name: str, prompt_tokens: int, store: bool = False) -> dict:
    """The response object before any output: the request's settings, as OpenAI echoes them;
    ``store``: whether it is kept."""
    return {"id": f"resp_{uuid.uuid4().hex}", "object": "response", "created_at": int(time.time()),
            "status": "in_progress", "error": None, "incomplete_details": None, "model": model_name,
            "instructions": body.get("instructions"), "max_output_tokens": body.get("max_output_tokens"),
            "metadata": body.get("metadata") or {}, "output": [],
            "parallel_tool_calls": body.get("parallel_tool_calls", True),
            "previous_response_id": body.get("previous_response_id"),
            "reasoning": {"effort": None, "summary": None}, "store": store,
            "temperature": body.get("temperature", 1.0), "text": {"format": (body.get("text") or {}).get(
                "format") or {"type": "text"}}, "tool_choice": body.get("tool_choice", "auto"),
            "tools": body.get("tools") or [], "top_p": body.get("top_p", 1.0), "truncation": "disabled",
            "usage": None, "user": body.get("user")}


def _message(item_id: str, text: str, status: str = "completed") -> dict:
    """An output message; ``status`` ``incomplete`` where ``max_output_tokens`` cut it."""
    content = [{"type": "output_text", "text": text, "annotations": []}] if status != "in_progress" else []
    return {"type": "message", "id": item_id, "status": status, "role": "assistant", "content": content}


def _call(call: dict, item_id: str, status: str = "completed") -> dict:
    arguments = call["function"]["arguments"] if status == "completed" else ""
    return {"type": "function_call", "id": item_id, "call_id": call["id"], "name": call["function"]["name"],
            "arguments": arguments, "status": status}


def _finished(base: dict, outcome: Outcome, output: list[dict]) -> dict:
    counts = usage([outcome])
    cached = counts.get("prompt_tokens_details") or {"cached_tokens": 0}
    cut = outcome.finish_reason == "length"
    return base | {"status": "incomplete" if cut else "completed", "output": output,
                   "incomplete_details": {"reason": "max_output_tokens"} if cut else None,
                   "usage": {"input_tokens": counts["prompt_tokens"],
                             "input_tokens_details": cached,
                             "output_tokens": counts["completion_tokens"],
                             "output_tokens_details": {"reasoning_tokens": 0},
                             "total_tokens": counts["total_tokens"]},
                   "anyspec": choice_stats(outcome)}


def whole(base: dict, outcome: Outcome, read_calls: bool) -> dict:
    """The response object of a request that does not stream."""
    content, calls = read_tool_calls(outcome.text) if read_calls else (outcome.text, [])
    status = "incomplete" if outcome.finish_reason == "length" else "completed"
    output = [_message(f"msg_{uuid.uuid4().hex}", content or "", status)] if content or not calls else []
    return _finished(base, outcome, output + [_call(c, f"fc_{uuid.uuid4().hex}") for c in calls])


async def events(next_event, base: dict, read_calls: bool, on_final=None, output: list | None = None):
    """The server-sent events of a streamed response from its job's events: ``response.created``,
    the message's text deltas (the message opened with the first text, none where the answer is
    calls only), each function call, then ``response.completed`` (or ``response.incomplete``),
    whose response goes to ``on_final`` too; an ``error`` event where the generation fails.
    ``output``: the list the output items go to as they are sent, the message with its text so far,
    for a stream that ends early."""
    numbers = itertools.count()

    def event(kind: str, **fields) -> str:
        data = {"type": kind, "sequence_number": next(numbers)} | fields
        return f"event: {kind}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"

    yield event("response.created", response=base)
    yield event("response.in_progress", response=base)
    calls = CallStream() if read_calls else None
    output = [] if output is None else output
    message, part = f"msg_{uuid.uuid4().hex}", None
    at = dict(item_id=message, output_index=0, content_index=0)

    def said(piece: str) -> str:
        nonlocal part
        out = []
        if part is None:
            output.append(_message(message, "", "in_progress"))
            out.append(event("response.output_item.added", output_index=0, item=output[0]))
            part = {"type": "output_text", "text": "", "annotations": []}
            out.append(event("response.content_part.added", **at, part=part))
            output[0]["content"].append(part)
        part["text"] += piece
        if piece:
            out.append(event("response.output_text.delta", **at, delta=piece, logprobs=[]))
        return "".join(out)

    while True:
        kind, value = await next_event()
        if kind == "text" and (piece := calls.feed(value) if calls else value):
            yield said(piece)
        elif kind == "error":
            exc = as_api_error(value)
            yield event("error", code=exc.code, message=exc.message, param=exc.param)
            return
        elif kind == "done":
            break
    rest, found = calls.finish() if calls else (None, [])
    if rest or not found or part is not None:
        yield said(rest or "")
        cut = value.finish_reason == "length"
        output[0] = _message(message, part["text"], "incomplete" if cut else "completed")
        yield event("response.output_text.done", **at, text=part["text"], logprobs=[])
        yield event("response.content_part.done", **at, part=output[0]["content"][0])
        yield event("response.output_item.done", output_index=0, item=output[0])
    for call in found:
        item, index = f"fc_{uuid.uuid4().hex}", len(output)
        output.append(_call(call, item))
        yield event("response.output_item.added", output_index=index, item=_call(call, item, "in_progress"))
        yield event("response.function_call_arguments.delta", item_id=item, output_index=index,
                    delta=output[-1]["arguments"])
        yield event("response.function_call_arguments.done", item_id=item, output_index=index,
                    arguments=output[-1]["arguments"], name=output[-1]["name"])
        yield event("response.output_item.done", output_index=index, item=output[-1])
    final = _finished(base, value, list(output))
    if on_final:
        on_final(final)
    yield event(f"response.{final['status']}", response=final)
