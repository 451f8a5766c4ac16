"""``POST /tokenize`` and ``/detokenize``, as vLLM answers them: the target ids a completion's
``prompt`` or a chat's ``messages`` become here (the generation endpoints' own encoding, so a
client counts exactly what a request will hold), and the text of ids."""

from __future__ import annotations

from anyspec.server.fields import ApiError, body_field
from anyspec.server.protocol import chat_request, check_model, encoded_prompt, token_list, wanted_structure


def parse_tokenize(body, model_ids: tuple[str, ...], tokenizer, grammars) -> tuple[list[int], bool]:
    """``POST /tokenize`` (vLLM's): the ids a completion's ``prompt`` or a chat's ``messages``
    become, as the generation endpoints encode them (a chat's ``tools``, ``continue_final_message``
    and ``chat_template_kwargs`` too), and whether ``return_token_strs`` asks for their tokens'
    strings. ``grammars()``: the compiler that checks the tools' schemas, as a chat request's."""
    check_model(body, model_ids)
    if body_field(body, "add_special_tokens", (bool,), True) is not True:
        raise ApiError(400, "'add_special_tokens' other than true is not supported by this server.",
                       "add_special_tokens", "unsupported_parameter")
    strs = body_field(body, "return_token_strs", (bool,), False)
    if "messages" in body:
        messages, kwargs = chat_request(body, tokenizer)
        tools = wanted_structure(body, True, tokenizer, grammars).tools
        return encoded_prompt(tokenizer, messages, "messages", tools, kwargs).ids, strs
    if body.get("tools") is not None:
        raise ApiError(400, "'tools' come with 'messages'; a 'prompt' is tokenized as it is.", "tools",
                       "unsupported_parameter")
    prompt = body_field(body, "prompt", (str,))
    if prompt is None:
        raise ApiError(400, "Missing required parameter: 'prompt' (or 'messages').", "prompt",
                       "missing_required_parameter")
    return encoded_prompt(tokenizer, prompt, "prompt", None).ids, strs


def parse_detokenize(body, model_ids: tuple[str, ...], vocab: int) -> list[int]:
    """``POST /detokenize`` (vLLM's): ``tokens``, ids of the target's vocabulary."""
    check_model(body, model_ids)
    tokens = token_list(body, "tokens", vocab)
    if tokens is None:
        raise ApiError(400, "Missing required parameter: 'tokens'.", "tokens", "missing_required_parameter")
    return tokens
