"""``--max-model-len`` (``anyspec.load(max_model_len=...)``): the target's context cut short, checked
before anything loads, honoured by every request, and the bound of each KV cache's growth."""

from __future__ import annotations

import sys

import pytest

import anyspec
from anyspec.cli import main
from anyspec.config import SamplingParams
from anyspec.errors import ConfigError


@pytest.fixture(scope="module")
def long_folder(tok_qwen2, tmp_path_factory):
    """A tiny Qwen2 model whose own context (1,024) is beyond its KV cache's first capacity (256)."""
    from tiny_models import save_tiny_model

    return str(save_tiny_model(tok_qwen2, tmp_path_factory.mktemp("long") / "target", "qwen2", seed=4,
                               max_positions=1024))


def test_a_kv_cache_grows_by_doubling_to_its_limit_and_no_further():
    from anyspec.backends.stack import KVCache

    cache = KVCache(2, 2, 8)
    cache.reserve(0, 300)
    assert cache.capacity == 512
    cache = KVCache(2, 2, 8)
    cache.reserve(0, 300, limit=400)
    assert cache.capacity == 400
    cache.reserve(0, 450, limit=400)  # never less than asked for
    assert cache.capacity == 450


def test_a_capped_context_gives_the_same_answer_and_holds_the_cache_to_it(long_folder):
    params = SamplingParams(max_new_tokens=280, ignore_eos=True)
    prompt = "def count(items):\n    total = 0\n"
    whole = anyspec.load(long_folder, None, dtype="int8")
    capped = anyspec.load(long_folder, None, dtype="int8", max_model_len=300)
    assert (whole.target.context_length, capped.target.context_length) == (1024, 300)
    expected = whole.generate(prompt, params)
    got = capped.generate(prompt, params)
    assert got.token_ids == expected.token_ids and len(got.token_ids) == 280
    assert whole.target.own.cache.capacity == 512 and capped.target.own.cache.capacity == 300
    with pytest.raises(ConfigError, match="beyond the target's context of 300 tokens"):
        capped.generate(prompt, SamplingParams(max_new_tokens=295))


def test_a_cap_beyond_the_models_context_is_refused(long_folder, no_loading):
    with pytest.raises(ConfigError, match="^max_model_len 1025 is more than the target's context of 1024 "
                                          "tokens; give at most 1024"):
        anyspec.load(long_folder, None, max_model_len=1025)
    for bad in (1, 0, 2.5, True, "300"):
        with pytest.raises(ConfigError, match="^max_model_len must be an integer >= 2"):
            anyspec.load(long_folder, None, max_model_len=bad)


def one_line(capsys, argv: list[str], says: str) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert says in err and err.count("\n") == 1 and "Traceback" not in err, err


@pytest.mark.parametrize("command", [["generate", "--prompt", "hi"], ["chat"], ["serve"], ["demo"]])
def test_the_command_line_refuses_a_cap_beyond_the_context_before_loading(no_loading, capsys, long_folder,
                                                                         command):
    one_line(capsys, [*command, "--target", long_folder, "--draft", long_folder, "--max-model-len", "2048"],
             "--max-model-len 2048 is more than the target's context of 1024 tokens")


@pytest.mark.parametrize(("command", "flags", "says"), [
    (["generate", "--prompt", "hi"], ["--max-new-tokens", "64"],
     "--max-new-tokens 64 leaves no room for a prompt in the target's context of 64 tokens"),
    (["demo"], ["--max-new-tokens", "80"],
     "--max-new-tokens 80 leaves no room for a prompt in the target's context of 64 tokens"),
    (["serve"], ["--max-prompt-tokens", "64"],
     "--max-prompt-tokens 64 leaves no room for an answer in the target's context of 64 tokens")])
def test_the_other_limits_are_checked_against_the_cap_before_loading(no_loading, capsys, long_folder, command,
                                                                      flags, says):
    models = ["--target", long_folder, "--draft", long_folder]
    one_line(capsys, [*command, *models, "--max-model-len", "64", *flags], says)


def test_bench_has_no_cap_that_its_other_engines_would_not_keep():
    from anyspec.cli.commands import build_parser

    with pytest.raises(SystemExit):
        build_parser().parse_args(["bench", "--max-model-len", "64"])


def test_serve_says_what_the_kv_caches_may_take(long_folder, monkeypatch):
    from anyspec.cli import serve

    engine = anyspec.load(long_folder, None, dtype="int8", max_model_len=300)
    target = engine.target
    per_token = 2 * 2 * 2 * 8 * 4  # keys and values, 2 layers, 2 KV heads of 8, fp32
    assert target.kv_bytes_per_token == per_token
    monkeypatch.setattr(serve, "available_memory", lambda: 1 << 40)
    line = serve.kv_memory(target, None, 4)
    mib = 4 * 300 * per_token / 2**20
    assert line == f"the KV caches of 4 generations at 300 tokens take about {mib:.0f} MiB"
    assert serve.kv_memory(target, None, 1).startswith("the KV caches of 1 generation at 300")
    monkeypatch.setattr(serve, "available_memory", lambda: 1000)
    assert serve.kv_memory(target, None, 4).endswith(
        "more than the 0 MiB free now: --max-model-len, --max-batch or --kv-cache-dtype fp16 lowers it")
    assert serve.size(3 << 30) == "3.0 GiB" and serve.size(5 << 20) == "5 MiB"
    if sys.platform == "linux":
        assert serve.available_memory() > 0


def test_the_server_holds_requests_to_the_cap(long_folder):
    import httpx
    from live_server import MODEL_NAME, live_server

    engine = anyspec.load(long_folder, None, dtype="int8", max_model_len=64)
    with live_server(engine) as (url, _):
        def complete(max_tokens: int):
            return httpx.post(url + "/v1/completions", timeout=60, json={
                "model": MODEL_NAME, "prompt": "def f(x):", "max_tokens": max_tokens, "temperature": 0})

        prompt_tokens = complete(4).json()["usage"]["prompt_tokens"]
        refused = complete(64 - prompt_tokens + 1)
        assert refused.status_code == 400, refused.text
        assert refused.json()["error"]["param"] == "max_tokens"
        assert "maximum context length is 64 tokens" in refused.json()["error"]["message"]
        fits = complete(64 - prompt_tokens)
        assert fits.status_code == 200 and fits.json()["usage"]["total_tokens"] <= 64
        assert httpx.post(url + "/tokenize", json={"prompt": "hi"}).json()["max_model_len"] == 64
        assert httpx.get(url + "/v1/models").json()["data"][0]["max_model_len"] == 64  # as vLLM lists it
