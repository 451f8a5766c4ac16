"""A request body read within its limits, and the routes beside
generation: ``GET /v1/models``, ``/health``, ``/metrics``, and ``POST /tokenize`` and
``/detokenize`` (``tokens.py``)."""

import asyncio
import functools
import json
import sys
import time

from anyspec.engine import Engine
from anyspec.server.fields import ApiError, ClientGone, check_unicode
from anyspec.server.metrics import Metrics
from anyspec.server.scheduler import Scheduler
from anyspec.server.settings import Settings
from anyspec.server.tokens import parse_detokenize, parse_tokenize


async def read_json(request, limit: int, timeout: float | None = None):
    """The request's JSON body: at most ``limit`` bytes, in full within ``timeout`` seconds (408)."""
    too_large = ApiError(400, f"The request body is larger than this server's limit of {limit} bytes.", None,
                         "request_too_large")
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise too_large
    from starlette.requests import ClientDisconnect

    body = bytearray()
    try:
        async with asyncio.timeout(timeout):
            async for chunk in request.stream():
                body += chunk
                if len(body) > limit:
                    raise too_large
    except ClientDisconnect:
        raise ClientGone from None
    except TimeoutError:
        raise ApiError(408, f"The request body did not arrive in full within {timeout:g} s.", None,
                       "request_timeout") from None
    try:
        value = json.loads(body)
    except RecursionError:
        raise ApiError(400, "The JSON body of your request is nested too deeply.", None,
                       "invalid_json") from None
    except ValueError as exc:
        if "integer string conversion" in str(exc):
            raise ApiError(400, f"A number in the JSON body of your request has more than "
                                f"{sys.get_int_max_str_digits()} digits.", None, "invalid_json") from None
        raise ApiError(400, "We could not parse the JSON body of your request: it is not valid JSON.", None,
                       "invalid_json") from None
    check_unicode(body, value)
    return value


OPEN = ("/health", "/metrics")  # answered without the API key, for probes and scrapers


def require_key(app, key: str, form):
    """ASGI middleware: a request without ``Authorization: Bearer <key>`` (or Anthropic's
    ``x-api-key: <key>``) answers 401 (``invalid_api_key``), its body ``form(path, error)`` as
    the app's other errors, except on ``OPEN`` routes and CORS preflights."""
    import hmac

    from fastapi.responses import JSONResponse

    wanted = f"Bearer {key}".encode()

    async def wrapped(scope, receive, send):
        if scope["type"] != "http" or scope["path"] in OPEN or scope["method"] == "OPTIONS":
            return await app(scope, receive, send)
        headers = dict(scope["headers"])
        anthropic = headers.get(b"x-api-key")  # what Anthropic's clients send
        given = headers.get(b"authorization") or (b"Bearer " + anthropic if anthropic is not None else b"")
        if hmac.compare_digest(given, wanted):
            return await app(scope, receive, send)
        said = "no API key was given" if not given else "the API key given is not this server's"
        how = "'x-api-key: <key>'" if anthropic is not None else "'Authorization: Bearer <key>'"
        refused = ApiError(401, f"Incorrect API key: {said}. Send {how}.", None, "invalid_api_key")
        answer = JSONResponse(form(scope["path"], refused), 401, {"WWW-Authenticate": "Bearer"})
        await answer(scope, receive, send)
    return wrapped


def add_info_routes(app, engine: Engine, settings: Settings, scheduler: Scheduler, metrics: Metrics) -> None:
    """``GET /v1/models``, ``/v1/models/{model}``, ``/health`` and ``/metrics``."""
    from fastapi.responses import Response
    from prometheus_client import CONTENT_TYPE_LATEST

    loaded = int(time.time())  # the model's "created": when this server put it up, as vLLM has it

    @app.get("/v1/models")
    async def models():
        draft = engine.draft.name if engine.draft is not None else None
        card = {"id": settings.model_name, "object": "model", "created": loaded, "owned_by": "anyspec",
                "max_model_len": engine.target.context_length, "anyspec": {"draft": draft}}
        return {"object": "list", "data": [card]}

    @app.get("/v1/models/{model}")
    async def model(model: str):
        listed = (await models())["data"][0]
        if model not in settings.model_ids:
            raise ApiError(404, f"The model '{model}' does not exist; this server serves '{listed['id']}'.",
                           "model", "model_not_found")
        return listed

    @app.api_route("/health", methods=["GET", "HEAD"])  # HEAD: what probes may send
    async def health():
        return {"status": "ok", "queue_depth": scheduler.depth, "running": len(scheduler.running)}

    @app.api_route("/metrics", methods=["GET", "HEAD"])  # HEAD: what probes may send
    async def prometheus():
        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)


def add_token_routes(app, engine: Engine, settings: Settings, tokenizer, grammars, run) -> None:
    """``POST /tokenize`` and ``/detokenize`` (``tokens.py``); ``grammars()``: the compiler that
    checks a chat's tools; ``run(fn)``: ``fn`` off the event loop."""
    from fastapi import Request
    from fastapi.responses import Response

    def answering(path: str, answer):
        """The route at ``path``: ``answer(body)`` of the request's JSON body (499 if the client left)."""
        async def route(request: Request):
            try:
                body = await read_json(request, settings.max_body_bytes, settings.body_timeout)
            except ClientGone:
                return Response(status_code=499)
            return await answer(body)
        app.post(path)(route)

    async def tokenize(body):
        asked = functools.partial(parse_tokenize, body, settings.model_ids, tokenizer, grammars)
        ids, strs = await run(asked)
        out = {"count": len(ids), "max_model_len": engine.target.context_length, "tokens": ids}
        return out | ({"token_strs": tokenizer.convert_ids_to_tokens(ids)} if strs else {})

    async def detokenize(body):
        ids = parse_detokenize(body, settings.model_ids, engine.target.vocab_size)
        return {"prompt": await run(functools.partial(tokenizer.decode, ids))}

    answering("/tokenize", tokenize)
    answering("/detokenize", detokenize)
