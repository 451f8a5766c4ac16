"""Request bodies the server cannot read (not JSON, too large, too deep, numbers beyond floats,
cut short or stalled) and a crash inside it: each is an OpenAI-style error with the right status,
counted in /metrics, and the server keeps serving."""

import json

import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

from live_server import BODY_LIMIT, BODY_TIMEOUT, CHAT_OK, OK, assert_error  # noqa: E402


def test_invalid_json(post):
    r = post("/v1/completions", content=b'{"prompt": "hi",', headers={"content-type": "application/json"})
    assert_error(r, 400, None, "invalid_json", "not valid JSON")


def test_body_not_an_object(post):
    assert_error(post("/v1/chat/completions", json=["hi"]), 400, None, "invalid_type", "JSON object")


def test_oversized_body(post):
    """400 request_too_large (not 413): OpenAI reports request problems as 400 invalid_request_error."""
    r = post("/v1/completions", json=OK | {"prompt": "x" * (BODY_LIMIT + 10)})
    assert_error(r, 400, None, "request_too_large", f"limit of {BODY_LIMIT} bytes")


def test_oversized_body_without_content_length(post):
    def chunks():
        body = json.dumps(OK | {"prompt": "y" * (BODY_LIMIT + 10)}).encode()
        for i in range(0, len(body), 1000):
            yield body[i:i + 1000]

    r = post("/v1/completions", content=chunks(), headers={"content-type": "application/json"})
    assert "content-length" not in r.request.headers
    assert_error(r, 400, None, "request_too_large")


def test_unknown_route(post):
    assert_error(post("/v1/embeddings", json={"input": "hi"}), 404, None, None, "not found")


def test_a_method_a_route_does_not_take_is_a_405_that_says_which_it_takes(strict_server):
    for method, path, allowed in (("GET", "/v1/completions", "POST"), ("DELETE", "/health", "GET, HEAD"),
                                  ("POST", "/v1/models", "GET")):
        r = httpx.request(method, strict_server + path, timeout=60)
        assert_error(r, 405, None, None, "not allowed")
        assert set(r.headers["allow"].split(", ")) == set(allowed.split(", "))
    for path in ("/health", "/metrics"):  # what probes may send
        r = httpx.head(strict_server + path, timeout=60)
        assert r.status_code == 200 and r.content == b""


def test_a_crash_is_a_500_counted_in_metrics(strict_server, monkeypatch):
    """The catch-all handler answers outside the app's own middleware; /metrics still counts it."""
    from anyspec.server import app

    def crash(*args, **kwargs):
        raise RuntimeError("a bug")

    before = metric(strict_server, "/v1/completions", 500)
    monkeypatch.setattr(app, "parse_request", crash)
    with httpx.Client(base_url=strict_server, timeout=60) as http:
        r = http.post("/v1/completions", json=OK)
        monkeypatch.undo()
        for _ in range(4):  # the crash's connection is not kept for the next request
            assert http.post("/v1/completions", json=OK).status_code == 200
    assert r.status_code == 500 and r.json()["error"]["type"] == "server_error"
    assert r.headers["connection"] == "close"
    assert metric(strict_server, "/v1/completions", 500) == before + 1


def test_deeply_nested_json_is_a_400(post):
    r = post("/v1/completions", content=b"[" * 3000, headers={"content-type": "application/json"})
    assert_error(r, 400, None, "invalid_json", "nested too deeply")


@pytest.mark.parametrize("field", ["top_p", "temperature"])
def test_a_number_beyond_floats_is_a_400_naming_the_field(post, field):
    r = post("/v1/completions", content=json.dumps(OK | {field: 10**400}),
             headers={"content-type": "application/json"})
    error = assert_error(r, 400, field, "invalid_value", f"'{field}' must be")
    assert "an integer of 401 digits" in error["message"]


def test_an_integer_too_long_to_parse_is_named_as_such():
    import asyncio

    from starlette.requests import Request

    from anyspec.server.app import read_json
    from anyspec.server.fields import ApiError

    body = f'{{"prompt": "hi", "seed": {"7" * 5000}}}'.encode()
    scope = {"type": "http", "method": "POST", "path": "/v1/completions",
             "headers": [(b"content-length", str(len(body)).encode())]}

    async def receive():
        return {"type": "http.request", "body": body, "more_body": False}

    with pytest.raises(ApiError) as err:
        asyncio.run(read_json(Request(scope, receive), 1_000_000))
    assert err.value.status == 400 and err.value.code == "invalid_json"
    assert "has more than 4300 digits" in str(err.value) and "not valid JSON" not in str(err.value)


def metric(url: str, path: str, status: int) -> float:
    key = f'anyspec_requests_total{{path="{path}",status="{status}"}}'
    line = next((x for x in httpx.get(url + "/metrics").text.splitlines() if x.startswith(key)), None)
    return float(line.split()[-1]) if line else 0.0


def test_metrics_count_the_responses_and_models_routes_by_their_templates(strict_server):
    """A stored response's GET, its input_items and a model's GET are counted under their routes
    (ids in braces), apart from unknown paths."""
    url = strict_server
    labels = ("/v1/responses/{id}", "/v1/responses/{id}/input_items", "/v1/models/{model}")
    before, others = [metric(url, label, 404) for label in labels], metric(url, "other", 404)
    for path in ("/v1/responses/resp_1", "/v1/responses/resp_2/input_items", "/v1/models/nothing"):
        assert httpx.get(url + path).status_code == 404
    after = [metric(url, label, 404) for label in labels]
    assert after == [b + 1 for b in before] and metric(url, "other", 404) == others
    httpx.get(url + "/no/such/route")
    assert metric(url, "other", 404) == others + 1


def test_a_client_that_hangs_up_mid_body_is_not_a_500(strict_server):
    import socket
    import time
    from urllib.parse import urlsplit

    where = urlsplit(strict_server)
    before_500, before_499 = (metric(strict_server, "/v1/completions", status) for status in (500, 499))
    for _ in range(3):
        with socket.create_connection((where.hostname, where.port), timeout=10) as sock:
            sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 1000\r\n\r\n" + b'{"prompt": "half a bo')
    deadline = time.monotonic() + 10
    while metric(strict_server, "/v1/completions", 499) < before_499 + 3 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert metric(strict_server, "/v1/completions", 499) == before_499 + 3
    assert metric(strict_server, "/v1/completions", 500) == before_500


def test_a_body_that_stalls_is_a_408_after_the_timeout(strict_server):
    import socket
    import time
    from urllib.parse import urlsplit

    where = urlsplit(strict_server)
    with socket.create_connection((where.hostname, where.port), timeout=30) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 1000\r\n\r\n" + b'{"prompt": "and then noth')
        t = time.monotonic()
        answer = b""
        while b"\r\n\r\n" not in answer and (chunk := sock.recv(4096)):
            answer += chunk
        waited = time.monotonic() - t
    assert answer.startswith(b"HTTP/1.1 408 "), answer
    assert BODY_TIMEOUT - 0.5 < waited < BODY_TIMEOUT + 10


def test_fields_nothing_reads_are_named_in_the_log(post, caplog):
    """A misspelt field changes nothing in the answer; the server's log names it, and only it."""
    with caplog.at_level("WARNING", logger="anyspec.server"):
        assert post("/v1/completions", json=OK | {"max_token": 5, "top_k": 3}).status_code == 200
        assert post("/v1/chat/completions", json=CHAT_OK | {"seed": 1, "logprobs": True}).status_code == 200
    warned = [r.getMessage() for r in caplog.records if r.name == "anyspec.server"]
    assert warned == ["/v1/completions: ignored the request's fields 'max_token': this server does not "
                      "read them"]
