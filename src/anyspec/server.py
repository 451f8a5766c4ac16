"""An OpenAI-compatible HTTP server: ``anyspec serve --target T --draft D``.

``POST /v1/completions`` and ``POST /v1/chat/completions`` (server-sent events with ``stream: true``),
``GET /v1/models``, ``GET /health`` and ``GET /metrics`` (Prometheus text). The official ``openai``
client works against it unchanged.

Scheduling: the engine is batch size 1 and not thread-safe, so one worker thread runs one generation
at a time and requests wait in a bounded FIFO queue (``--queue-size``; a full queue answers 429 with
Retry-After, a request that waited longer than ``--queue-timeout`` answers 503). A client that
disconnects cancels its generation: a waiting request leaves the queue at once, a running one stops
before its next round. ``--generation-timeout`` cuts a generation short (``finish_reason: "length"``,
``anyspec.timed_out: true``). Batching concurrent requests is future work, to be measured first: on a
CPU, whether batched verification pays at all has to be measured before it is built.

Request extensions: ``top_k``, ``speculative: false`` (target only, for comparison). Responses carry
``anyspec: {speculative, acceptance_rate, mean_accepted_length, ...}``. Unknown fields are ignored.
Bad input answers ``{"error": {"message", "type", "param", "code"}}``: 400 for malformed or invalid
fields, an oversized body (``--max-body-bytes``; 400 ``request_too_large`` rather than 413) and a
prompt or ``max_tokens`` beyond the target's context; 404 ``model_not_found`` for an unknown model,
as OpenAI answers. ``max_tokens`` defaults to ``--default-max-tokens``, capped by the context.
"""

import asyncio
import contextlib
import copy
import json
import math
import socket
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from anyspec import defaults
from anyspec.cli import add_engine_options, engine_options, set_threads
from anyspec.engine import Engine, SamplingParams, SpeculativeConfig, render_prompt
from anyspec.errors import ConfigError
from anyspec.scheduler import Job, Metrics, Outcome, QueueFull, Scheduler

ROUTES = ("/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/metrics")
UNSUPPORTED = {"echo": (None, False), "logprobs": (None, False), "top_logprobs": (None, 0),
               "best_of": (None, 1)}
JSON_NAMES = {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "an array",
              dict: "an object", type(None): "null"}


@dataclass
class Settings:
    model_name: str
    queue_size: int = 16
    queue_timeout: float = 60.0
    generation_timeout: float = 300.0
    max_body_bytes: int = 1_000_000
    default_max_tokens: int = 256


class ApiError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.headers = status, message, param, code, headers


class ClientGone(Exception):
    pass


def error_body(status: int, message: str, param: str | None = None, code: str | None = None) -> dict:
    kind = {429: "rate_limit_error", 500: "server_error", 503: "server_error"}
    kind = kind.get(status, "invalid_request_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


@dataclass
class Parsed:
    prompt: str | list[dict]
    params: SamplingParams
    stream: bool
    include_usage: bool
    speculative: bool
    prompt_tokens: int


def _field(body: dict, name: str, kinds: tuple, default=None):
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
        want = " or ".join(JSON_NAMES[k] for k in kinds if not (k is int and float in kinds))
        got = JSON_NAMES.get(type(value), type(value).__name__)
        raise ApiError(400, f"Invalid type for '{name}': expected {want}, but got {got} instead.", name,
                       "invalid_type")
    return value


def _messages(body: dict) -> list[dict]:
    messages = _field(body, "messages", (list,))
    if not messages:
        raise ApiError(400, "'messages' must be a non-empty array of {role, content} objects.", "messages",
                       "empty_array" if messages == [] else "missing_required_parameter")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise ApiError(400, f"messages[{i}] must be an object with a string 'role'.", f"messages[{i}]",
                           "invalid_type")
        content = m.get("content")
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
        out.append({"role": m["role"], "content": content})
    return out


def _prompt(body: dict) -> str:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if prompt is None:
        raise ApiError(400, "Missing required parameter: 'prompt'.", "prompt", "missing_required_parameter")
    if not isinstance(prompt, str):
        raise ApiError(400, "'prompt' must be a string (or an array of one string); token-id prompts and "
                            "several prompts per request are not supported.", "prompt", "invalid_type")
    if not prompt:
        raise ApiError(400, "'prompt' must not be empty.", "prompt", "invalid_value")
    return prompt


def parse_request(body, chat: bool, model_name: str, tokenizer, context: int | None,
                  default_max_tokens: int) -> Parsed:
    """Check an OpenAI request body; every problem is an ``ApiError`` naming the field."""
    if not isinstance(body, dict):
        raise ApiError(400, "The request body must be a JSON object.", None, "invalid_type")
    model = _field(body, "model", (str,))
    if model is not None and model != model_name:
        raise ApiError(404, f"The model '{model}' does not exist; this server serves '{model_name}'.",
                       "model", "model_not_found")
    if _field(body, "n", (int,), 1) != 1:
        raise ApiError(400, "Only n=1 is supported: the engine generates one sequence per request.", "n",
                       "invalid_value")
    for name, harmless in UNSUPPORTED.items():
        if body.get(name) not in harmless:
            raise ApiError(400, f"'{name}' is not supported by this server; leave it out.", name,
                           "unsupported_parameter")
    prompt = _messages(body) if chat else _prompt(body)
    temperature = _field(body, "temperature", (int, float), 1.0)
    if not 0 <= temperature <= 2:
        raise ApiError(400, f"'temperature' must be between 0 and 2, got {temperature}.", "temperature",
                       "invalid_value")
    top_p = _field(body, "top_p", (int, float), 1.0)
    top_k = _field(body, "top_k", (int,), 0)
    if top_k < -1:
        raise ApiError(400, f"'top_k' must be >= 0 (0 or -1 = off), got {top_k}.", "top_k", "invalid_value")
    max_tokens = _field(body, "max_completion_tokens", (int,)) if chat else None
    max_tokens = _field(body, "max_tokens", (int,), max_tokens)
    stop = _field(body, "stop", (str, list), [])
    if isinstance(stop, list) and not all(isinstance(s, str) for s in stop):
        raise ApiError(400, "Invalid type for 'stop': expected a string or an array of strings.", "stop",
                       "invalid_type")
    seed = _field(body, "seed", (int,))
    if seed is not None and not -(2**63) <= seed < 2**64:
        raise ApiError(400, "'seed' must fit in 64 bits.", "seed", "invalid_value")
    stream = _field(body, "stream", (bool,), False)
    include_usage = _field(_field(body, "stream_options", (dict,), {}), "include_usage", (bool,), False)
    speculative = _field(body, "speculative", (bool,), True)
    if max_tokens is not None and max_tokens < 1:
        raise ApiError(400, f"'max_tokens' must be at least 1, got {max_tokens}.", "max_tokens",
                       "invalid_value")

    param = "messages" if chat else "prompt"
    try:
        text, is_chat = render_prompt(tokenizer, prompt)
    except Exception as exc:  # ConfigError, or the chat template refusing these messages
        raise ApiError(400, f"{type(exc).__name__}: {exc}" if not isinstance(exc, ConfigError) else str(exc),
                       param, "invalid_value") from None
    prompt_tokens = len(tokenizer.encode(text, add_special_tokens=not is_chat))
    room = context - prompt_tokens if context else None
    if room is not None and room < 1:
        raise ApiError(400, f"This model's maximum context length is {context} tokens, but the {param} has "
                            f"{prompt_tokens} tokens. Please shorten it.", param, "context_length_exceeded")
    if max_tokens is None:
        max_tokens = min(default_max_tokens, room or default_max_tokens)
    elif room is not None and max_tokens > room:
        raise ApiError(400, f"This model's maximum context length is {context} tokens. However, you "
                            f"requested {prompt_tokens + max_tokens} tokens ({prompt_tokens} in the {param}, "
                            f"{max_tokens} in the completion). Please reduce the length of the prompt or "
                            "max_tokens.",
                       "max_tokens", "context_length_exceeded")
    try:
        params = SamplingParams(temperature=float(temperature), top_p=float(top_p), top_k=max(top_k, 0),
                                max_new_tokens=max_tokens, seed=seed, stop=stop)
    except ConfigError as exc:
        param = next((f for f in ("top_p", "top_k", "stop") if str(exc).startswith(f)), None)
        raise ApiError(400, str(exc), param, "invalid_value") from None
    return Parsed(prompt, params, stream, include_usage, speculative, prompt_tokens)


async def read_json(request, limit: int):
    too_large = ApiError(400, f"The request body is larger than this server's limit of {limit} bytes.", None,
                         "request_too_large")
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise too_large
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise too_large
    try:
        return json.loads(body)
    except ValueError:
        raise ApiError(400, "We could not parse the JSON body of your request: it is not valid JSON.", None,
                       "invalid_json") from None


async def next_event(job: Job, request, deadline: float | None = None):
    """The job's next event; raises ClientGone on a disconnect (checked every 0.25 s), TimeoutError
    past ``deadline``."""
    while True:
        if time.monotonic() - job.polled > 0.25:
            job.polled = time.monotonic()
            if await request.is_disconnected():
                raise ClientGone
        try:
            return await asyncio.wait_for(job.events.get(), 0.25)
        except TimeoutError:
            if deadline is not None and time.monotonic() > deadline:
                raise


def usage(outcome: Outcome) -> dict:
    out = {"prompt_tokens": outcome.prompt_tokens, "completion_tokens": outcome.completion_tokens,
           "total_tokens": outcome.prompt_tokens + outcome.completion_tokens}
    if outcome.stats is not None:  # prompt tokens whose KV the previous request left (--no-prefix-cache: 0)
        out["prompt_tokens_details"] = {"cached_tokens": outcome.stats.prompt_cached}
    return out


def anyspec_stats(outcome: Outcome) -> dict:
    out = {"speculative": outcome.speculative, "timed_out": outcome.timed_out}
    if outcome.stats is not None:
        s = outcome.stats
        out.update(acceptance_rate=s.acceptance_rate, mean_accepted_length=s.mean_accepted_length,
                   drafted=s.drafted, accepted=s.accepted, rounds=s.rounds, draft_fallbacks=s.draft_fallbacks,
                   tokens_per_second=s.tokens_per_second, seconds=s.total_seconds)
    return out


def as_api_error(exc: Exception) -> ApiError:
    if isinstance(exc, ConfigError):
        return ApiError(400, str(exc), None, "invalid_value")
    return ApiError(500, f"The generation failed: {type(exc).__name__}: {exc}", None, "generation_failed")


def count_requests(app, metrics: Metrics):
    """ASGI middleware: count every answered HTTP request by route and status for /metrics."""
    async def wrapped(scope, receive, send):
        if scope["type"] != "http":
            return await app(scope, receive, send)
        path = scope["path"] if scope["path"] in ROUTES else "other"

        async def counting_send(message):
            if message["type"] == "http.response.start":
                metrics.add_request(path, message["status"])
            await send(message)

        await app(scope, receive, counting_send)
    return wrapped


def create_app(engine: Engine, settings: Settings):
    """The FastAPI app over ``engine``; the worker thread starts and stops with the app's lifespan."""
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
    from starlette.exceptions import HTTPException

    metrics = Metrics()
    target_only = Engine(engine.target, None, engine.config) if engine.proposer is not None else None
    scheduler = Scheduler(engine, target_only, settings.queue_size, settings.generation_timeout, metrics)
    tokenizer = copy.deepcopy(engine.target.tokenizer)  # the worker uses the original
    context = getattr(engine.target.model.config.get_text_config(), "max_position_embeddings", None)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        scheduler.start()
        yield
        scheduler.stop()

    app = FastAPI(title="anyspec", lifespan=lifespan)
    app.state.scheduler, app.state.metrics = scheduler, metrics
    app.add_middleware(count_requests, metrics=metrics)

    def error(exc: ApiError) -> JSONResponse:
        return JSONResponse(error_body(exc.status, exc.message, exc.param, exc.code), exc.status, exc.headers)

    async def on_api_error(request, exc: ApiError):
        return error(exc)

    async def on_http_error(request, exc: HTTPException):
        return error(ApiError(exc.status_code, str(exc.detail)))

    async def on_crash(request, exc: Exception):
        return error(as_api_error(exc))

    app.add_exception_handler(ApiError, on_api_error)
    app.add_exception_handler(HTTPException, on_http_error)
    app.add_exception_handler(Exception, on_crash)

    async def generate(request: Request, chat: bool):
        parsed = parse_request(await read_json(request, settings.max_body_bytes), chat, settings.model_name,
                               tokenizer, context, settings.default_max_tokens)
        job = Job(parsed.prompt, parsed.params, parsed.speculative, parsed.prompt_tokens,
                  asyncio.get_running_loop())
        retry = str(min(60, math.ceil(metrics.mean_generation_seconds() * (scheduler.depth + 1))))
        try:
            scheduler.submit(job)
        except QueueFull:
            raise ApiError(429, f"The server is busy: {settings.queue_size} requests are already waiting. "
                                "Retry later.", None, "queue_full", {"Retry-After": retry}) from None
        try:
            kind, value = await next_event(job, request, time.monotonic() + settings.queue_timeout)
            if kind == "error":
                raise as_api_error(value)
        except TimeoutError:
            scheduler.cancel(job)
            raise ApiError(503, f"The request waited longer than {settings.queue_timeout:g} s in the queue.",
                           None, "queue_timeout", {"Retry-After": retry}) from None
        except ClientGone:
            scheduler.cancel(job)
            return Response(status_code=499)
        rid, created = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}", int(time.time())
        head = {"id": rid, "object": "chat.completion.chunk" if chat else "text_completion",
                "created": created, "model": settings.model_name}

        def choice(text: str | None, finish: str | None) -> dict:
            if chat:
                return {"index": 0, "delta": {} if text is None else {"content": text}, "logprobs": None,
                        "finish_reason": finish}
            return {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}

        if parsed.stream:
            async def events():
                extra = {"usage": None} if parsed.include_usage else {}
                try:
                    if chat:
                        first = choice(None, None) | {"delta": {"role": "assistant", "content": ""}}
                        yield sse(head | {"choices": [first]} | extra)
                    while True:
                        kind, value = await job.events.get()
                        if kind == "text":
                            yield sse(head | {"choices": [choice(value, None)]} | extra)
                        elif kind == "error":
                            exc = as_api_error(value)
                            yield sse(error_body(exc.status, exc.message, exc.param, exc.code))
                            break
                        else:
                            yield sse(head | {"choices": [choice(None, value.finish_reason)]} | extra
                                      | {"anyspec": anyspec_stats(value)})
                            if parsed.include_usage:
                                yield sse(head | {"choices": [], "usage": usage(value)})
                            break
                    yield "data: [DONE]\n\n"
                finally:
                    scheduler.cancel(job)

            return StreamingResponse(events(), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})

        try:
            while (event := await next_event(job, request))[0] == "text":
                pass
        except ClientGone:
            scheduler.cancel(job)
            return Response(status_code=499)
        kind, outcome = event
        if kind == "error":
            raise as_api_error(outcome)
        if chat:
            result = {"index": 0, "message": {"role": "assistant", "content": outcome.text}, "logprobs": None,
                      "finish_reason": outcome.finish_reason}
        else:
            result = {"index": 0, "text": outcome.text, "logprobs": None,
                      "finish_reason": outcome.finish_reason}
        return head | {"object": "chat.completion" if chat else "text_completion", "choices": [result],
                       "usage": usage(outcome), "anyspec": anyspec_stats(outcome)}

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await generate(request, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await generate(request, chat=True)

    @app.get("/v1/models")
    async def models():
        draft = engine.proposer.model.name if engine.proposer is not None else None
        return {"object": "list", "data": [{"id": settings.model_name, "object": "model", "created": 0,
                                            "owned_by": "anyspec", "anyspec": {"draft": draft}}]}

    @app.get("/v1/models/{model}")
    async def model(model: str):
        listed = (await models())["data"][0]
        if model != listed["id"]:
            raise ApiError(404, f"The model '{model}' does not exist; this server serves '{listed['id']}'.",
                           "model", "model_not_found")
        return listed

    @app.get("/health")
    async def health():
        return {"status": "ok", "queue_depth": scheduler.depth, "running": scheduler.running is not None}

    @app.get("/metrics")
    async def prometheus():
        return PlainTextResponse(metrics.render(scheduler.depth, scheduler.running is not None),
                                 media_type="text/plain; version=0.0.4")

    return app


def sse(obj: dict) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


def add_parser(sub) -> None:
    from anyspec.models import DEFAULT_DRAFT, DEFAULT_TARGET

    p = sub.add_parser("serve", help="OpenAI-compatible HTTP server (completions and chat, streaming)")
    p.add_argument("--target", default=DEFAULT_TARGET, help="built-in name, model folder or GGUF file")
    p.add_argument("--draft", default=DEFAULT_DRAFT)
    p.add_argument("--no-draft", action="store_true", help="serve the target alone")
    p.add_argument("-k", "--k", type=int, default=defaults.NUM_SPECULATIVE_TOKENS,
                   help="draft tokens per round, at most")
    add_engine_options(p)
    p.add_argument("--draft-sample-method", default="sample", choices=("greedy", "sample"))
    p.add_argument("--draft-context", default="retokenize", choices=("retokenize", "token-map"))
    p.add_argument("--no-prefix-cache", action="store_true",
                   help="prefill every prompt in full (default: a request starts from the KV cache of "
                        "the prefix it shares with the one before, on row-invariant models)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--served-model-name", default=None,
                   help="the model id clients send (default: the target)")
    p.add_argument("--queue-size", type=int, default=16, help="requests that may wait; more answer 429")
    p.add_argument("--queue-timeout", type=float, default=60.0, help="seconds a request may wait; then 503")
    p.add_argument("--generation-timeout", type=float, default=300.0, help="seconds a generation may run")
    p.add_argument("--max-body-bytes", type=int, default=1_000_000)
    p.add_argument("--default-max-tokens", type=int, default=256, help="when a request sets no max_tokens")
    p.set_defaults(func=run)


def check_args(args) -> tuple[Settings, SpeculativeConfig]:
    """Everything that can be wrong with the command line, found before any model loads."""
    from anyspec.backends.transformers import check_model_path, resolve_dtype
    from anyspec.models import MODELS

    config = SpeculativeConfig(num_speculative_tokens=args.k, draft_sample_method=args.draft_sample_method,
                               draft_context=args.draft_context, algorithm=args.algorithm,
                               prefix_cache=not args.no_prefix_cache, **engine_options(args))
    resolve_dtype(args.dtype)
    resolve_dtype(args.draft_dtype, draft=True)
    for spec in [args.target] + ([] if args.no_draft else [args.draft]):
        check_model_path(spec)
    for name in ("queue_size", "max_body_bytes", "default_max_tokens", "port"):
        if getattr(args, name) < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    for name in ("queue_timeout", "generation_timeout"):
        if not getattr(args, name) > 0:
            raise ConfigError(f"--{name.replace('_', '-')} must be > 0 seconds, got {getattr(args, name)}")
    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        raise ConfigError("the server needs fastapi and uvicorn: pip install 'anyspec[server]'") from None
    with socket.socket() as probe:
        try:
            probe.bind((args.host, args.port))
        except OSError as exc:
            raise ConfigError(f"cannot listen on {args.host}:{args.port}: {exc.strerror}") from None
    name = args.served_model_name or (args.target if args.target in MODELS else Path(args.target).name)
    settings = Settings(name, args.queue_size, args.queue_timeout, args.generation_timeout,
                        args.max_body_bytes, args.default_max_tokens)
    return settings, config


def run(args) -> int:
    import uvicorn

    from anyspec.backends.transformers import load_model, resolve_dtype

    settings, config = check_args(args)
    set_threads(args)
    target = load_model(args.target, dtype=args.dtype, name=args.target)
    draft_dtype = resolve_dtype(args.draft_dtype, draft=True)
    draft = None if args.no_draft else load_model(args.draft, dtype=draft_dtype, name=args.draft)
    app = create_app(Engine(target, draft, config), settings)
    print(f"anyspec serve: '{settings.model_name}' on http://{args.host}:{args.port}/v1", file=sys.stderr)
    uvicorn.run(app, host=args.host, port=args.port, log_level="info", timeout_graceful_shutdown=5)
    return 0
