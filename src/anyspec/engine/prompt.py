"""A prompt becomes the ids a model reads in one way, for the engine, the server and the bench; and
one set of ids ends a generation.
"""

from __future__ import annotations

import json
import re
import weakref

from anyspec.config import check_prompt
from anyspec.errors import ConfigError


def render_prompt(tokenizer, prompt: str | list[dict], fallback_text: str | None = None,
                  tools: list[dict] | None = None, template_kwargs: dict | None = None) -> tuple[str, bool]:
    """``(text, is_chat)``: chat messages through the tokenizer's own template when it has one,
    with ``tools`` (OpenAI's function definitions) and ``template_kwargs`` (the template's own
    variables) where given; a last message marked ``prefix`` is continued, not answered."""
    check_prompt(prompt)
    if isinstance(prompt, str):
        return prompt, False
    if getattr(tokenizer, "chat_template", None):
        return _template(tokenizer, prompt, tools, template_kwargs), True
    if fallback_text is not None:
        return fallback_text, False
    raise ConfigError("the target tokenizer has no chat template; pass the prompt as plain text, or give "
                      "the target a template (chat_template, --chat-template: a file or the template's text)")


def _template(tokenizer, messages: list[dict], tools: list[dict] | None, template_kwargs: dict | None) -> str:
    go_on = bool(messages[-1].get("prefix"))
    try:
        return tokenizer.apply_chat_template(messages, tools=tools, tokenize=False,
                                             add_generation_prompt=not go_on, continue_final_message=go_on,
                                             **(template_kwargs or {}))
    except ValueError as exc:  # transformers: the template drops or rewrites the message to continue
        if not go_on:
            raise
        raise ConfigError(f"the chat template cannot continue the last message: {exc}") from None


def encode_prompt(tokenizer, prompt: str | list[dict], fallback_text: str | None = None,
                  tools: list[dict] | None = None, template_kwargs: dict | None = None
                  ) -> tuple[list[int], str, bool]:
    """``(ids, text, is_chat)``. Plain text gets the tokenizer's special tokens (BOS); a rendered chat
    template already holds them. A control token written inside a message (``<|im_end|>``, or an
    added token such as ``<tool_call>``) is encoded as the text it spells, never as the token: only
    the template makes turns and tool calls."""
    text, chat = render_prompt(tokenizer, prompt, fallback_text, tools, template_kwargs)
    if chat and _controls_in_contents(tokenizer, prompt):
        return _encode_contents_as_text(tokenizer, prompt, text, tools, template_kwargs), text, chat
    return tokenizer.encode(text, add_special_tokens=not chat), text, chat


_MARK = "\ue000{}\ue001"  # private-use characters: a placeholder for message i's content


def _control_texts(tokenizer) -> list[str]:
    """The text of every added token: control tokens such as ``<|im_start|>``, and the tokens a
    template writes that are not marked special (``<tool_call>``)."""
    added = getattr(tokenizer, "added_tokens_decoder", None) or {}
    texts = [t.content for t in added.values()]
    return sorted(set(texts or getattr(tokenizer, "all_special_tokens", [])), key=len, reverse=True)


def _plain_texts(tokenizer) -> list[str]:
    """The added tokens the tokenizer matches even with ``split_special_tokens``: those not special."""
    added = getattr(tokenizer, "added_tokens_decoder", None) or {}
    return [t.content for t in added.values() if not t.special]


_PLAIN = weakref.WeakKeyDictionary()  # a tokenizer -> its copy without added tokens, gone with it


def _as_text(tokenizer, part: str) -> list[int]:
    """``part``'s ids with every added token in it read as the text it spells."""
    if not any(t in part for t in _plain_texts(tokenizer)):
        return tokenizer(part, add_special_tokens=False, split_special_tokens=True)["input_ids"]
    if tokenizer not in _PLAIN:
        from tokenizers import Tokenizer

        spec = json.loads(tokenizer.backend_tokenizer.to_str())
        spec["added_tokens"] = []
        _PLAIN[tokenizer] = Tokenizer.from_str(json.dumps(spec))
    return _PLAIN[tokenizer].encode(part, add_special_tokens=False).ids


def _controls_in_contents(tokenizer, messages: list[dict]) -> bool:
    controls = _control_texts(tokenizer)
    return any(c in m.get("content") for m in messages if isinstance(m.get("content"), str) for c in controls)


def _encode_contents_as_text(tokenizer, messages: list[dict], text: str, tools: list[dict] | None = None,
                             template_kwargs: dict | None = None) -> list[int]:
    """The template rendered around placeholders: the control tokens it writes stay control tokens;
    each stretch between them, with the message contents put back, is encoded with special tokens
    read as text. Stretch by stretch is how the tokenizer reads any text between control tokens."""
    contents = [m.get("content") or "" for m in messages]
    marked = [m | {"content": _MARK.format(i)} if m.get("content") else m for i, m in enumerate(messages)]
    frame = _template(tokenizer, marked, tools, template_kwargs)
    controls = re.compile("(" + "|".join(re.escape(c) for c in _control_texts(tokenizer)) + ")")
    marks = re.compile("\ue000([0-9]+)\ue001")
    pieces = [(part, i % 2 == 1) for i, part in enumerate(controls.split(frame)) if part]
    filled = [(part if control else marks.sub(lambda m: contents[int(m.group(1))], part), control)
              for part, control in pieces]
    if "".join(part for part, _ in filled) != text:
        raise ConfigError("a message holds a control token of the chat template (such as "
                          f"{_control_texts(tokenizer)[0]}) and this template rewrites message contents, "
                          "so it cannot be kept as text; remove it from the message")
    ids: list[int] = []
    for part, control in filled:
        if control:
            ids += tokenizer(part, add_special_tokens=False, split_special_tokens=False)["input_ids"]
        else:
            ids += _as_text(tokenizer, part)
    return ids


def end_ids(model) -> set[int]:
    """The ids that end a generation: the model's EOS ids and the tokenizer's end-of-turn markers."""
    from anyspec.vocab.bytes import eos_ids

    return set(model.eos_ids()) | set(eos_ids(model.tokenizer))


def check_room(prompt_tokens: int, max_new_tokens: int, context: int | None) -> None:
    if context is not None and prompt_tokens + max_new_tokens > context:
        raise ConfigError(f"the prompt has {prompt_tokens} tokens and up to {max_new_tokens} more are asked "
                          f"for, beyond the target's context of {context} tokens; shorten the prompt or "
                          "ask for fewer new tokens")


# Fill-in-the-middle control tokens, prefix-suffix-middle order: the model writes what goes between
# the prefix and the suffix (Qwen2.5-Coder and StarCoder2; StarCoder and SantaCoder; DeepSeek-Coder).
FIM_TOKENS = (("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"),
              ("<fim_prefix>", "<fim_suffix>", "<fim_middle>"),
              ("<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>"))


def infill_prefix(prompt: str) -> str | None:
    """The text before the hole of a fill-in-the-middle prompt (``fill_in_the_middle``'s form), or
    None for any other prompt."""
    for pre, suf, mid in FIM_TOKENS:
        if prompt.startswith(pre) and prompt.endswith(mid) and suf in prompt:
            return prompt[len(pre):prompt.index(suf)]
    return None


def fill_in_the_middle(tokenizer, prefix: str, suffix: str) -> str | None:
    """The prompt that asks for the text between ``prefix`` and ``suffix``, with the first of
    ``FIM_TOKENS`` the tokenizer has as tokens; None when it has none of them."""
    added = {t.content for t in (getattr(tokenizer, "added_tokens_decoder", None) or {}).values()}
    for pre, suf, mid in FIM_TOKENS:
        if {pre, suf, mid} <= added:
            return f"{pre}{prefix}{suf}{suffix}{mid}"
    return None
