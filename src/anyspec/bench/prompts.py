"""The bench's prompts: JSONL files (the code and prose sets shipped with anyspec by default), and
the target ids of a prompt exactly as the engine builds them."""

from __future__ import annotations

import json
from pathlib import Path

from anyspec.config import check_prompt
from anyspec.engine.prompt import encode_prompt
from anyspec.errors import ConfigError

PROMPTS_DIR = Path(__file__).resolve().parents[1] / "data" / "prompts"  # package data
DEFAULT_PROMPTS = [PROMPTS_DIR / "code.jsonl", PROMPTS_DIR / "prose.jsonl"]


ROLES = ("system", "user", "assistant")


def load_prompts(path: Path) -> list[dict]:
    """JSONL: one ``{"id": ..., "messages": [{"role": "user", "content": ...}]}`` (or ``"prompt"``) a line.

    Every line is checked here, before any model loads: a bad one is a ``ConfigError`` naming it."""
    if not path.is_file():
        raise ConfigError(f"prompt file {path} does not exist")
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
    """One line's prompt: an object with a non-empty ``prompt`` text or ``messages`` list."""
    if not isinstance(row, dict):
        raise ConfigError(f"expected a JSON object with 'messages' or 'prompt', got {type(row).__name__}")
    if "messages" not in row and "prompt" not in row:
        raise ConfigError("has neither 'messages' nor 'prompt'")
    prompt = row["messages"] if "messages" in row else row["prompt"]
    if not isinstance(prompt, str | list):
        raise ConfigError("'prompt' must be a text and 'messages' a list of {'role', 'content'} objects")
    if isinstance(prompt, list):
        for i, m in enumerate(prompt):
            if not isinstance(m, dict) or m.get("role") not in ROLES or not isinstance(m.get("content"), str):
                raise ConfigError(f"message {i} must be {{'role': one of {', '.join(ROLES)}, "
                                  "'content': a text}")
    check_prompt(prompt)
    pid = row.get("id", f"{path.stem}-{n}")
    if not isinstance(pid, str | int) or isinstance(pid, bool):
        raise ConfigError("'id' must be a text or an integer")
    return {"id": str(pid), "set": path.stem, "prompt": prompt}


def prompt_ids(tok, prompt) -> list[int]:
    """The target's prompt tokens exactly as the engine builds them."""
    return encode_prompt(tok, prompt)[0]
