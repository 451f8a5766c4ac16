"""The bench's prompts: JSONL files (the code and prose sets shipped with anyspec by default; edit,
doc, long, chat, json and languages beside them), and the target ids of a prompt exactly as the
engine builds them.

A line is one prompt, ``{"id": ..., "messages": [...]}`` (or ``"prompt": text``), or one
conversation, ``{"id": ..., "system": text (optional), "turns": [user text, ...]}``: its turns run
as successive requests on the same engine or server, each after the method's own earlier answers
(``conversation``). A prompt may carry ``"schema"``: a JSON Schema its answer is constrained to
(the json set; anyspec's own methods honour it), and ``"prediction"``: text its answer likely repeats
(the edit set's: the file it pastes), which the ``*-predicted`` methods give the engine."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from anyspec.config import check_prompt
from anyspec.engine.prompt import encode_prompt
from anyspec.errors import ConfigError

PROMPTS_DIR = Path(__file__).resolve().parents[1] / "data" / "prompts"  # package data
DEFAULT_PROMPTS = [PROMPTS_DIR / "code.jsonl", PROMPTS_DIR / "prose.jsonl"]
# in PROMPTS_DIR; code and prose by default
SETS = ("code", "prose", "edit", "doc", "long", "chat", "json", "languages")


ROLES = ("system", "user", "assistant")


def prompt_file(name: str | Path) -> Path:
    """A ``--prompts`` argument: a JSONL file, or the name of a set shipped with anyspec (``SETS``)
    where no such file exists."""
    path = Path(name)
    return PROMPTS_DIR / f"{name}.jsonl" if str(name) in SETS and not path.exists() else path


def load_prompts(path: Path) -> list[dict]:
    """JSONL: one ``{"id": ..., "messages": [{"role": "user", "content": ...}]}`` (or ``"prompt"``) a line.

    Every line is checked here, before any model loads: a bad one is a ``ConfigError`` naming it."""
    if not path.is_file():
        raise ConfigError(f"prompt file {path} does not exist (the sets shipped with anyspec: "
                          f"{', '.join(SETS)})")
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        line = path.read_bytes()[:exc.start].count(b"\n") + 1
        raise ConfigError(f"{path}:{line} is not valid UTF-8") from None
    rows = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            raise ConfigError(f"{path}:{n} is not valid JSON") from None
        try:
            rows.append(prompt_row(row, path, n))
        except ConfigError as exc:
            raise ConfigError(f"{path}:{n}: {exc}") from None
    if not rows:
        raise ConfigError(f"prompt file {path} has no prompts")
    return rows


def prompt_row(row, path: Path, n: int) -> dict:
    """One line's prompt: an object with a non-empty ``prompt`` text or ``messages`` list, or a
    conversation's ``turns``."""
    if not isinstance(row, dict):
        raise ConfigError("expected a JSON object with 'messages', 'prompt' or 'turns', "
                          f"got {type(row).__name__}")
    if "turns" in row:
        return conversation_row(row, path, n)
    if "messages" not in row and "prompt" not in row:
        raise ConfigError("has neither 'messages' nor 'prompt' nor 'turns'")
    prompt = row["messages"] if "messages" in row else row["prompt"]
    if not isinstance(prompt, str | list):
        raise ConfigError("'prompt' must be a text and 'messages' a list of {'role', 'content'} objects")
    if isinstance(prompt, list):
        for i, m in enumerate(prompt):
            if not isinstance(m, dict) or m.get("role") not in ROLES or not isinstance(m.get("content"), str):
                raise ConfigError(f"message {i} must be {{'role': one of {', '.join(ROLES)}, "
                                  "'content': a text}")
    check_prompt(prompt)
    if not isinstance(row.get("schema", {}), dict):
        raise ConfigError("'schema' must be a JSON Schema object")
    if "prediction" in row and not (isinstance(row["prediction"], str) and row["prediction"]):
        raise ConfigError("'prediction' must be a non-empty text")
    return {"id": row_id(row, path, n), "set": path.stem, "prompt": prompt, "schema": row.get("schema"),
            "prediction": row.get("prediction")}


def row_id(row: dict, path: Path, n: int) -> str:
    pid = row.get("id", f"{path.stem}-{n}")
    if not isinstance(pid, str | int) or isinstance(pid, bool):
        raise ConfigError("'id' must be a text or an integer")
    return str(pid)


def conversation_row(row: dict, path: Path, n: int) -> dict:
    """A conversation: ``turns``, at least two non-empty user texts, and an optional ``system`` text;
    its ``prompt`` is the first turn's messages."""
    turns, system = row["turns"], row.get("system")
    if "messages" in row or "prompt" in row:
        raise ConfigError("has 'turns' beside 'messages' or 'prompt'; a line is a prompt or a conversation")
    if not isinstance(turns, list) or len(turns) < 2 or not all(isinstance(t, str) and t for t in turns):
        raise ConfigError("'turns' must be a list of at least two non-empty user texts")
    if system is not None and not (isinstance(system, str) and system):
        raise ConfigError("'system' must be a non-empty text")
    head = [{"role": "system", "content": system}] if system else []
    check_prompt(head + [{"role": "user", "content": turn} for turn in turns])
    return {"id": row_id(row, path, n), "set": path.stem, "turns": list(turns),
            "prompt": head + [{"role": "user", "content": turns[0]}]}


def conversation(p: dict, answer) -> Iterator[tuple[str, list[dict], object]]:
    """Each request of the bench row ``p``: ``(id, messages, answer(messages))``; a conversation's
    turn ``n`` is ``ID/n``, its messages the earlier turns with ``answer``'s own replies (its
    ``["text"]``)."""
    if "turns" not in p:
        yield p["id"], p["prompt"], answer(p["prompt"])
        return
    messages = p["prompt"][:-1]
    for n, turn in enumerate(p["turns"], 1):
        messages = messages + [{"role": "user", "content": turn}]
        result = answer(messages)
        yield f"{p['id']}/{n}", messages, result
        messages = messages + [{"role": "assistant", "content": result["text"]}]


def prompt_ids(tok, prompt) -> list[int]:
    """The target's prompt tokens exactly as the engine builds them."""
    return encode_prompt(tok, prompt)[0]


def longest_request(tok, p: dict, max_new_tokens: int) -> int:
    """The target tokens of the bench row ``p``'s longest prompt: a conversation's last turn holds
    every earlier turn and answer, each answer counted as ``max_new_tokens`` and a few for its
    template."""
    if "turns" not in p:
        return len(prompt_ids(tok, p["prompt"]))
    every = p["prompt"][:-1] + [{"role": "user", "content": turn} for turn in p["turns"]]
    return len(prompt_ids(tok, every)) + (len(p["turns"]) - 1) * (max_new_tokens + 8)
