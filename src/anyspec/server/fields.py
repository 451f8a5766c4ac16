"""What every endpoint's request checks share: the ``ApiError`` a bad field is answered with
(OpenAI's ``{"error": {"message", "type", "param", "code"}}``), and a field's type and text."""

from __future__ import annotations

import re

from anyspec.config import lone_surrogate, utf8_problem

JSON_NAMES = {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "an array",
              dict: "an object", type(None): "null"}


class ApiError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.headers = status, message, param, code, headers


class ClientGone(Exception):
    pass


class Body(dict):
    """A request's JSON object that remembers which fields were looked at: the others are fields
    this server ignores (a typo such as ``max_token`` among them)."""

    def __init__(self, body: dict):
        super().__init__(body)
        self.read: set[str] = set()

    def get(self, key, default=None):
        self.read.add(key)
        return super().get(key, default)

    def __getitem__(self, key):
        self.read.add(key)
        return super().__getitem__(key)

    def __contains__(self, key):
        self.read.add(key)
        return super().__contains__(key)

    def ignored(self) -> list[str]:
        return sorted(set(self) - self.read)


def error_body(status: int, message: str, param: str | None = None, code: str | None = None) -> dict:
    kind = {429: "rate_limit_error", 500: "server_error", 503: "server_error"}
    kind = kind.get(status, "invalid_request_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def body_field(body: dict, name: str, kinds: tuple, default=None, within: str | None = None):
    """Field ``name`` of ``body`` (None: ``default``), a 400 where it is not of one of ``kinds``;
    ``within``: the field ``body`` is, named before ``name`` in the error (``stream_options``)."""
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
        want = " or ".join(JSON_NAMES[k] for k in kinds if not (k is int and float in kinds))
        got = JSON_NAMES.get(type(value), type(value).__name__)
        param = f"{within}.{name}" if within else name
        raise ApiError(400, f"Invalid type for '{param}': expected {want}, but got {got} instead.", param,
                       "invalid_type")
    return value


def check_refused(body: dict, refused: dict, why=lambda name: "leave it out") -> None:
    """Fields other servers take that this one cannot honour, unless they change nothing
    (``refused``: name -> the values that change nothing; ``why(name)``: what to do instead)."""
    for name, harmless in refused.items():
        if not changes_nothing(body.get(name), harmless):
            raise ApiError(400, f"'{name}' is not supported by this server; {why(name)}.", name,
                           "unsupported_parameter")


def check_own_fields(body: dict, endpoint: str, refused: dict, chat_fields: dict, types: list,
                     why=lambda name: "leave it out") -> None:
    """The fields an endpoint other than the chat's takes or refuses: the ``refused``
    (``check_refused``), the chat's own where it has one of its own or none (``chat_fields``: name
    -> its own field, or ""), and the types of those it keeps to itself (``types``: (name, type))."""
    check_refused(body, refused, why)
    for name, instead in chat_fields.items():
        if name in body:
            hint = f"; it takes '{instead}'" if instead else ""
            raise ApiError(400, f"'{name}' is a chat completions field, not one of {endpoint}{hint}.", name,
                           "unsupported_parameter")
    for name, kind in types:
        body_field(body, name, (kind,))


def same_json(a, b) -> bool:
    """``a == b`` as JSON values: a boolean is not a number (``true`` is not ``1``), ``1.0`` is ``1``."""
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(map(same_json, a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_json(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


def changes_nothing(value, harmless: tuple) -> bool:
    """Whether ``value`` is one of the ``harmless`` values of a field, type and all."""
    return any(same_json(value, h) for h in harmless)


def number(value: int | float) -> str:
    """A number for a message: a huge integer as its digit count, not its digits."""
    digits = len(str(abs(value))) if isinstance(value, int) and abs(value) > 10**15 else 0
    return f"an integer of {digits} digits" if digits else str(value)


ESCAPED_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F]")  # in raw JSON, where any lone surrogate comes from


def check_unicode(raw: bytes | bytearray, value) -> None:
    """JSON may carry lone surrogates (``"\\ud800"``), which no tokenizer, template or grammar can
    encode: a 400 naming the first string (or key) that holds one, as ``messages[0].content``."""
    if not ESCAPED_SURROGATE.search(raw) or (found := lone_surrogate(value)) is None:
        return
    path, text, key = found
    if key:
        raise ApiError(400, f"A key of '{path or 'body'}' is not valid Unicode text (a lone surrogate).",
                       path or None, "invalid_value")
    raise ApiError(400, f"'{path or 'body'}' is not valid Unicode text (a lone surrogate at character "
                        f"{utf8_problem(text)}).", path or None, "invalid_value")
