"""A prompt becomes the ids a model reads in one way, for the engine, the server and the bench; and
one set of ids ends a generation.
"""

from __future__ import annotations

from anyspec.config import check_prompt
from anyspec.errors import ConfigError


def render_prompt(tokenizer, prompt: str | list[dict], fallback_text: str | None = None) -> tuple[str, bool]:
    """``(text, is_chat)``: chat messages through the tokenizer's own template when it has one."""
    check_prompt(prompt)
    if isinstance(prompt, str):
        return prompt, False
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True), True
    if fallback_text is not None:
        return fallback_text, False
    raise ConfigError("the target tokenizer has no chat template; pass the prompt as plain text")


def encode_prompt(tokenizer, prompt: str | list[dict], fallback_text: str | None = None
                  ) -> tuple[list[int], str, bool]:
    """``(ids, text, is_chat)``. Plain text gets the tokenizer's special tokens (BOS); a rendered chat
    template already holds them."""
    text, chat = render_prompt(tokenizer, prompt, fallback_text)
    return tokenizer.encode(text, add_special_tokens=not chat), text, chat


def end_ids(model) -> set[int]:
    """The ids that end a generation: the model's EOS ids and the tokenizer's end-of-turn markers."""
    from anyspec.vocab.bytes import eos_ids

    return set(model.eos_ids()) | set(eos_ids(model.tokenizer))


def context_length(model) -> int | None:
    """The most tokens the model reads (its ``max_position_embeddings``); None when unknown."""
    known = getattr(model, "context_length", None)
    if isinstance(known, int):
        return known
    config = getattr(getattr(model, "model", None), "config", None)
    if config is None or not hasattr(config, "get_text_config"):
        return None
    return getattr(config.get_text_config(), "max_position_embeddings", None)


def check_room(prompt_tokens: int, max_new_tokens: int, context: int | None) -> None:
    if context is not None and prompt_tokens + max_new_tokens > context:
        raise ConfigError(f"the prompt has {prompt_tokens} tokens and up to {max_new_tokens} more are asked "
                          f"for, beyond the target's context of {context} tokens; shorten the prompt or "
                          "ask for fewer new tokens")
