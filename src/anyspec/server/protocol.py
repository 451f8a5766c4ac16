"""The OpenAI wire format: a request body checked field by field, and the answers, whole or streamed.

Every problem in a request is an ``ApiError`` naming the field (``param``), answered as
``{"error": {"message", "type", "param", "code"}}``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from anyspec.config import MAX_LOGPROBS, ROLES, SamplingParams, check_allowed, checked_seed
from anyspec.engine import encode_prompt
from anyspec.engine.prompt import fill_in_the_middle
from anyspec.errors import ConfigError
from anyspec.server.chat import continued, template_kwargs
from anyspec.server.fields import ApiError, Body, body_field, check_refused, number
from anyspec.server.structured import (
    Structure,
    StructuredError,
    message_fields,
    structure,
)

MAX_CHOICES = 128  # OpenAI's limit on n
UNSUPPORTED = {"best_of": (None, 1),
               "functions": (None, []), "function_call": (None, "none", "auto"),
               # other servers' fields that would change the answer: refused unless they change nothing
               "repeat_penalty": (None, 1),
               "mirostat": (None, 0), "tfs_z": (None, 1), "top_a": (None, 0), "dry_multiplier": (None, 0),
               "xtc_probability": (None, 0), "dynatemp_range": (None, 0), "use_beam_search": (None, False),
               "length_penalty": (None, 1), "bad_words": (None, []), "truncate_prompt_tokens": (None,),
               "skip_special_tokens": (None, True), "spaces_between_special_tokens": (None, True),
               "prompt_logprobs": (None,), "n_predict": (None,), "return_tokens_as_token_ids": (None, False),
               "modalities": (None, ["text"]), "audio": (None,)}


@dataclass
class Prompt:
    """One prompt of a request, encoded once: as sent (text or chat messages; token ids as their
    text, which the draft reads), the target's ids and the rendered text."""
    sent: str | list[dict]
    ids: list[int]
    text: str


@dataclass
class Parsed:
    prompts: list[Prompt]  # chat: one; completions: one or more (an array of prompts)
    params: SamplingParams
    stream: bool
    include_usage: bool
    speculative: bool
    structure: Structure  # response_format, tools and tool_choice
    n: int = 1  # choices per prompt: choice i is sampled with seed + i (past 2**64 - 1, from 0)
    echo: bool = False  # completions: each choice's text (and logprobs) begins with its prompt's
    ignored: list[str] = dataclasses.field(default_factory=list)  # fields nothing here reads

    def choice_params(self, i: int) -> SamplingParams:
        """Choice i's sampling: the request's, with seed + i where a seed was given (none: each
        choice draws its own)."""
        seed = self.params.seed
        if seed is None or i == 0:
            return self.params
        return dataclasses.replace(self.params, seed=(seed + i) % 2**64)


def _checked(check, *args):
    """``check(*args)``, a ``StructuredError`` it raises as the 400 it describes."""
    try:
        return check(*args)
    except StructuredError as exc:
        raise ApiError(400, exc.message, exc.param, exc.code) from None


def chat_messages(body: dict) -> list[dict]:
    messages = body_field(body, "messages", (list,))
    if not messages:
        raise ApiError(400, "'messages' must be a non-empty array of {role, content} objects.", "messages",
                       "empty_array" if messages == [] else "missing_required_parameter")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise ApiError(400, f"messages[{i}] must be an object with a string 'role'.", f"messages[{i}]",
                           "invalid_type")
        if m["role"] not in (*ROLES, "developer"):
            raise ApiError(400, f"messages[{i}].role must be one of {', '.join(ROLES)}, developer, got "
                                f"{m['role']!r}.", f"messages[{i}].role", "invalid_value")
        extra = _checked(message_fields, m, i)
        content = m.get("content")
        if content is None and m["role"] != "assistant":
            raise ApiError(400, f"messages[{i}].content must be a string or an array of text parts; null "
                                "is allowed only for an assistant message.", f"messages[{i}].content",
                           "invalid_type")
        if isinstance(content, list):
            if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                       for p in content):
                raise ApiError(400, f"messages[{i}].content: only text parts are supported.",
                               f"messages[{i}].content", "invalid_value")
            content = "".join(p["text"] for p in content)
        elif content is None:
            content = ""
        elif not isinstance(content, str):
            raise ApiError(400, f"Invalid type for 'messages[{i}].content': expected a string or an array of "
                                "text parts.", f"messages[{i}].content", "invalid_type")
        out.append({"role": "system" if m["role"] == "developer" else m["role"],  # as OpenAI's models read it
                    "content": content} | extra)
    return out


def chat_request(body: dict, tokenizer) -> tuple[list[dict], dict | None]:
    """A chat request's messages, the last marked to be continued where it asks (``chat.continued``),
    and its chat template's variables (``chat.template_kwargs``)."""
    return _checked(continued, body, chat_messages(body)), _checked(template_kwargs, body, tokenizer)


def wanted_structure(body: dict, chat: bool, tokenizer, grammars) -> Structure:
    """What ``response_format``, ``tools`` and ``tool_choice`` ask for (``structured.structure``),
    each problem the 400 naming its field."""
    return _checked(structure, body, chat, tokenizer, grammars)


def _prompts(body: dict, vocab: int) -> list[str | list[int]]:
    """``prompt``: a string, an array of token ids, or an array of either (one choice each)."""
    prompt = body.get("prompt")
    if prompt is None:
        raise ApiError(400, "Missing required parameter: 'prompt'.", "prompt", "missing_required_parameter")
    if isinstance(prompt, str) or (isinstance(prompt, list) and prompt
                                   and not any(isinstance(one, str | list) for one in prompt)):
        prompt = [prompt]  # one prompt: text, or what should be token ids
    if not isinstance(prompt, list) or not prompt:
        raise ApiError(400, "'prompt' must be a string, an array of token ids, or a non-empty array of "
                            "either.", "prompt", "invalid_type")
    for i, one in enumerate(prompt):
        name = "prompt" if len(prompt) == 1 else f"prompt[{i}]"
        ids = isinstance(one, list) and all(map(_is_id, one))
        if not ids and not isinstance(one, str):
            raise ApiError(400, f"'{name}' must be a string or an array of token ids.", name, "invalid_type")
        if ids and (bad := next((t for t in one if not 0 <= t < vocab), None)) is not None:
            raise ApiError(400, f"'{name}' holds token id {number(bad)}; this model's ids run from 0 to "
                                f"{vocab - 1}.", name, "invalid_value")
        if not one:
            raise ApiError(400, f"'{name}' must not be empty.", name, "invalid_value")
    return prompt


def _infills(prompts: list[str | list[int]], suffix: str | None, tokenizer) -> list[str | list[int]]:
    """With a ``suffix``, each prompt becomes the fill-in-the-middle prompt for the text between
    the two (the target's FIM tokens)."""
    if not suffix:
        return prompts
    if not all(isinstance(p, str) for p in prompts):
        raise ApiError(400, "'suffix' takes text prompts, not token ids.", "suffix", "invalid_value")
    filled = [fill_in_the_middle(tokenizer, p, suffix) for p in prompts]
    if None in filled:
        raise ApiError(400, "'suffix' needs a model with fill-in-the-middle tokens; this one has none.",
                       "suffix", "unsupported_parameter")
    return filled


def _is_id(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def encoded_prompt(tokenizer, prompt: str | list[int] | list[dict], param: str, tools,
                   template_kwargs: dict | None = None) -> Prompt:
    """A prompt's target ids: text and messages encoded (the chat template, ``tools`` and its
    ``template_kwargs``), token ids as they are."""
    if isinstance(prompt, list) and all(map(_is_id, prompt)):
        text = tokenizer.decode(prompt)
        return Prompt(text, list(prompt), text)
    try:
        ids, text, _ = encode_prompt(tokenizer, prompt, tools=tools, template_kwargs=template_kwargs)
    except Exception as exc:  # ConfigError, or the chat template refusing these messages
        raise ApiError(400, f"{type(exc).__name__}: {exc}" if not isinstance(exc, ConfigError) else str(exc),
                       param, "invalid_value") from None
    return Prompt(prompt, ids, text)


SHAPES = {  # each filter's field: its default, its range, and how the range reads
    "temperature": (1.0, lambda v: 0 <= v <= 2, "between 0 and 2"),
    "top_p": (1.0, lambda v: 0 < v <= 1, "above 0 and at most 1"),
    "top_k": (0, lambda v: v >= -1, ">= 0 (0 or -1 = off)"),
    "min_p": (0.0, lambda v: 0 <= v <= 1, "from 0 to 1 (0 = off)"),
    "typical_p": (1.0, lambda v: 0 < v <= 1, "above 0 and at most 1 (1 = off)"),
    "top_n_sigma": (-1.0, lambda v: -1e9 < v <= 100, "at most 100 (0 or below = off)"),
}


def _shaping(body: dict) -> dict:
    """``SamplingParams``' temperature and filters, each checked against its range."""
    out = {}
    for name, (default, fits, says) in SHAPES.items():
        value = body_field(body, name, (int,) if name == "top_k" else (int, float), default)
        if not fits(value):
            raise ApiError(400, f"'{name}' must be {says}, got {number(value)}.", name, "invalid_value")
        out[name] = max(value, 0) if name == "top_k" else max(float(value), 0.0)
    return out


def _penalties(body: dict, vocab: int) -> tuple[float, float, dict[int, float]]:
    """``presence_penalty``, ``frequency_penalty`` and ``logit_bias`` (its keys token ids, as text)."""
    penalties = []
    for name in ("presence_penalty", "frequency_penalty"):
        value = body_field(body, name, (int, float), 0.0)
        if not -2 <= value <= 2:
            raise ApiError(400, f"'{name}' must be from -2 to 2, got {number(value)}.", name,
                           "invalid_value")
        penalties.append(float(value))
    bias = {}
    for key, value in body_field(body, "logit_bias", (dict,), {}).items():
        token = int(key) if key.isascii() and key.isdigit() and len(key) < 11 else -1
        if not 0 <= token < vocab:
            raise ApiError(400, f"'logit_bias' keys must be token ids from 0 to {vocab - 1}, got {key!r}.",
                           "logit_bias", "invalid_value")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not -100 <= value <= 100:
            raise ApiError(400, f"'logit_bias' values must be numbers from -100 to 100, got {value!r} for "
                                f"{key}.", "logit_bias", "invalid_value")
        bias[token] = float(value)
    return penalties[0], penalties[1], bias


def token_list(body: dict, name: str, vocab: int) -> list[int] | None:
    """An array of ids of the target's vocabulary (vLLM's ``stop_token_ids``, ``allowed_token_ids``,
    ``/detokenize``'s ``tokens``), or None where it is not given."""
    ids = body_field(body, name, (list,))
    if ids is not None and not all(_is_id(t) and 0 <= t < vocab for t in ids):
        raise ApiError(400, f"'{name}' must be token ids from 0 to {vocab - 1}.", name, "invalid_value")
    return ids


def _stop(body: dict) -> str | list[str]:
    stop = body_field(body, "stop", (str, list), [])
    if isinstance(stop, list) and not all(isinstance(s, str) for s in stop):
        raise ApiError(400, "Invalid type for 'stop': expected a string or an array of strings.", "stop",
                       "invalid_type")
    return stop


def check_model(body, model_ids: tuple[str, ...]) -> None:
    """A JSON object whose ``model``, if any, is one of the ids of the model this server serves (the
    first is the name it answers with)."""
    if not isinstance(body, dict):
        raise ApiError(400, "The request body must be a JSON object.", None, "invalid_type")
    model = body_field(body, "model", (str,))
    body_field(body, "user", (str,))  # changes nothing here, but a client sending another type errs
    if model is not None and model not in model_ids:
        raise ApiError(404, f"The model '{model}' does not exist; this server serves '{model_ids[0]}'.",
                       "model", "model_not_found")


def parse_request(body, chat: bool, model_ids: tuple[str, ...], tokenizer, context: int | None,
                  default_max_tokens: int, max_prompt_tokens: int | None = None, grammars=None,
                  vocab_size: int | None = None, end_ids: set[int] = frozenset()) -> Parsed:
    """Check an OpenAI request body; every problem is an ``ApiError`` naming the field.
    ``max_prompt_tokens``: the server's cap on one request's prompt (None: the context only);
    ``grammars()``: the compiler of ``response_format`` and ``tools`` (``engine.grammar.Grammars``);
    ``vocab_size``: the target's, which ``logit_bias`` keys stay below; ``end_ids``: its
    end-of-sequence tokens, which ``allowed_token_ids`` must not be alone where they are held back."""
    body = Body(body) if isinstance(body, dict) else body
    check_model(body, model_ids)
    n = body_field(body, "n", (int,), 1)
    if not 1 <= n <= MAX_CHOICES:
        raise ApiError(400, f"'n' must be from 1 to {MAX_CHOICES}, got {number(n)}.", "n", "invalid_value")
    check_refused(body, UNSUPPORTED)
    vocab = vocab_size or 2**31
    suffix = None if chat else body_field(body, "suffix", (str,))
    echo = body_field(body, "echo", (bool,), False)
    if echo and suffix:  # the prompt run is the fill-in-the-middle one, not the one sent
        raise ApiError(400, "'echo' cannot be used with 'suffix'; leave one of them out.", "suffix",
                       "unsupported_parameter")
    if chat:
        messages, kwargs = chat_request(body, tokenizer)
        sent = [messages]
    else:
        sent, kwargs = _infills(_prompts(body, vocab), suffix, tokenizer), None
    if len(sent) * n > MAX_CHOICES:
        raise ApiError(400, f"{len(sent)} prompts with n {n} make {len(sent) * n} choices; at most "
                            f"{MAX_CHOICES}.", "n" if n > 1 else "prompt", "invalid_value")
    wanted = wanted_structure(body, chat, tokenizer, grammars)
    shaping = _shaping(body)
    presence, frequency, bias = _penalties(body, vocab)
    # OpenAI's newer name wins where both are sent, as in vLLM
    newer = chat and body.get("max_completion_tokens") is not None
    limit = "max_completion_tokens" if newer else "max_tokens"
    max_tokens = body_field(body, "max_tokens", (int,))
    max_tokens = body_field(body, limit, (int,), max_tokens)
    stop = _stop(body)
    min_tokens = body_field(body, "min_tokens", (int,), 0)
    stop_ids, allowed = (token_list(body, name, vocab) for name in ("stop_token_ids", "allowed_token_ids"))
    include_stop = body_field(body, "include_stop_str_in_output", (bool,), False)
    repetition = body_field(body, "repetition_penalty", (int, float), 1.0)
    ignore_eos = body_field(body, "ignore_eos", (bool,), False)
    seed = _seed(body)
    stream, include_usage = _stream(body)
    speculative = body_field(body, "speculative", (bool,), True)
    logprobs = _logprobs(body, chat)
    if echo and chat:
        raise ApiError(400, "'echo' is a completions field; chat answers do not repeat the messages.", "echo",
                       "unsupported_parameter")
    if echo and stream and logprobs is not None:
        raise ApiError(400, "The prompt's logprobs ('echo' with 'logprobs') are answered only without "
                            "'stream'.", "echo", "unsupported_parameter")
    if max_tokens is not None and max_tokens < (0 if echo else 1):  # echo alone: the prompt (scored)
        only = "" if chat else " (0 only with 'echo')"
        raise ApiError(400, f"'{limit}' must be at least 1{only}, got {max_tokens}.", limit, "invalid_value")

    param = "messages" if chat else "prompt"
    names = [param if len(sent) == 1 else f"{param}[{i}]" for i in range(len(sent))]
    prompts = [encoded_prompt(tokenizer, one, name, wanted.tools, kwargs)
               for one, name in zip(sent, names, strict=True)]
    max_tokens = _max_tokens(prompts, names, max_tokens, context, default_max_tokens, max_prompt_tokens,
                             limit)
    try:
        params = SamplingParams(**shaping, presence_penalty=presence, frequency_penalty=frequency,
                                repetition_penalty=float(repetition), logit_bias=bias,
                                max_new_tokens=max_tokens, min_tokens=min_tokens, ignore_eos=ignore_eos,
                                seed=seed, stop=stop, stop_token_ids=stop_ids or [], logprobs=logprobs,
                                allowed_token_ids=allowed, include_stop_str_in_output=include_stop,
                                prompt_logprobs=logprobs if echo else None, grammar=wanted.grammar,
                                prediction=_prediction(body, tokenizer))
        check_allowed(params, end_ids)
    except ConfigError as exc:
        raise ApiError(400, str(exc), exc.field, "invalid_value") from None
    return Parsed(prompts, params, stream, include_usage, speculative, wanted, n, echo, body.ignored())


def _seed(body: dict) -> int | None:
    seed = body_field(body, "seed", (int,))
    try:
        return checked_seed(seed)
    except ConfigError:
        raise ApiError(400, f"'seed' must be an integer from 0 to 2**64 - 1, or -1 for none, got "
                            f"{number(seed)}.", "seed", "invalid_value") from None


def _stream(body: dict) -> tuple[bool, bool]:
    """``stream``, and ``stream_options.include_usage``."""
    stream = body_field(body, "stream", (bool,), False)
    options = body_field(body, "stream_options", (dict,), {})
    if options and not stream:
        raise ApiError(400, "'stream_options' is allowed only with 'stream': true.", "stream_options",
                       "invalid_value")
    return stream, body_field(options, "include_usage", (bool,), False, "stream_options")


def _max_tokens(prompts: list[Prompt], names: list[str], max_tokens: int | None, context: int | None,
                default_max_tokens: int, max_prompt_tokens: int | None, limit: str = "max_tokens") -> int:
    """``max_tokens`` (sent as ``limit``) checked against the room each prompt leaves in the context;
    when not given, the server's default, cut to the least room."""
    rooms = []
    for prompt, param in zip(prompts, names, strict=True):
        tokens = len(prompt.ids)
        if max_prompt_tokens is not None and tokens > max_prompt_tokens:
            raise ApiError(400, f"The prompt has {tokens} tokens; this server takes at most "
                                f"{max_prompt_tokens} prompt tokens per request. Please shorten it.", param,
                           "prompt_too_long")
        room = context - tokens if context else None
        if room is not None and room < 1:
            raise ApiError(400, f"This model's maximum context length is {context} tokens, but the prompt "
                                f"has {tokens} tokens. Please shorten it.", param, "context_length_exceeded")
        if max_tokens is not None and room is not None and max_tokens > room:
            raise ApiError(400, f"This model's maximum context length is {context} tokens. However, you "
                                f"requested {tokens + max_tokens} tokens ({tokens} in the {param}, "
                                f"{max_tokens} in the completion). Please reduce the length of the prompt or "
                                f"{limit}.", limit, "context_length_exceeded")
        rooms.append(room or default_max_tokens)
    return max_tokens if max_tokens is not None else min(default_max_tokens, *rooms)


def _prediction(body: dict, tokenizer) -> list[int] | None:
    """OpenAI's Predicted Outputs: ``{"type": "content", "content": text or [text parts]}``, the text
    the answer likely repeats (prompt lookup proposes from it; the answer is the same without it), in
    the target's tokens: encoded here, with the prompt, not where the generations run."""
    given = body_field(body, "prediction", (dict,))
    if given is None:
        return None
    if given.get("type") != "content":
        raise ApiError(400, "'prediction.type' must be 'content'.", "prediction.type", "invalid_value")
    content = given.get("content")
    if isinstance(content, list) and all(isinstance(part, dict) and part.get("type") == "text"
                                         and isinstance(part.get("text"), str) for part in content):
        content = "".join(part["text"] for part in content)
    if not isinstance(content, str):
        raise ApiError(400, "'prediction.content' must be a string or an array of text parts "
                            "({\"type\": \"text\", \"text\": ...}).", "prediction.content", "invalid_type")
    if not content:
        return None
    return tokenizer.encode(content, add_special_tokens=False) or None


def _logprobs(body: dict, chat: bool) -> int | None:
    """How many likeliest tokens to report beside each token's logprob; None: no logprobs. Chat:
    ``logprobs`` (a boolean) and ``top_logprobs``; completions: ``logprobs`` (a count)."""
    if chat:
        wanted = body_field(body, "logprobs", (bool,), False)
        top = body_field(body, "top_logprobs", (int,))
        if top is not None and not wanted:
            raise ApiError(400, "'top_logprobs' needs 'logprobs': true.", "top_logprobs", "invalid_value")
        name, count = "top_logprobs", (top or 0) if wanted else None
    else:
        if body.get("top_logprobs") is not None:
            raise ApiError(400, "'top_logprobs' is a chat field; completions take 'logprobs': a count.",
                           "top_logprobs", "unsupported_parameter")
        name = "logprobs"
        count = body_field(body, "logprobs", (int,))
    if count is not None and not 0 <= count <= MAX_LOGPROBS:
        raise ApiError(400, f"'{name}' must be from 0 to {MAX_LOGPROBS}, got {count}.", name, "invalid_value")
    return count
