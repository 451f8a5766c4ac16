"""What a request asks the answer to follow, as llguidance grammar text: a JSON schema, vLLM's
guided decoding (a regular expression, a choice of strings, a Lark or GBNF grammar) or a list of
tools. Each is checked here, with errors that name the request field, before any tokenizer is
loaded; ``engine.grammar`` compiles the text against the target's tokenizer.

Every llguidance call that compiles or checks a grammar runs through ``native``, on a thread with a
stack deep enough for the largest grammar these limits allow.
"""

from __future__ import annotations

import json
import re
import threading
import warnings

from anyspec.config import json_depth, lone_surrogate, utf8_problem
from anyspec.errors import ConfigError

MAX_SCHEMA_BYTES = 65_536
JSON_DEPTH = 124  # objects and arrays in objects and arrays: llguidance's JSON reader takes 128 levels,
#                  the grammar it writes around a schema holds it 4 deep
LIMITS = dict(initial_lexer_fuel=1_000_000, step_lexer_fuel=200_000, max_grammar_size=200_000,
              max_lexer_states=50_000,  # what bounds compile and mask time (llguidance's fuel: ~50k/ms)
              verbose_errors=False)  # an error is its reason, without the parser's state and grammar
# llguidance compiles a chain of rules (r0: r1, r1: r2, ...) recursively, one native frame or more
# per rule and per parenthesis around a reference: a grammar of MAX_SCHEMA_BYTES needs ~55 MiB of
# stack at its deepest (rules nested in 28 parentheses each), where a thread's default 8 MiB
# overflows at ~2,600 plain rules and the process dies. Its masks and steps do not recurse so.
NATIVE_STACK = 256 << 20
QUOTED = 60  # characters of a request's text an error quotes
TOOL_OPEN, TOOL_CLOSE = "<tool_call>", "</tool_call>"
STYLE = dict(whitespace_flexible=False, item_separator=", ", key_separator=": ")  # as json.dumps writes
GUIDES = {"json": "JSON Schema", "regex": "regular expression", "choice": "list of choices",
          "grammar": "Lark or GBNF grammar"}  # vLLM's guided decoding, and what each is


class GrammarError(ConfigError):
    """A schema or tool list that cannot be compiled; ``field`` names the request field."""


def load_llguidance():
    try:
        with warnings.catch_warnings():  # its torch helpers use torch.jit.script_method, deprecated
            warnings.simplefilter("ignore", DeprecationWarning)
            import llguidance
            import llguidance.hf
            import llguidance.torch
    except ImportError:
        raise ConfigError("JSON mode, JSON schemas and tool calls need llguidance: "
                          "pip install 'anyspec[server]'") from None
    return llguidance


_stack_size = threading.Lock()


def native(call, *args, **kwargs):
    """``call(*args, **kwargs)`` on a thread of its own with a NATIVE_STACK stack, its result or
    exception returned or raised here: every llguidance call that compiles or checks a grammar."""
    out = {}

    def run():
        try:
            out["value"] = call(*args, **kwargs)
        except BaseException as exc:  # noqa: BLE001 (raised again in the caller's thread)
            out["error"] = exc

    with _stack_size:
        default = threading.stack_size(NATIVE_STACK)
        try:
            thread = threading.Thread(target=run, name="anyspec-grammar", daemon=True)
            thread.start()
        finally:
            threading.stack_size(default)
    thread.join()
    if "error" in out:
        raise out["error"]
    return out["value"]


def tool_calls_lark(functions: list[dict], marks: list[int], one: bool, text: bool, field: str) -> str:
    """The grammar of one ``<tool_call>`` block (``one``) or several, each ``{"name": ...,
    "arguments": ...}`` of one of ``functions`` (OpenAI's ``{"name", "parameters"}``), as Qwen2.5's
    template asks; ``marks``: the ids of TOOL_OPEN and TOOL_CLOSE (``_calls_lark``)."""
    # each function's parameters are a schema of their own (its "$ref"s point into it), inside
    # the call's object as json.dumps writes it (STYLE)
    heads = [json.dumps({"name": f["name"], "arguments": 0})[:-2] for f in functions]  # to "arguments":
    calls = [f'{json.dumps(head)} args{i} "}}"' for i, head in enumerate(heads)]
    params = [json.dumps((f.get("parameters") or {"type": "object"}) | {"x-guidance": STYLE})
              for f in functions]
    if sum(map(len, params)) > MAX_SCHEMA_BYTES:
        raise GrammarError(f"The function parameters in '{field}' are {sum(map(len, params))} bytes as "
                           f"JSON; at most {MAX_SCHEMA_BYTES} are compiled.", field)
    body = "body: " + " | ".join(calls) + "\n" + "".join(f"args{i}: %json {schema}\n"
                                                          for i, schema in enumerate(params))
    return native(load_llguidance().LLMatcher.grammar_from_lark, _calls_lark(marks, one, text) + body)


def _calls_lark(marks: list[int], one: bool, text: bool) -> str:
    """The calls around their ``body`` rule: ``marks`` are the ids of TOOL_OPEN and TOOL_CLOSE, each
    also allowed as its text. A lexeme runs on as far as it can, so free text (``text``) could not
    stop before a TOOL_OPEN it spells: it is PLAIN, text without one, or OPENED, text up to its first
    one, the call's opening included."""
    tags = zip(marks, (TOOL_OPEN, TOOL_CLOSE), strict=True)
    opening, closing = (f"<[{mark}]> | {json.dumps(tag)}" for mark, tag in tags)
    # Qwen2.5 ends its last call with a newline before the end of its turn: without the "\n"?
    # that newline could only open another call
    calls = 'call "\\n"?' if one else 'call ("\\n" open call)* "\\n"?'
    start = (f"start: PLAIN | PLAIN? <[{marks[0]}]> calls | OPENED calls\n"
             f"PLAIN: /(?s:.*)/ & ~/(?s:.*{TOOL_OPEN}.*)/\n"
             f"OPENED: /(?s:.*{TOOL_OPEN})/ & ~/(?s:.*{TOOL_OPEN}.+)/\n"
             if text else "start: open calls\n")
    return (start + f"calls: {calls}\nopen: {opening}\nclose: {closing}\n"
            'call: "\\n" body "\\n" close\n')


def check_unicode(value, field: str) -> None:
    """Every string in ``value`` (and in its lists and objects, keys too) valid Unicode: JSON's
    ``"\\ud800"`` and undecodable command-line bytes give lone surrogates, which no grammar holds."""
    if (found := lone_surrogate(value)) is not None:
        text = found[1]
        raise GrammarError(f"'{field}' is not valid Unicode text (a lone surrogate at character "
                           f"{utf8_problem(text)} of {text[:40]!r}).", field)


def schema_grammar(schema: dict | bool | None, field: str) -> str:
    """The llguidance grammar of a JSON schema (None: any JSON object), written as ``json.dumps``
    writes it: ``{"a": 1, "b": [2, 3]}``. Models write JSON so; a draft more often agrees with the
    target under it than under compact JSON, and neither can run on in whitespace."""
    if schema is None:
        schema = {"type": "object"}
    if schema is False:
        raise GrammarError(f"'{field}' is the schema false, which no answer matches.", field)
    if not isinstance(schema, dict | bool):
        raise GrammarError(f"'{field}' must be a JSON Schema object.", field)
    check_unicode(schema, field)
    if (depth := json_depth(schema)) > JSON_DEPTH:
        raise GrammarError(f"'{field}' nests objects and arrays {depth} deep; at most {JSON_DEPTH} are "
                           "compiled.", field)
    text = json.dumps({} if schema is True else schema)  # true: any JSON value
    if len(text) > MAX_SCHEMA_BYTES:
        raise GrammarError(f"'{field}' is {len(text)} bytes as JSON; at most {MAX_SCHEMA_BYTES} are "
                           "compiled.", field)
    try:
        return native(load_llguidance().LLMatcher.grammar_from_json_schema, text, defaults=STYLE)
    except ValueError as exc:
        raise GrammarError(f"'{field}' cannot be used: it is not a valid JSON Schema ({one_line(str(exc))})",
                           field) from None


def guide_grammar(kind: str, value, field: str) -> str:
    """The llguidance grammar of vLLM's guided decoding: ``json`` (a JSON Schema, or its text),
    ``regex`` (the whole answer matches it), ``choice`` (the answer is one of these strings) or
    ``grammar`` (llguidance's Lark, or the GBNF of llama.cpp and of vLLM's xgrammar)."""
    ll = load_llguidance()
    if kind == "json":
        if isinstance(value, str):
            check_unicode(value, field)  # the text; its parsed schema's strings are checked below
            try:
                value = json.loads(value)
            except json.JSONDecodeError as exc:
                raise GrammarError(f"'{field}' is not valid JSON: {exc}", field) from None
        return schema_grammar(value, field)
    check_unicode(value, field)
    if kind == "choice":
        if not isinstance(value, list) or not value or not all(isinstance(c, str) and c for c in value):
            raise GrammarError(f"'{field}' must be a non-empty array of non-empty strings.", field)
        text = "start: " + " | ".join(json.dumps(c, ensure_ascii=False) for c in value)
    elif not isinstance(value, str) or not value:
        raise GrammarError(f"'{field}' must be a non-empty string.", field)
    elif kind == "regex":
        text = native(ll.LLMatcher.grammar_from_regex, value)
    else:
        from llguidance.gbnf_to_lark import any_to_lark
        try:
            lark = native(any_to_lark, value)
        except RecursionError:  # its converter recurses once or more per level
            raise GrammarError(f"'{field}' cannot be used: its GBNF nests groups too deeply to convert; "
                               "nest fewer parentheses, or write it in Lark.", field) from None
        except Exception as exc:  # noqa: BLE001 (its converter raises bare Exceptions too)
            raise GrammarError(f"'{field}' cannot be used: it is not a valid GBNF grammar "
                               f"({one_line(str(exc))})", field) from None
        text = native(ll.LLMatcher.grammar_from_lark, lark)
    if len(text) > MAX_SCHEMA_BYTES:
        raise GrammarError(f"'{field}' is {len(text)} bytes as a grammar; at most {MAX_SCHEMA_BYTES} are "
                           "compiled.", field)
    return text


def check_grammar(text: str, field: str, what: str = GUIDES["json"]) -> None:
    """A grammar's problems, found before any tokenizer is loaded (``Grammars`` finds the rest)."""
    ll = load_llguidance()
    error = native(ll.LLMatcher.validate_grammar, text, None, limits=ll.LLParserLimits(**LIMITS))
    if error and not error.startswith("WARNING"):
        raise GrammarError(f"'{field}' cannot be used: {reason(error, what)}", field)


def one_line(error: str) -> str:
    """llguidance's error as one line: its first and its ``error:`` lines, without any dump of the
    parser's state or grammar that follows."""
    error = error.split("<state>")[0].split("<grammar>")[0]
    lines = [line.strip() for line in error.strip().splitlines()]
    error = " ".join(lines[:1] + [line for line in lines[1:] if line.startswith("error:")])
    return re.sub(rf'"([^"]{{{QUOTED}}})[^"]{{8,}}"', r'"\1..."', error)  # the request's regex, say


def too_complex(error: str) -> bool:
    return re.search(r"fuel|limit|\btoo\b|max is", error, re.IGNORECASE) is not None


def reason(error: str, what: str) -> str:
    error = one_line(error)
    if what == GUIDES["json"]:  # a place in the grammar made from the schema: nothing a client wrote
        error = re.sub(r"^at \d+\(\d+\): ", "", error)
    if "Unimplemented" in error or "Unknown format" in error:
        return f"an unsupported {what} feature ({error})"
    if too_complex(error):
        return f"it is too large or too complex to compile in bounded time ({error})"
    return f"it is not a valid {what} ({error})"
