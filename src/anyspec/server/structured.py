"""JSON mode, JSON schemas and tool calls in a request: ``response_format``, ``tools`` and
``tool_choice``, or vLLM's guided decoding (``guided_json``, ``guided_regex``, ``guided_choice``,
``guided_grammar``, or the same under ``structured_outputs``), or llama.cpp's ``grammar`` and
``json_schema``, checked and compiled into a grammar
(``engine/grammar_text.py``, ``engine/grammar.py``) before any model work,
chat messages that carry tool calls and tool results, and the model's ``<tool_call>`` blocks read
back into OpenAI's ``tool_calls``, whole or streamed.

Tool calls use the target's chat template: the tools go to it as ``tools=``, and a template that
ignores them is refused. The calls are read in the format of Qwen2.5's template (the default
target): ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``. ``tool_choice``:
``"auto"`` (the default with tools) lets the model answer or call, and holds a call it opens to
the functions' schemas; ``"required"`` and a named function constrain the answer to calls;
``"none"`` answers text.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field

from anyspec.engine.grammar_text import GUIDES, TOOL_CLOSE, TOOL_OPEN, GrammarError
from anyspec.engine.prompt import render_prompt
from anyspec.errors import ConfigError

CALL = re.compile(re.escape(TOOL_OPEN) + r"\s*(.*?)\s*" + re.escape(TOOL_CLOSE), re.DOTALL)
FORMATS = ("text", "json_object", "json_schema")
CHOICES = ("none", "auto", "required")
LLAMA_GUIDES = {"grammar": "grammar", "json_schema": "json"}  # llama.cpp server's fields


class StructuredError(Exception):
    """A bad ``response_format``, ``tools`` or ``tool_choice``; ``param`` names the field."""

    def __init__(self, message: str, param: str, code: str = "invalid_value"):
        super().__init__(message)
        self.message, self.param, self.code = message, param, code


@dataclass
class Structure:
    grammar: object = None  # what the answer must match (None: free text)
    tools: list[dict] | None = None  # OpenAI's tool definitions, for the chat template
    read_calls: bool = False  # read <tool_call> blocks out of the answer
    functions: list[dict] = field(default_factory=list)


def _object(value, param: str) -> dict:
    if not isinstance(value, dict):
        raise StructuredError(f"'{param}' must be an object.", param, "invalid_type")
    return value


def response_format(body: dict, grammars) -> object:
    """The grammar of ``response_format`` (None for ``text`` or none given)."""
    spec = body.get("response_format")
    if spec is None:
        return None
    kind = _object(spec, "response_format").get("type")
    if kind not in FORMATS:
        raise StructuredError(f"'response_format.type' must be one of {', '.join(FORMATS)}, got {kind!r}.",
                              "response_format.type")
    if kind == "text":
        return None
    _from_the_start(body, "response_format")
    if kind == "json_object":  # llama.cpp's takes a "schema" beside it
        schema = spec.get("schema")
        return _schema(grammars, schema, "response_format" + (".schema" if schema is not None else ""))
    inner = _object(spec.get("json_schema"), "response_format.json_schema")
    if not isinstance(inner.get("name"), str) or not inner["name"]:
        raise StructuredError("'response_format.json_schema.name' must be a non-empty string.",
                              "response_format.json_schema.name")
    if not isinstance(inner.get("strict", False), bool):
        raise StructuredError("'response_format.json_schema.strict' must be a boolean.",
                              "response_format.json_schema.strict", "invalid_type")
    if inner.get("schema") is None:
        raise StructuredError("'response_format.json_schema.schema' is required: the JSON Schema the answer "
                              "matches (for any JSON object, use {type: 'json_object'}).",
                              "response_format.json_schema.schema", "missing_required_parameter")
    return _schema(grammars, inner["schema"], "response_format.json_schema.schema")


def guided(body: dict) -> tuple[str, str, object] | None:
    """What vLLM's guided decoding or llama.cpp's ``grammar`` or ``json_schema`` asks for, at most one
    kind: ``(field, kind, value)``, None where none is."""
    named = {f"guided_{kind}": kind for kind in GUIDES} | LLAMA_GUIDES
    asked = [(name, kind, body[name]) for name, kind in named.items() if body.get(name) is not None]
    outputs = body.get("structured_outputs")
    if outputs is not None:
        if not any(value not in (None, False) for value in _object(outputs, "structured_outputs").values()):
            raise StructuredError(f"'structured_outputs' asks for nothing; it takes one of "
                                  f"{', '.join(GUIDES)} or json_object: true.", "structured_outputs")
        for key, value in outputs.items():
            if key == "json_object" and not isinstance(value, bool | None):
                raise StructuredError("'structured_outputs.json_object' must be a boolean.",
                                      "structured_outputs.json_object", "invalid_type")
            if key == "json_object" and value is True:  # JSON mode
                key, value = "json", {"type": "object"}
            elif key not in GUIDES and value not in (None, False):
                raise StructuredError(f"'structured_outputs.{key}' is not supported by this server; it takes "
                                      f"{', '.join(GUIDES)} and json_object.", f"structured_outputs.{key}",
                                      "unsupported_parameter")
            if key in GUIDES and value is not None:
                asked.append((f"structured_outputs.{key}", key, value))
    if len(asked) > 1:
        raise StructuredError(f"'{asked[0][0]}' and '{asked[1][0]}' cannot be used together: an answer "
                              "follows one of them.", asked[1][0])
    return asked[0] if asked else None


def _schema(grammars, schema, param: str):
    try:
        return grammars().json(schema, param)
    except GrammarError as exc:
        raise StructuredError(str(exc), exc.field) from None


def _functions(tools: list, grammars) -> list[dict]:
    out = []
    for i, tool in enumerate(tools):
        tool = _object(tool, f"tools[{i}]")
        if tool.get("type", "function") != "function":
            raise StructuredError(f"tools[{i}].type must be 'function'.", f"tools[{i}].type")
        function = _object(tool.get("function"), f"tools[{i}].function")
        name = function.get("name")
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_.\-]{1,64}", name):
            raise StructuredError(f"tools[{i}].function.name is required: 1 to 64 letters, digits, '_', '.' "
                                  "or '-'.", f"tools[{i}].function.name",
                                  "missing_required_parameter" if name is None else "invalid_value")
        if name in (f["name"] for f in out):
            raise StructuredError(f"tools[{i}].function.name {name!r} is given twice.",
                                  f"tools[{i}].function.name")
        _function_types(function, f"tools[{i}].function")
        parameters = function.get("parameters")
        _schema(grammars, {"type": "object"} if parameters is None else parameters,
                f"tools[{i}].function.parameters")
        out.append(function)
    return out


def _function_types(function: dict, param: str) -> None:
    """A function's ``description`` a string, ``strict`` a boolean and ``parameters`` a JSON Schema
    object (the arguments are one), where given."""
    for name, kinds, says in (("description", str, "a string"), ("strict", bool, "a boolean"),
                              ("parameters", dict, "a JSON Schema object")):
        if function.get(name) is not None and not isinstance(function[name], kinds):
            raise StructuredError(f"'{param}.{name}' must be {says}.", f"{param}.{name}", "invalid_type")


def _choice(body: dict, functions: list[dict]) -> tuple[str, str | None]:
    choice = body.get("tool_choice")
    if choice is None:
        return ("auto" if functions else "none"), None
    if isinstance(choice, str):
        if choice not in CHOICES:
            raise StructuredError(f"'tool_choice' must be one of {', '.join(CHOICES)} or a function of "
                                  f"'tools' by name, got {choice!r}.", "tool_choice")
        if choice == "required" and not functions:
            raise StructuredError("'tool_choice': 'required' needs 'tools'.", "tool_choice")
        return choice, None
    kind = _object(choice, "tool_choice").get("type", "function")
    if kind != "function":  # OpenAI's allowed_tools and custom
        raise StructuredError(f"'tool_choice.type' {kind!r} is not supported by this server: 'function' "
                              "with a function of 'tools' by name, or one of none, auto, required.",
                              "tool_choice.type", "unsupported_parameter")
    name = _object(choice.get("function"), "tool_choice.function").get("name")
    known = [f["name"] for f in functions]
    if name is None:
        raise StructuredError(f"'tool_choice.function.name' is required: one of 'tools' "
                              f"({', '.join(known) or 'none given'}).", "tool_choice.function.name",
                              "missing_required_parameter")
    if name not in known:
        raise StructuredError(f"'tool_choice' names the function {name!r}, which is not in 'tools' "
                              f"({', '.join(known) or 'none given'}).", "tool_choice.function.name")
    return "function", name


def structure(body: dict, chat: bool, tokenizer, grammars) -> Structure:
    """What ``response_format``, ``tools`` and ``tool_choice`` ask for; ``grammars()`` gives the
    compiler (``engine.grammar.Grammars``) only once one is needed."""
    tools = body.get("tools")
    if chat and tools is not None and not isinstance(tools, list):
        raise StructuredError("'tools' must be an array of {type: 'function', function: {...}}.", "tools",
                              "invalid_type")
    tools = tools or None  # [] is no tools
    guide = guided(body)
    if guide is not None:
        param, kind, value = guide
        for name, given in (("response_format", body.get("response_format")), ("tools", tools)):
            if given is not None:
                raise StructuredError(f"'{name}' and '{param}' cannot be used together: an answer "
                                      "follows one of them.", name)
        _from_the_start(body, param)
        try:
            return Structure(grammar=grammars().guide(kind, value, param))
        except GrammarError as exc:
            raise StructuredError(str(exc), exc.field) from None
    if not chat:
        for name in ("tools", "tool_choice"):
            if body.get(name) is not None:
                raise StructuredError(f"'{name}' is a chat field; /v1/completions takes 'response_format'.",
                                      name, "unsupported_parameter")
        return Structure(grammar=response_format(body, grammars))
    functions = _functions(tools, grammars) if tools is not None else []
    choice, name = _choice(body, functions)
    parallel = body.get("parallel_tool_calls", True)
    if not isinstance(parallel, bool):
        raise StructuredError("'parallel_tool_calls' must be a boolean.", "parallel_tool_calls",
                              "invalid_type")
    fmt = response_format(body, grammars)
    if fmt is not None and choice in ("required", "function"):
        raise StructuredError("'response_format' and a 'tool_choice' that requires a call cannot be used "
                              "together: the answer is the tool call.", "response_format")
    if not functions:
        return Structure(grammar=fmt)
    _check_template(tokenizer, tools)
    grammar = fmt
    if choice in ("required", "function") or choice == "auto" and fmt is None:
        chosen = [f for f in functions if name is None or f["name"] == name]
        try:
            grammar = grammars().tool_calls(chosen, one=name is not None or not parallel, field="tools",
                                            text=choice == "auto")
        except GrammarError as exc:
            raise StructuredError(str(exc), exc.field) from None
    return Structure(grammar=grammar, tools=tools, read_calls=choice != "none", functions=functions)


def _from_the_start(body: dict, param: str) -> None:
    if body.get("continue_final_message") is True:
        raise StructuredError(f"'continue_final_message' (a prefilled assistant message) and '{param}' "
                              f"cannot be used together: '{param}' would hold the continuation alone, "
                              "not the prefilled text before it.", "continue_final_message")


def _check_template(tokenizer, tools: list[dict]) -> None:
    probe = [{"role": "user", "content": "?"}]
    try:
        with_tools = render_prompt(tokenizer, probe, tools=tools)[0]
    except ConfigError as exc:
        raise StructuredError(f"'tools' need a chat template: {exc}", "tools") from None
    except Exception as exc:  # the template refusing these tools
        raise StructuredError(f"The chat template cannot render 'tools': {type(exc).__name__}: {exc}",
                              "tools") from None
    if with_tools == render_prompt(tokenizer, probe)[0]:
        raise StructuredError("This model's chat template has no tool support (it ignores 'tools'), so "
                              "tool calls are not available; leave 'tools' out.", "tools",
                              "unsupported_parameter")
    if TOOL_OPEN not in with_tools or TOOL_OPEN not in tokenizer.get_added_vocab():
        raise StructuredError(f"Tool calls are read in the {TOOL_OPEN} format of Qwen2.5's template, which "
                              "this model's template and tokenizer do not use; leave 'tools' out.", "tools",
                              "unsupported_parameter")


def message_fields(m: dict, i: int) -> dict:
    """An assistant message's ``tool_calls`` (arguments as objects, as templates read them) and a
    tool message's ``tool_call_id``, for the chat template; a ``name`` (which it does not show) must
    be a string."""
    for name in ("name", "tool_call_id"):
        if m.get(name) is not None and not isinstance(m[name], str):
            raise StructuredError(f"messages[{i}].{name} must be a string.", f"messages[{i}].{name}",
                                  "invalid_type")
    out = {}
    if m["role"] == "tool" and m.get("tool_call_id") is not None:
        out["tool_call_id"] = m["tool_call_id"]
    calls = m.get("tool_calls")
    if calls is None or m["role"] != "assistant":
        return out
    if not isinstance(calls, list):
        raise StructuredError(f"messages[{i}].tool_calls must be an array.", f"messages[{i}].tool_calls",
                              "invalid_type")
    out["tool_calls"] = []
    for j, call in enumerate(calls):
        param = f"messages[{i}].tool_calls[{j}]"
        function = _object(_object(call, param).get("function"), f"{param}.function")
        if call.get("id") is not None and not isinstance(call["id"], str):
            raise StructuredError(f"{param}.id must be a string.", f"{param}.id", "invalid_type")
        arguments = function.get("arguments", "{}")
        if not isinstance(arguments, str | dict):
            raise StructuredError(f"{param}.function.arguments must be a string of JSON (or an object).",
                                  f"{param}.function.arguments", "invalid_type")
        try:
            arguments = json.loads(arguments) if isinstance(arguments, str) else arguments
        except ValueError:
            raise StructuredError(f"{param}.function.arguments is not valid JSON.",
                                  f"{param}.function.arguments") from None
        if not isinstance(function.get("name"), str):
            raise StructuredError(f"{param}.function.name must be a string.", f"{param}.function.name",
                                  "invalid_type")
        out["tool_calls"].append({"id": call.get("id"), "type": "function",
                                  "function": {"name": function["name"], "arguments": arguments}})
    return out


def read_tool_calls(text: str) -> tuple[str | None, list[dict]]:
    """The answer's text outside its ``<tool_call>`` blocks, as written but for stretches of
    whitespace alone (the newlines between calls; None when nothing else is left), and the calls in
    OpenAI's form; a block that is not a
    ``{"name", "arguments"}`` object stays text, and a block left open at the end (an answer cut by
    ``max_tokens``) is dropped: it is neither."""
    calls, kept, at = [], [], 0
    for match in CALL.finditer(text):
        try:
            call = json.loads(match.group(1))
        except ValueError:
            continue
        if not (isinstance(call, dict) and isinstance(call.get("name"), str)):
            continue
        kept.append(text[at:match.start()])
        at = match.end()
        calls.append({"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                      "function": {"name": call["name"],
                                   "arguments": json.dumps(call.get("arguments", {}), ensure_ascii=False)}})
    rest = text[at:]
    if (opened := rest.rfind(TOOL_OPEN)) >= 0 and TOOL_CLOSE not in rest[opened:]:
        rest = rest[:opened]
    content = "".join(part for part in [*kept, rest] if part.strip())
    return content or None, calls


class CallStream:
    """Streamed text with tool calls held back: text goes out until a ``<tool_call>`` may begin;
    from there on it is kept, and read into calls at the end. Text that is only whitespace so far
    waits too, so that streamed and whole answers agree (``read_tool_calls``): an answer of calls
    alone has no text."""

    def __init__(self):
        self.held = ""
        self.inside = False
        self.said = False  # some text went out

    def feed(self, piece: str) -> str:
        self.held += piece
        if self.inside:
            return ""
        if (at := self.held.find(TOOL_OPEN)) >= 0:
            self.inside = True
            return self._out(at)
        keep = next((n for n in range(min(len(TOOL_OPEN) - 1, len(self.held)), 0, -1)
                     if TOOL_OPEN.startswith(self.held[-n:])), 0)
        return self._out(len(self.held) - keep)

    def _out(self, end: int) -> str:
        if not self.said and not self.held[:end].strip():
            return ""
        self.said = True
        out, self.held = self.held[:end], self.held[end:]
        return out

    def finish(self) -> tuple[str | None, list[dict]]:
        """The text still held and the calls read from it."""
        if self.inside:
            return read_tool_calls(self.held)
        return (self.held if self.held and (self.said or self.held.strip()) else None), []
