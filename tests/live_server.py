"""A live anyspec server on a free 127.0.0.1 port, in a thread, for tests over real HTTP."""

from __future__ import annotations

import contextlib
import socket
import threading
import time

from tiny_models import one_thread, save_tiny_model  # noqa: F401  (re-exported for test modules)

from anyspec.backends.load import load_model
from anyspec.engine import Engine, SpeculativeConfig

MODEL_NAME = "tiny-qwen2"
CHAT = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name a prime."}]


BODY_LIMIT = 4000  # strict_server's (conftest.py)
BODY_TIMEOUT = 2.0
OK = {"model": MODEL_NAME, "prompt": "hello", "max_tokens": 2, "temperature": 0}
CHAT_OK = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


def assert_error(response, status, param=None, code=None, says=""):
    """An OpenAI-style error body with this status, param and code, whose message says ``says``."""
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and says.lower() in error["message"].lower()
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param
    assert error["code"] == code
    return error


def greedy(n: int, **kw):
    """Greedy ``SamplingParams`` for ``n`` new tokens."""
    from anyspec.engine import SamplingParams

    return SamplingParams(temperature=0.0, max_new_tokens=n, **kw)


def tiny_pair(tok_target, tok_draft, folder):
    """A Qwen2 target (chat template from its tokenizer) and a Llama draft with another vocabulary."""
    target = save_tiny_model(tok_target, folder / "target", "qwen2", seed=0, max_positions=256)
    draft = save_tiny_model(tok_draft, folder / "draft", "llama", seed=1, max_positions=256)
    return target, draft


def load_engine(target_dir, draft_dir, k: int = 3, dtype: str = "fp32", prefix_cache: bool = True) -> Engine:
    target = load_model(str(target_dir), dtype=dtype, name="target")
    draft = load_model(str(draft_dir), dtype=dtype, name="draft") if draft_dir else None
    return Engine(target, draft, SpeculativeConfig(num_speculative_tokens=k, prefix_cache=prefix_cache))


@contextlib.contextmanager
def live_server(engine: Engine, **settings):
    """Yield the base URL (``http://127.0.0.1:PORT``) of a uvicorn server over ``engine``; stop it after,
    the engine left open unless ``close_engine`` (a test's engine often serves several servers)."""
    import uvicorn

    from anyspec.server.app import Settings, create_app

    app = create_app(engine, Settings(model_name=MODEL_NAME, **({"close_engine": False} | settings)))
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}", app
    finally:
        server.should_exit = True
        thread.join(timeout=60)
        sock.close()
