"""The OpenAI-compatible HTTP app over one engine (``anyspec serve``; ``protocol.py`` checks the requests).

``POST /v1/completions``, ``POST /v1/chat/completions``, ``POST /v1/responses`` (OpenAI's Responses,
``responses.py``; ``GET``/``DELETE /v1/responses/{id}`` and its ``input_items``, ``response_store.py``) and
``POST /v1/messages`` (Anthropic's Messages, ``messages.py``), server-sent events with
``stream: true``; ``GET /v1/models``, ``GET /health``, ``GET /metrics`` (Prometheus text),
``POST /tokenize`` and ``/detokenize`` (``routes.py``). The official ``openai`` client works
against it unchanged.

Scheduling: one worker thread runs up to ``--max-batch`` generations together (``scheduler.py``):
their draft forwards go through the draft in one pass, then their verifications through the target
in one pass, and requests join and leave between passes. Each answer is the same as the request
alone (the kernels compute every row by itself). More requests wait in a bounded FIFO queue
(``--queue-size``; a full queue answers 429 with Retry-After, a request that waited longer than
``--queue-timeout`` answers 503). A client that disconnects cancels its generation: a waiting
request leaves the queue at once, a running one before the worker's next pass.
``--generation-timeout`` cuts a generation short, counted from the end of its prompt's prefill
(``finish_reason: "length"``, ``anyspec.timed_out: true``). Models that hold one KV cache
(transformers models) run one request at a time.

A completion's ``suffix`` makes its prompt the target's fill-in-the-middle prompt
(``prompt.fill_in_the_middle``). Each prompt of a completion (a string or token ids; an array of
them) gets ``n`` choices, each a job, all queued together; choice i of a prompt is sampled with
``seed + i`` (``Parsed.choice_params``). A streamed answer interleaves the choices' chunks by
``index``. ``echo`` (completions) puts the prompt, and with ``logprobs`` its tokens' logprobs,
before each choice's answer.
Request extensions: ``top_k``, ``min_p``, ``typical_p``, ``top_n_sigma``, ``speculative: false``
(target only, for comparison).
``presence_penalty``, ``frequency_penalty`` and ``logit_bias`` are OpenAI's (``engine/penalties.py``).
Responses carry ``anyspec: {speculative, acceptance_rate, mean_accepted_length, ...}``. Fields the
server cannot honour (``functions``, ``best_of``, ...) answer 400, as do other servers' sampling
fields (``repeat_penalty``, ``mirostat``, ``dry_multiplier``, ...) unless their value changes
nothing; other fields it does not read are ignored, each request's named in a warning in the
server's log.
``response_format`` (``json_object``, ``json_schema``) and ``tools``/``tool_choice`` constrain the
answer by a grammar compiled against the target's tokenizer (``structured.py``, ``engine/grammar.py``).
Chat roles are ``system``, ``user``, ``assistant`` and ``tool``; message contents are read as plain
text, so a control token written in them (``<|im_end|>``, ``<tool_call>``) is text, not a turn
boundary or a call.
``--api-key`` makes every route but ``/health`` and ``/metrics`` answer 401 ``invalid_api_key``
without ``Authorization: Bearer <key>``; ``--allowed-origins`` answers those browser origins' CORS
requests (none by default).
Bad input answers ``{"error": {"message", "type", "param", "code"}}``: 400 for malformed or invalid
fields, an oversized body (``--max-body-bytes``; 400 ``request_too_large`` rather than 413) and a
prompt or ``max_tokens`` beyond the target's context; 404 ``model_not_found`` for an unknown model,
as OpenAI answers; 408 ``request_timeout`` for a body not in within ``--body-timeout``.
``max_tokens`` defaults to ``--default-max-tokens``, capped by the context; ``--max-prompt-tokens``
caps a request's prompt (400 ``prompt_too_long``). A long prompt is prefilled in passes of at most
256 tokens, so a disconnect or shutdown stops it between passes.
"""

import asyncio
import contextlib
import copy
import functools
import logging
import math
import time
from concurrent.futures import ThreadPoolExecutor

from anyspec.engine import Engine
from anyspec.engine.grammar import Grammars
from anyspec.server import messages, response_store
from anyspec.server.answers import as_api_error, full_response, renamed, response_head, stream_chunks
from anyspec.server.fields import ApiError, ClientGone, error_body
from anyspec.server.metrics import Metrics, count_requests
from anyspec.server.protocol import Parsed, parse_request
from anyspec.server.routes import add_info_routes, add_token_routes, read_json, require_key
from anyspec.server.scheduler import Job, Outcome, QueueFull, Scheduler, ShuttingDown
from anyspec.server.settings import Settings

log = logging.getLogger("anyspec.server")

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


async def admit(jobs: list[Job], request, scheduler: Scheduler, settings: Settings,
                metrics: Metrics) -> int | None:
    """Queue a request's jobs and wait until the worker starts the first: how many of its prompt
    tokens the prefix cache held; 429 when the queue has no room for them all, 503 past
    ``queue_timeout``; None when the client went away first. The others follow it in the queue and
    start as slots free."""
    retry = str(min(60, math.ceil(metrics.mean_generation_seconds() * (scheduler.depth + 1))))
    try:
        scheduler.submit(*jobs)
    except ShuttingDown as exc:
        raise as_api_error(exc) from None
    except QueueFull:
        raise ApiError(429, f"The server is busy: {settings.queue_size - scheduler.depth} of its "
                            f"{settings.queue_size} queue places are free, this request needs {len(jobs)}. "
                            "Retry later.", None, "queue_full", {"Retry-After": retry}) from None
    try:
        kind, value = await next_event(jobs[0], request, time.monotonic() + settings.queue_timeout)
    except TimeoutError:
        cancel(scheduler, jobs, "queue_timeout")
        raise ApiError(503, f"The request waited longer than {settings.queue_timeout:g} s in the queue.",
                       None, "queue_timeout", {"Retry-After": retry}) from None
    except ClientGone:
        cancel(scheduler, jobs)
        return None
    if kind == "error":
        cancel(scheduler, jobs)
        raise as_api_error(value)
    return value


def choice_jobs(parsed: Parsed, queue_size: int) -> list[Job]:
    """A job for each choice of each prompt, in the answer's order; 400 when the queue could never
    hold them all."""
    n, prompts = parsed.n, parsed.prompts
    if len(prompts) * n > queue_size:
        said = f"{len(prompts)} prompt{'s' * (len(prompts) > 1)}"
        raise ApiError(400, f"{len(prompts) * n} choices ({said}, n {n}); at most "
                            f"{queue_size} on this server (--queue-size).", "n" if n > 1 else "prompt",
                       "invalid_value")
    loop = asyncio.get_running_loop()
    return [Job(p.sent, parsed.choice_params(i), parsed.speculative, len(p.ids), loop, ids=p.ids, text=p.text)
            for p in prompts for i in range(n)]


async def outcome_of(job: Job, request) -> Outcome:
    """The job's outcome, once it is done (its text and logprobs events passed over)."""
    while (event := await next_event(job, request))[0] in ("start", "logprobs", "text"):
        pass
    kind, outcome = event
    if kind == "error":
        raise as_api_error(outcome)
    return outcome


def cancel(scheduler: Scheduler, jobs: list[Job], outcome: str = "cancelled") -> None:
    for job in jobs:
        scheduler.cancel(job, outcome)


def error_json(path: str, exc: ApiError) -> dict:
    """An error's body: Anthropic's form on ``/v1/messages``, OpenAI's elsewhere."""
    if path.startswith("/v1/messages"):
        return messages.error(exc)
    return error_body(exc.status, exc.message, exc.param, exc.code)


def add_error_handlers(app) -> None:
    """Every error answers ``{"error": {...}}`` (Anthropic's form on ``/v1/messages``): an
    ``ApiError`` as it says, an HTTP error (an unknown route, a method it does not take) with its
    status and headers (a 405's ``Allow``), anything else as a 500."""
    from fastapi.responses import JSONResponse
    from starlette.exceptions import HTTPException

    def error(request, exc: ApiError) -> JSONResponse:
        return JSONResponse(error_json(request.url.path, exc), exc.status, exc.headers)

    async def on_api_error(request, exc: ApiError):
        return error(request, exc)

    async def on_http_error(request, exc: HTTPException):
        return error(request, ApiError(exc.status_code, str(exc.detail), headers=exc.headers))

    async def on_crash(request, exc: Exception):
        # Starlette raises the exception again once this is sent, and the server then drops the
        # connection: a client must not send its next request on it
        answer = error(request, as_api_error(exc))
        answer.headers["Connection"] = "close"
        return answer

    app.add_exception_handler(ApiError, on_api_error)
    app.add_exception_handler(HTTPException, on_http_error)
    app.add_exception_handler(Exception, on_crash)


async def parse_off_loop(engine: Engine, settings: Settings, tokenizer, tokenizing, grammars, body,
                         chat: bool, api=None, counting: bool = False) -> Parsed:
    """The request checked and its prompts encoded, on the ``tokenizing`` thread; ``api``: another
    API's module, whose request is read into a chat completion's (``responses``, ``messages``);
    ``counting``: only its tokens are asked for, so a prompt longer than the context is counted."""
    asked = api.chat_body(body) if api else body
    context, most = (None, None) if counting else (engine.target.context_length, settings.max_prompt_tokens)
    try:
        return await asyncio.get_running_loop().run_in_executor(tokenizing, functools.partial(
            parse_request, asked, chat, settings.model_ids, tokenizer, context, settings.default_max_tokens,
            most, grammars, engine.target.vocab_size, engine.eos_ids))
    except ApiError as exc:
        raise renamed(exc, api.RENAMED) if api else exc from None


async def generate(request, chat: bool, api, parse, settings: Settings, scheduler: Scheduler,
                   metrics: Metrics):
    """A completion, or a chat completion; ``api``: another API's module, answered as it answers."""
    from fastapi.responses import Response, StreamingResponse

    try:
        body = await read_json(request, settings.max_body_bytes, settings.body_timeout)
    except ClientGone:  # hung up before the body ended
        return Response(status_code=499)
    parsed = await parse(body, chat, api)
    if parsed.ignored:
        log.warning("%s: ignored the request's fields %s: this server does not read them",
                    request.url.path, ", ".join(repr(name) for name in parsed.ignored))
    jobs, n, read_calls = choice_jobs(parsed, settings.queue_size), parsed.n, parsed.structure.read_calls
    try:
        cached = await admit(jobs, request, scheduler, settings, metrics)
    except ApiError as exc:  # a generation's error may name a chat field, as the request was read into
        raise renamed(exc, api.RENAMED) if api and exc.param else exc from None
    if cached is None:
        return Response(status_code=499)
    head = (api.head(body, settings.model_name, len(parsed.prompts[0].ids), cached) if api
            else response_head(chat, settings.model_name))
    echoes = [p.sent for p in parsed.prompts for _ in range(n)] if parsed.echo else None
    if parsed.stream:
        sources = [job.events.get for job in jobs]
        chunks = (api.events(sources[0], head, read_calls) if api else
                  stream_chunks(sources, head, chat, n, parsed.include_usage, read_calls, echoes))

        async def events():
            try:
                async for chunk in chunks:
                    yield chunk
            finally:
                cancel(scheduler, jobs)

        return StreamingResponse(events(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})

    try:
        outcomes = [await outcome_of(job, request) for job in jobs]
    except ClientGone:
        cancel(scheduler, jobs)
        return Response(status_code=499)
    except ApiError as exc:
        cancel(scheduler, jobs)
        raise renamed(exc, api.RENAMED) if api and exc.param else exc from None
    if api:
        return api.whole(head, outcomes[0], read_calls)
    return full_response(head, chat, outcomes, n, read_calls, echoes)


def add_generation_routes(app, settings: Settings, scheduler: Scheduler, metrics: Metrics, parse) -> None:
    """The routes that generate: completions, chat completions, OpenAI's Responses and Anthropic's
    Messages (and its token count); ``parse(body, chat, api)``: ``parse_off_loop``'s."""
    from fastapi import Request
    from fastapi.responses import Response

    def answer(request: Request, chat: bool = True, api=None):
        return generate(request, chat, api, parse, settings, scheduler, metrics)

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await answer(request, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await answer(request)

    stored = response_store.Api(settings.responses_store)

    @app.post("/v1/responses")
    async def create_response(request: Request):
        return await answer(request, api=stored)

    @app.get("/v1/responses/{response_id}")
    async def get_response(response_id: str):
        return stored.find(response_id)[0]

    @app.delete("/v1/responses/{response_id}")
    async def delete_response(response_id: str):
        return stored.delete(response_id)

    @app.get("/v1/responses/{response_id}/input_items")
    async def list_input_items(response_id: str, limit: str = "20", order: str = "desc",
                               after: str | None = None):
        return stored.input_items(response_id, limit, order, after)

    @app.post("/v1/messages")
    async def create_message(request: Request):
        return await answer(request, api=messages)

    @app.post("/v1/messages/count_tokens")
    async def count_message_tokens(request: Request):
        """The prompt tokens a message request holds (its tools rendered), as Anthropic counts them."""
        try:
            body = await read_json(request, settings.max_body_bytes, settings.body_timeout)
        except ClientGone:
            return Response(status_code=499)
        parsed = await parse({"max_tokens": 1} | body if isinstance(body, dict) else body, True, messages,
                             counting=True)
        return {"input_tokens": len(parsed.prompts[0].ids)}


def create_app(engine: Engine, settings: Settings):
    """The FastAPI app over ``engine``; the worker thread starts and stops with the app's lifespan
    (``settings.worker_thread``; else whoever serves the app runs the worker, see ``cli/serve.py``),
    and once the worker has stopped the engine is closed (``settings.close_engine``)."""
    from fastapi import FastAPI

    metrics = Metrics()
    scheduler = Scheduler(engine, settings.queue_size, settings.generation_timeout, metrics,
                          settings.max_batch)
    tokenizer = copy.deepcopy(engine.target.tokenizer)  # the worker uses the original
    metrics.queue_state = lambda: (scheduler.depth, len(scheduler.running))

    tokenizing = ThreadPoolExecutor(1, "anyspec-tokenize")  # off the event loop: /health stays quick
    grammars = functools.cache(lambda: Grammars(tokenizer, engine.target.vocab_size, engine.eos_ids))

    @contextlib.asynccontextmanager
    async def lifespan(app):
        if settings.worker_thread:
            scheduler.start()
        yield
        if not settings.close_engine:
            scheduler.stop()
        elif not scheduler.close():
            log.warning("the worker did not stop within 30 s; the engine is left open")
        tokenizing.shutdown(wait=False, cancel_futures=True)

    app = FastAPI(title="anyspec", lifespan=lifespan)
    app.state.scheduler, app.state.metrics = scheduler, metrics
    if settings.api_key is not None:
        app.add_middleware(require_key, key=settings.api_key, form=error_json)
    app.add_middleware(count_requests, metrics=metrics)  # outside the key's check: 401s are counted
    if settings.allowed_origins:
        from starlette.middleware.cors import CORSMiddleware

        app.add_middleware(CORSMiddleware, allow_origins=settings.allowed_origins, allow_methods=["*"],
                           allow_headers=["*"])

    add_error_handlers(app)

    parse = functools.partial(parse_off_loop, engine, settings, tokenizer, tokenizing, grammars)
    add_generation_routes(app, settings, scheduler, metrics, parse)
    add_info_routes(app, engine, settings, scheduler, metrics)
    add_token_routes(app, engine, settings, tokenizer, grammars,
                     lambda fn: asyncio.get_running_loop().run_in_executor(tokenizing, fn))
    return app
