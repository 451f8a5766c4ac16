"""``POST /tokenize`` and ``/detokenize``, as vLLM answers them: the target ids a completion's
``prompt`` or a chat's ``messages`` become here (the generation endpoints' own encoding, so a
client counts exactly what a request will hold), and the text of ids."""

from __future__ import annotations

from anyspec.server.protocol import (
    ApiError,
    body_field,
    chat_messages,
    check_model,
    checked_text,
    encoded_prompt,
    token_list,
)


def parse_tokenize(body, model_name: str, tokenizer) -> list[int]:
    """``POST /tokenize`` (vLLM's): the ids a completion's ``prompt`` or a chat's ``messages``
    become, as the generation endpoints encode them."""
    check_model(body, model_name)
    for name, default in (("add_special_tokens", True), ("add_generation_prompt", True)):
        if body_field(body, name, (bool,), default) is not default:
            raise ApiError(400, f"'{name}' other than {str(default).lower()} is not supported by this "
                                "server.", name, "unsupported_parameter")
    if body.get("tools") is not None:
        raise ApiError(400, "'tools' is not supported by /tokenize.", "tools", "unsupported_parameter")
    if "messages" in body:
        return encoded_prompt(tokenizer, chat_messages(body), "messages", None).ids
    prompt = body_field(body, "prompt", (str,))
    if prompt is None:
        raise ApiError(400, "Missing required parameter: 'prompt' (or 'messages').", "prompt",
                       "missing_required_parameter")
    return encoded_prompt(tokenizer, checked_text(prompt, "prompt"), "prompt", None).ids


def parse_detokenize(body, model_name: str, vocab: int) -> list[int]:
    """``POST /detokenize`` (vLLM's): ``tokens``, ids of the target's vocabulary."""
    check_model(body, model_name)
    tokens = token_list(body, "tokens", vocab)
    if tokens is None:
        raise ApiError(400, "Missing required parameter: 'tokens'.", "tokens", "missing_required_parameter")
    return tokens
