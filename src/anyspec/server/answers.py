"""The answers in OpenAI's wire format, whole or streamed (``protocol.py`` checks the requests)."""

from __future__ import annotations

import asyncio
import codecs
import json
import re
import time
import uuid

from anyspec.errors import ConfigError
from anyspec.server.fields import ApiError, error_body
from anyspec.server.scheduler import Outcome, ShuttingDown
from anyspec.server.structured import CallStream, read_tool_calls


def usage(outcomes: list[Outcome], n: int = 1) -> dict:
    """A request's usage: each prompt counted once (its ``n`` choices follow each other), every
    choice's completion."""
    firsts = outcomes[::n]
    prompt = sum(o.prompt_tokens for o in firsts)
    completion = sum(o.completion_tokens for o in outcomes)
    out = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
    if all(o.stats is not None for o in firsts):  # prompt tokens whose KV was already held
        out["prompt_tokens_details"] = {"cached_tokens": sum(o.stats.prompt_cached for o in firsts)}
    predicted = [o.stats for o in outcomes if o.stats is not None and o.stats.prediction_tokens]
    if predicted:  # OpenAI's Predicted Outputs: the prediction's tokens the answers hold, and the rest
        taken = sum(s.prediction_matched for s in predicted)
        out["completion_tokens_details"] = {
            "accepted_prediction_tokens": taken,
            "rejected_prediction_tokens": sum(s.prediction_tokens for s in predicted) - taken}
    return out


def choice_stats(outcome: Outcome) -> dict:
    out = {"speculative": outcome.speculative, "timed_out": outcome.timed_out}
    if outcome.stats is not None:
        s = outcome.stats
        out.update(acceptance_rate=s.acceptance_rate, mean_accepted_length=s.mean_accepted_length,
                   drafted=s.drafted, accepted=s.accepted, rounds=s.rounds, draft_fallbacks=s.draft_fallbacks,
                   ngram_proposed=s.ngram_proposed, ngram_accepted=s.ngram_accepted,
                   tokens_per_second=s.tokens_per_second, seconds=s.total_seconds)
        if s.seed is not None:
            out["seed"] = s.seed
    return out


def anyspec_stats(outcomes: list[Outcome]) -> dict:
    """The ``anyspec`` field of an answer: its one choice's statistics, or with ``n`` above 1
    each choice's under ``choices``."""
    if len(outcomes) == 1:
        return choice_stats(outcomes[0])
    return {"speculative": outcomes[0].speculative, "timed_out": any(o.timed_out for o in outcomes),
            "choices": [choice_stats(o) for o in outcomes]}


def as_api_error(exc: Exception) -> ApiError:
    if isinstance(exc, ShuttingDown):
        return ApiError(503, "The server is shutting down; this request was not finished. Retry it later or "
                             "on another server.", None, "server_shutting_down")
    if isinstance(exc, ConfigError):
        return ApiError(400, str(exc), exc.field, "invalid_value")
    return ApiError(500, f"The generation failed: {type(exc).__name__}: {exc}", None, "generation_failed")


def bad(message: str, param: str | None, code: str = "invalid_value") -> ApiError:
    """A 400 naming the field ``param``."""
    return ApiError(400, message, param, code)


def renamed(exc: ApiError, names: list[tuple[str, str]]) -> ApiError:
    """A chat field's error naming the field of another API it came from: each ``(pattern, name)``
    replaced in the message and the parameter."""
    def rename(text: str | None) -> str | None:
        for pattern, name in names:
            text = text and re.sub(rf"\b{pattern}", name, text)
        return text
    return ApiError(exc.status, rename(exc.message), rename(exc.param), exc.code, exc.headers)


def sse(obj: dict) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


# ---- the answers ----------------------------------------------------------------------------------

def response_head(chat: bool, model_name: str) -> dict:
    """The fields every answer and every streamed chunk of one request share."""
    return {"id": f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}",
            "object": "chat.completion.chunk" if chat else "text_completion", "created": int(time.time()),
            "model": model_name}


def _choice(chat: bool, text: str | None, finish: str | None, index: int = 0) -> dict:
    if chat:
        return {"index": index, "delta": {} if text is None else {"content": text}, "logprobs": None,
                "finish_reason": finish}
    return {"index": index, "text": text or "", "logprobs": None, "finish_reason": finish}


async def _choice_chunks(next_event, index: int, head: dict, chat: bool, extra: dict, read_calls: bool,
                         echo: str | None):
    """One choice's chunks from its job's events: ``("chunk", dict)`` items, then ``("done",
    outcome)`` or ``("error", exception)``; ``echo``: the prompt, sent first. With logprobs, a
    chunk carries the entries of the tokens committed since the chunk before, and the last one
    what none carried (a token held back with a stop string's start, or a tool call)."""
    calls = CallStream() if read_calls else None
    pending, sent, at = [], 0, None

    def logged(choice: dict) -> dict:
        nonlocal pending, sent, at
        if pending:
            choice["logprobs"], at = logprobs_json(chat, pending, at)
            sent, pending = sent + len(pending), []
        return choice

    if chat:
        first = _choice(True, None, None, index) | {"delta": {"role": "assistant", "content": ""}}
        yield "chunk", head | {"choices": [first]} | extra
    elif echo:
        yield "chunk", head | {"choices": [_choice(False, echo, None, index)]} | extra
    while True:
        kind, value = await next_event()
        if kind == "logprobs":
            pending += value
        elif kind == "text" and (value := calls.feed(value) if calls else value):
            yield "chunk", head | {"choices": [logged(_choice(chat, value, None, index))]} | extra
        elif kind in ("text", "start"):
            continue
        elif kind == "error":
            yield "error", value
            return
        else:
            finish = value.finish_reason
            if calls is not None:
                content, found = calls.finish()
                for delta in _call_deltas(content, found):
                    choice = _choice(chat, None, None, index) | {"delta": delta}
                    yield "chunk", head | {"choices": [choice]} | extra
                finish = call_finish(found, finish)
            pending = (value.logprobs or [])[sent:]
            last = logged(_choice(chat, None, finish, index)) | {"stop_reason": value.stop_reason}
            yield "chunk", head | {"choices": [last]} | extra | {"anyspec": choice_stats(value)}
            yield "done", value
            return


async def stream_chunks(next_events: list, head: dict, chat: bool, n: int, include_usage: bool,
                        read_calls: bool = False, echoes: list[str] | None = None):
    """The server-sent events of a streamed answer through ``data: [DONE]``: choice i's chunks come
    from ``await next_events[i]()``, each job's ``("start" | "logprobs" | "text" | "error" |
    "done", value)`` events, interleaved as they arrive; each prompt's ``n`` choices follow each
    other.
    ``read_calls``: tool calls held back and sent as ``tool_calls`` at the end of their choice;
    ``echoes``: each choice's prompt, its first chunk (completions' ``echo``)."""
    echoes = echoes or [None] * len(next_events)
    extra = {"usage": None} if include_usage else {}
    merged: asyncio.Queue = asyncio.Queue()

    async def pump(index: int, next_event) -> None:
        try:
            async for kind, value in _choice_chunks(next_event, index, head, chat, extra, read_calls,
                                                    echoes[index]):
                merged.put_nowait((index, kind, value))
        except Exception as exc:  # noqa: BLE001 - the stream ends with it as an error event
            merged.put_nowait((index, "error", exc))

    tasks = [asyncio.create_task(pump(i, e)) for i, e in enumerate(next_events)]
    outcomes = {}
    try:
        while len(outcomes) < len(tasks):
            index, kind, value = await merged.get()
            if kind == "chunk":
                yield sse(value)
            elif kind == "error":
                exc = as_api_error(value)
                yield sse(error_body(exc.status, exc.message, exc.param, exc.code))
                break
            else:
                outcomes[index] = value
        else:
            if include_usage:
                yield sse(head | {"choices": [], "usage": usage([outcomes[i] for i in range(len(tasks))], n)})
    finally:
        for task in tasks:
            task.cancel()
    yield "data: [DONE]\n\n"


def call_finish(calls: list[dict], finish: str) -> str:
    """An answer's ``finish_reason``: ``"tool_calls"`` where it ended after its calls, but
    ``"length"`` where ``max_tokens`` cut it (the calls it finished still go out)."""
    return "tool_calls" if calls and finish == "stop" else finish


def _call_deltas(content: str | None, calls: list[dict]) -> list[dict]:
    out = [{"content": content}] if content else []
    if calls:
        out.append({"tool_calls": [call | {"index": i} for i, call in enumerate(calls)]})
    return out


def _token(spelled: bytes) -> str:
    return spelled.decode("utf-8", errors="replace")


def _spelled(token: bytes) -> str:
    """A completions token as OpenAI's legacy API writes it: its text, or ``bytes:\\xNN...`` where
    its bytes are part of a character (so that such tokens stay apart as ``top_logprobs`` keys)."""
    try:
        return token.decode("utf-8")
    except UnicodeDecodeError:
        return "bytes:" + "".join(chr(b) if 32 <= b < 127 and b != 92 else f"\\x{b:02x}" for b in token)


def logprobs_json(chat: bool, entries: list, at=None) -> tuple[dict, object]:
    """OpenAI's ``logprobs`` of these entries (``(bytes, logprob, [(bytes, logprob), ...])``, the
    logprob None for a prompt's first token): chat's ``content`` list, or completions' four lists,
    each token's text offset the characters the text holds before it (``at``: the UTF-8 decoder of
    the tokens before these and its count; None: none); and the two after them."""
    if chat:
        def entry(b: bytes, lp: float) -> dict:
            return {"token": _token(b), "logprob": lp, "bytes": list(b)}

        return {"content": [entry(b, lp) | {"top_logprobs": [entry(t, x) for t, x in top]}
                            for b, lp, top in entries]}, at
    decoder, chars = at or (codecs.getincrementaldecoder("utf-8")(errors="replace"), 0)
    offsets = []
    for b, _, _ in entries:
        offsets.append(chars)
        chars += len(decoder.decode(b))
    return {"tokens": [_spelled(b) for b, _, _ in entries],
            "token_logprobs": [lp for _, lp, _ in entries],
            "top_logprobs": [None if top is None else _top_with(b, lp, top) for b, lp, top in entries],
            "text_offset": offsets}, (decoder, chars)


def _top_with(spelled: bytes, logprob: float, top: list) -> dict:
    """Completions' likeliest tokens and, as OpenAI's legacy API always adds it, the chosen one
    (``logprobs`` + 1 entries where it is not among them)."""
    out = {_spelled(t): x for t, x in top}
    out.setdefault(_spelled(spelled), logprob)
    return out


def logprobs_field(chat: bool, outcome: Outcome, echo: bool = False) -> dict | None:
    """A whole answer's ``logprobs``; with ``echo``, the prompt's tokens first."""
    if outcome.logprobs is None:
        return None
    return logprobs_json(chat, (outcome.prompt_logprobs if echo and not chat else []) + outcome.logprobs)[0]


def _full_choice(chat: bool, outcome: Outcome, index: int, read_calls: bool, echo: str | None) -> dict:
    logprobs = logprobs_field(chat, outcome, echo is not None)
    content, calls = read_tool_calls(outcome.text) if read_calls else (outcome.text, [])
    if chat:
        message = {"role": "assistant", "content": content} | ({"tool_calls": calls} if calls else {})
        return {"index": index, "message": message, "logprobs": logprobs, "stop_reason": outcome.stop_reason,
                "finish_reason": call_finish(calls, outcome.finish_reason)}
    return {"index": index, "text": (echo or "") + outcome.text, "logprobs": logprobs,
            "finish_reason": outcome.finish_reason, "stop_reason": outcome.stop_reason}


def full_response(head: dict, chat: bool, outcomes: list[Outcome], n: int = 1, read_calls: bool = False,
                  echoes: list[str] | None = None) -> dict:
    """The answer of a request that does not stream, a choice for each outcome; ``read_calls``:
    ``<tool_call>`` blocks read into ``tool_calls``; ``echoes``: each choice's prompt, before its
    text (completions' ``echo``)."""
    echoes = echoes or [None] * len(outcomes)
    choices = [_full_choice(chat, outcome, i, read_calls, echo)
               for i, (outcome, echo) in enumerate(zip(outcomes, echoes, strict=True))]
    return head | {"object": "chat.completion" if chat else "text_completion", "choices": choices,
                   "usage": usage(outcomes, n), "anyspec": anyspec_stats(outcomes)}
