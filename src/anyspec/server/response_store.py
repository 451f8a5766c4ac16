"""The responses a server keeps for OpenAI's Responses API (``responses.py``): up to ``most`` in
memory, the most recent (``store``, true unless the request says false), each with its input and
output items, so that a request with ``previous_response_id`` continues that conversation (its
``instructions`` are not carried over, as OpenAI has it), and ``GET``/``DELETE /v1/responses/{id}``
and its ``input_items`` read or drop one.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict

from anyspec.server.answers import as_api_error, bad
from anyspec.server.fields import ApiError, body_field
from anyspec.server.responses import RENAMED, chat_body, events, head, own_items, whole
from anyspec.server.scheduler import Outcome

ITEM_IDS = {"message": "msg", "function_call": "fc", "function_call_output": "fco"}  # id prefixes


class Api:
    """The Responses API of one server, with the responses it keeps (up to ``most``, the most
    recent): each as the response object, the items of its own input and the conversation so far
    (the input items of the chain and their outputs). Used on the event loop only."""

    RENAMED = RENAMED

    def __init__(self, most: int):
        self.most = most
        self.kept: OrderedDict[str, tuple[dict, list, list]] = OrderedDict()
        self.read: OrderedDict[int, list] = OrderedDict()  # id(body) -> the conversation it continues
        self.pending: OrderedDict[str, tuple[list, list]] = OrderedDict()  # id -> (own, conversation)

    def find(self, response_id) -> tuple[dict, list, list]:
        if not isinstance(response_id, str) or response_id not in self.kept:
            raise ApiError(404, f"No response with id {response_id!r} is stored on this server.",
                           "response_id", "not_found")
        return self.kept[response_id]

    def earlier(self, body) -> list:
        """The conversation a request continues (``previous_response_id``), else nothing."""
        given = body_field(body, "previous_response_id", (str,)) if isinstance(body, dict) else None
        if given is None:
            return []
        if not self.most:
            raise bad("'previous_response_id': this server keeps no responses (--responses-store 0); send "
                      "the whole conversation in 'input'.", "previous_response_id", "unsupported_parameter")
        if given not in self.kept:
            raise ApiError(404, f"Previous response with id {given!r} not found.", "previous_response_id",
                           "previous_response_not_found")
        response, _, conversation = self.kept[given]
        if conversation is None:
            raise bad(f"'previous_response_id': response {given!r} is {response['status']}, not finished.",
                      "previous_response_id")
        return conversation

    def chat_body(self, body) -> dict:
        """``chat_body`` after the conversation the request continues, which ``head`` then reads
        (a response kept now may be dropped for newer ones before then)."""
        earlier = self.earlier(body)
        sent = chat_body(body, earlier)
        self.read[id(body)] = earlier
        trim(self.read, self.most + 64)
        return sent

    def head(self, body: dict, model_name: str, prompt_tokens: int, cached: int) -> dict:
        """The response before any output (its usage, ``cached`` among it, comes at the end)."""
        store = self.most > 0 and body.get("store") is not False
        base = head(body, model_name, prompt_tokens, store)
        earlier = self.read.pop(id(body), [])
        if store:
            own = own_items(body)
            self.pending[base["id"]] = (own, earlier + own)
            trim(self.pending, self.most + 64)  # requests that failed leave theirs behind
            if body.get("stream") is True:  # its id is out before it ends: readable as in_progress
                self.kept[base["id"]] = (base, own, None)
                trim(self.kept, self.most)
        return base

    def keep(self, final: dict) -> None:
        """A finished response kept, where its request asked for it."""
        own, conversation = self.pending.pop(final["id"], (None, None))
        if own is None:
            return
        outputs = [{k: v for k, v in item.items() if k not in ("id", "status")} for item in final["output"]]
        self.kept[final["id"]] = (final, own, conversation + outputs)
        trim(self.kept, self.most)

    def whole(self, base: dict, outcome: Outcome, read_calls: bool) -> dict:
        final = whole(base, outcome, read_calls)
        self.keep(final)
        return final

    async def events(self, next_event, base: dict, read_calls: bool):
        """``events``, the final response kept; while it runs, a ``GET`` reads the output sent so
        far; one that ends otherwise is kept as ``failed`` (with its ``error``) or ``cancelled`` (the
        client left), with the output it had sent (an item cut short ``incomplete``) and no usage."""
        finished, ended, output, error = [], "failed", [], None
        if base["id"] in self.kept:
            self.kept[base["id"]] = (base | {"output": output}, *self.kept[base["id"]][1:])

        def keep(final: dict) -> None:  # before the last event goes out, so a reply can continue it
            finished.append(final)
            self.keep(final)

        async def watched():
            nonlocal error
            kind, value = await next_event()
            if kind == "error":
                failure = as_api_error(value)
                error = {"code": failure.code, "message": failure.message}
            return kind, value

        try:
            async for event in events(watched, base, read_calls, keep, output):
                yield event
        except (GeneratorExit, asyncio.CancelledError):
            ended = "cancelled"
            raise
        finally:
            if not finished and base["id"] in self.kept:
                sent = [item | {"status": "incomplete"} if item["status"] == "in_progress" else item
                        for item in output]
                self.kept[base["id"]] = (base | {"status": ended, "output": sent, "error": error},
                                         *self.kept[base["id"]][1:])

    def delete(self, response_id) -> dict:
        self.find(response_id)
        del self.kept[response_id]
        self.pending.pop(response_id, None)  # one deleted while it runs stays deleted
        return {"id": response_id, "object": "response", "deleted": True}

    def input_items(self, response_id, limit: str = "20", order: str = "desc",
                    after: str | None = None) -> dict:
        """A page of a kept response's own input items, as OpenAI lists them (newest first by default)."""
        _, own, _ = self.find(response_id)
        if order not in ("asc", "desc"):
            raise bad(f"'order' must be asc or desc, got {order!r}.", "order")
        if not (limit.isdigit() and 1 <= int(limit) <= 100):
            raise bad(f"'limit' must be from 1 to 100, got {limit!r}.", "limit")
        limit = int(limit)
        items = [listed(item, f"{response_id[5:]}_{i}") for i, item in enumerate(own)]
        items = items if order == "asc" else items[::-1]
        ids = [item["id"] for item in items]
        if after is not None and after not in ids:
            raise bad(f"'after' must be the id of one of the response's input items, got {after!r}.", "after")
        start = ids.index(after) + 1 if after is not None else 0
        page = items[start:start + limit]
        return {"object": "list", "data": page, "first_id": page[0]["id"] if page else None,
                "last_id": page[-1]["id"] if page else None, "has_more": start + limit < len(items)}


def trim(kept: OrderedDict, most: int) -> None:
    while len(kept) > most:
        kept.popitem(last=False)


def listed(item: dict, number: str) -> dict:
    """An input item as ``input_items`` lists it: with its type, an id (``number`` after its
    type's prefix) unless it has one, and a message's text as a text part."""
    kind = item.get("type", "message")
    out = {"id": f"{ITEM_IDS.get(kind, 'item')}_{number}", "type": kind} | item
    if kind == "message" and isinstance(item.get("content"), str):
        part = "output_text" if item.get("role") == "assistant" else "input_text"
        out["content"] = [{"type": part, "text": item["content"]}]
    return out
