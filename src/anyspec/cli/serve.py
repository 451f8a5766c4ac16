"""``anyspec serve``: the OpenAI-compatible server over a target and a draft (``anyspec/server``)."""

from __future__ import annotations

import dataclasses
import gc
import os
import signal
import socket
import sys
import threading
from pathlib import Path

from anyspec.cli.options import (
    add_engine_options,
    add_flags,
    add_model_options,
    pair_plan,
    speculative_config,
)
from anyspec.errors import ConfigError


def add_parser(sub) -> None:
    p = sub.add_parser("serve", help="OpenAI-compatible HTTP server: completions, chat, Responses and "
                       "Anthropic's Messages, whole or streamed", description=__doc__)
    add_model_options(p)
    add_engine_options(p)
    p.add_argument("--host", default="127.0.0.1", help="the address to listen on (default %(default)s)")
    p.add_argument("--port", type=int, default=8000, help="the port to listen on (default %(default)s)")
    p.add_argument("--served-model-name", default=None,
                   help="the model id clients send (default: the target's built-in name, else the name of "
                   "its file or folder without the path, as GET /v1/models lists it; the --target as given "
                   "is taken too)")
    from anyspec.server.settings import Settings

    add_flags(p, Settings)
    p.set_defaults(api_key=os.environ.get("ANYSPEC_API_KEY") or None)  # set but empty: none
    p.set_defaults(func=run)


def check_args(args):
    """Everything that can be wrong with the command line, found before any model loads:
    ``(settings, config, plan)``."""
    from anyspec.models import MODELS
    from anyspec.pair import plan_context

    config = speculative_config(args)
    plan = pair_plan(args)
    if not 1 <= args.port <= 65535:
        raise ConfigError(f"--port must be from 1 to 65535, got {args.port}")
    try:
        import fastapi  # noqa: F401
        import prometheus_client  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        raise ConfigError("the server needs fastapi, uvicorn and prometheus_client: "
                          "pip install 'anyspec[server]'") from None
    from anyspec.server.settings import Settings

    if args.served_model_name is not None and not args.served_model_name.strip():
        raise ConfigError("--served-model-name is empty; give a name or leave it out (the target's)")
    name = args.served_model_name or (args.target if args.target in MODELS else Path(args.target).name)
    aliases = (args.target,) if args.served_model_name is None and args.target != name else ()
    flags = {f.name: getattr(args, f.name) for f in dataclasses.fields(Settings) if hasattr(args, f.name)}
    settings = Settings(model_name=name, model_aliases=aliases, **flags)  # checks them
    context, most = plan_context(plan), settings.max_prompt_tokens
    if context is not None and most is not None and most >= context:
        raise ConfigError(f"--max-prompt-tokens {most} leaves no room for an answer in the target's context "
                          f"of {context} tokens; give at most {context - 1}, or leave it out")
    try:  # bound as uvicorn binds it: a port whose last connections wait out TIME_WAIT is free
        family = socket.getaddrinfo(args.host, args.port, type=socket.SOCK_STREAM)[0][0]
        with socket.socket(family) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((args.host, args.port))
    except OSError as exc:
        raise ConfigError(f"cannot listen on {args.host}:{args.port}: {exc.strerror or exc}") from None
    return settings, config, plan


def kv_memory(target, draft, generations: int) -> str:
    """What the KV caches of ``generations`` slots come to, each at the target's whole context (the
    draft holding as many tokens of its own, at most its context: the same text in its tokens, so
    about as many), beside the memory the system has free; where that is more, how to make it less."""
    slots = f"{generations} generation{'s' if generations != 1 else ''}"
    context = target.context_length
    if context is None:
        return f"the KV caches of {slots} grow with their contexts (the target's unknown)"
    held = target.kv_bytes_per_token * context
    if draft is not None:
        held += draft.kv_bytes_per_token * min(context, draft.context_length or context)
    line = f"the KV caches of {slots} at {context:,} tokens take about {size(generations * held)}"
    free = available_memory()
    if free is not None and generations * held > free:
        line += (f", more than the {size(free)} free now: --max-model-len, --max-batch or --kv-cache-dtype "
                 "fp16 lowers it")
    return line


def size(n: int) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


def available_memory() -> int | None:
    """The bytes the system can give without swapping (Linux's MemAvailable; None elsewhere)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return None


def run(args) -> int:
    """The models' worker runs in this (the main) thread and the HTTP server in another. The kernels'
    OpenMP threads belong to the thread that starts them: a second thread starting them too would
    leave more OpenMP threads than cores, and then every barrier of a forward sleeps instead of
    spinning (a forward runs hundreds of them)."""
    import uvicorn

    from anyspec.engine import Engine
    from anyspec.pair import load_pair
    from anyspec.server.app import create_app

    settings, config, plan = check_args(args)
    settings.worker_thread = False
    pair = load_pair(plan, names=(args.target, args.draft))
    app = create_app(Engine(pair.target, pair.draft, config), settings)
    gc.freeze()  # the models' objects live as long as the server: no full collection walks them again
    if app.state.scheduler.max_batch < settings.max_batch:
        print(f"anyspec serve: these models hold one KV cache each (not GGUF models on anyspec's kernels), "
              f"so requests run one at a time (--max-batch {settings.max_batch} does not apply)",
              file=sys.stderr)
    else:
        print(f"anyspec serve: {kv_memory(pair.target, pair.draft, settings.max_batch)}", file=sys.stderr)
    server = uvicorn.Server(uvicorn.Config(app, host=args.host, port=args.port, log_level="info",
                                           timeout_graceful_shutdown=settings.shutdown_timeout + 5))
    http = threading.Thread(target=server.run, name="anyspec-http", daemon=True)
    scheduler = app.state.scheduler

    def stop(*_):
        """The first signal: no new requests, those under way may finish within --shutdown-timeout;
        then, or at a second signal, the worker ends the rest (a 503, an error event) and returns,
        and the HTTP server has 5 s more to send those."""
        if scheduler.draining:
            return end()
        scheduler.draining = server.should_exit = True
        timer = threading.Timer(settings.shutdown_timeout, end)
        timer.daemon = True
        timer.start()

    def end():
        scheduler.stopping = True

    for sig in (signal.SIGINT, signal.SIGTERM):  # uvicorn handles signals only in the main thread
        signal.signal(sig, stop)
    http.start()
    print(f"anyspec serve: '{settings.model_name}' on http://{args.host}:{args.port}/v1", file=sys.stderr)
    try:
        app.state.scheduler.run(http.is_alive)  # until the server shuts down (its lifespan stops it)
    finally:
        server.should_exit = True
        http.join(timeout=30)
    return 0
