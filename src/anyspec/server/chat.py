"""How a chat request's messages are rendered, beyond the messages themselves (vLLM's fields):
``continue_final_message`` (the answer continues the last message, an assistant's, instead of
beginning a turn of its own; ``add_generation_prompt`` false goes with it) and
``chat_template_kwargs`` (the template's own variables, such as ``enable_thinking``)."""

from __future__ import annotations

import inspect

from anyspec.config import json_depth
from anyspec.engine.grammar_text import TOOL_CLOSE, TOOL_OPEN
from anyspec.server.structured import StructuredError


def _switch(body: dict, name: str) -> bool | None:
    value = body.get(name)
    if value is not None and not isinstance(value, bool):
        raise StructuredError(f"Invalid type for '{name}': expected a boolean.", name, "invalid_type")
    return value


def continued(body: dict, messages: list[dict]) -> list[dict]:
    """``messages``, the last marked ``prefix`` (``config.check_prompt``) where the request asks for
    it to be continued."""
    go_on, generation = _switch(body, "continue_final_message"), _switch(body, "add_generation_prompt")
    if go_on and generation:
        raise StructuredError("'continue_final_message' and 'add_generation_prompt' cannot both be true.",
                              "add_generation_prompt")
    if generation is False and not go_on:
        raise StructuredError("'add_generation_prompt': false is taken only with 'continue_final_message': "
                              "true (the answer continues the last message); leave it out.",
                              "add_generation_prompt", "unsupported_parameter")
    if not go_on:
        return messages
    last = messages[-1]
    if last["role"] != "assistant" or not last["content"] or last.get("tool_calls"):
        raise StructuredError("'continue_final_message' needs the last message to be an assistant's, with "
                              "text and no tool calls.", "continue_final_message")
    text = last["content"]  # chat_messages joined its parts
    calls = body.get("tools") and body.get("tool_choice") != "none"
    if calls and text.rfind(TOOL_OPEN) > text.rfind(TOOL_CLOSE):
        raise StructuredError(f"'continue_final_message': the assistant's message ends inside a {TOOL_OPEN}, "
                              "and a call is held to its function's parameters only from its start; close "
                              "the call in the message, or leave it to the answer.", "continue_final_message")
    return [*messages[:-1], last | {"prefix": True}]


# what a chat template reads beside its own variables: the rendering's arguments and the functions it
# calls (transformers'); a variable of the same name would replace them, or clash with them
RENDERED = ("messages", "tools", "documents", "add_generation_prompt", "raise_exception", "strftime_now")
MAX_DEPTH = 64  # levels of objects and arrays, chat_template_kwargs itself the first


def template_kwargs(body: dict, tokenizer) -> dict | None:
    """``chat_template_kwargs``: variables for the template, none of them a parameter of its rendering
    or a name the rendering sets itself, none nested deeper than ``MAX_DEPTH``."""
    kwargs = body.get("chat_template_kwargs")
    if kwargs is None:
        return None
    if not isinstance(kwargs, dict):
        raise StructuredError("Invalid type for 'chat_template_kwargs': expected an object.",
                              "chat_template_kwargs", "invalid_type")
    own = {name for name, p in inspect.signature(tokenizer.apply_chat_template).parameters.items()
           if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)}
    if clash := sorted(own & set(kwargs)):
        raise StructuredError(f"'chat_template_kwargs' cannot set '{clash[0]}', a parameter of the "
                              "rendering, not a variable of the template.",
                              f"chat_template_kwargs.{clash[0]}")
    if clash := sorted(set(RENDERED) & set(kwargs)):
        raise StructuredError(f"'chat_template_kwargs' cannot set '{clash[0]}': the rendering sets it "
                              "itself (from the request's own fields).", f"chat_template_kwargs.{clash[0]}")
    if json_depth(kwargs) > MAX_DEPTH:
        raise StructuredError(f"'chat_template_kwargs' is nested more than {MAX_DEPTH} levels deep.",
                              "chat_template_kwargs")
    return kwargs
