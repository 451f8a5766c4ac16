"""The bench's prompts: JSONL files (the code and prose sets shipped with anyspec by default), and
the target ids of a prompt exactly as the engine builds them."""

from __future__ import annotations

import json
from pathlib import Path

from anyspec.engine.prompt import encode_prompt
from anyspec.errors import ConfigError

PROMPTS_DIR = Path(__file__).resolve().parents[1] / "data" / "prompts"  # package data
DEFAULT_PROMPTS = [PROMPTS_DIR / "code.jsonl", PROMPTS_DIR / "prose.jsonl"]


def load_prompts(path: Path) -> list[dict]:
    """JSONL: one ``{"id": ..., "messages": [{"role": "user", "content": ...}]}`` (or ``"prompt"``) a line."""
    if not path.is_file():
        raise ConfigError(f"prompt file {path} does not exist")
    rows = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            raise ConfigError(f"{path}:{n} is not valid JSON") from None
        if "messages" not in row and "prompt" not in row:
            raise ConfigError(f"{path}:{n} has neither 'messages' nor 'prompt'")
        rows.append({"id": row.get("id", f"{path.stem}-{n}"), "set": path.stem,
                     "prompt": row.get("messages") or row["prompt"]})
    if not rows:
        raise ConfigError(f"prompt file {path} has no prompts")
    return rows


def prompt_ids(tok, prompt) -> list[int]:
    """The target's prompt tokens exactly as the engine builds them."""
    return encode_prompt(tok, prompt)[0]
