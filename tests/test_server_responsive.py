"""The server keeps answering while it reads large prompts: tokenizing runs off the event loop."""

import threading
import time

import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

from live_server import MODEL_NAME, live_server, load_engine, tiny_pair  # noqa: E402


def test_health_answers_while_large_prompts_are_tokenized(tok_qwen2, tok_llama2, tmp_path):
    folders = tiny_pair(tok_qwen2, tok_llama2, tmp_path)
    prompt = "def add(a, b):\n    return a + b  # the sum of a and b, as one would expect\n" * 13_000
    t = time.perf_counter()
    tokens = len(tok_qwen2.encode(prompt))
    one = time.perf_counter() - t  # what tokenizing one such prompt takes here
    answers = []
    with live_server(load_engine(*folders), max_body_bytes=4_000_000) as (url, _):
        def send():
            with httpx.Client(base_url=url, timeout=120) as http:
                answers.append(http.post("/v1/completions", json={"model": MODEL_NAME, "prompt": prompt,
                                                                   "max_tokens": 1}))

        senders = [threading.Thread(target=send) for _ in range(6)]
        for s in senders:
            s.start()
        time.sleep(min(one, 0.5))  # the first of them is being tokenized
        with httpx.Client(base_url=url, timeout=120) as http:
            t = time.perf_counter()
            assert http.get("/health").status_code == 200
            health = time.perf_counter() - t
        for s in senders:
            s.join()
    assert [a.status_code for a in answers] == [400] * 6  # each was tokenized: beyond the tiny context
    assert all(f"the prompt has {tokens} tokens" in a.json()["error"]["message"] for a in answers)
    assert health < one, f"/health took {health:.2f} s; tokenizing one prompt takes {one:.2f} s"
