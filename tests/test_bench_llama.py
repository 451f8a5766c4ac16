"""llama.cpp beside anyspec (``anyspec.bench.llama``): finding it, the request, llama-bench's output.

All but the last test run without llama.cpp: the note when it is missing, the ``/completion``
body for token ids (and what a server receives), a server that fails to start, and the parsing
of a ``llama-bench -o json`` output captured from the real binary (``tests/data``). The last one
(slow) starts the real ``llama-server`` on SmolLM2-135M and is skipped when llama.cpp is not built.
"""

from __future__ import annotations

import json
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest
from tokenizer_files import SMOLLM2, SMOLLM2_GGUF, _registry

from anyspec.bench import llama as bl
from anyspec.fetch import package_file

DATA = Path(__file__).parent / "data"


@pytest.fixture
def nowhere(tmp_path, monkeypatch):
    """No llama.cpp anywhere: no $ANYSPEC_LLAMA_CPP, an empty cache, an empty PATH."""
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.delenv("ANYSPEC_LLAMA_CPP", raising=False)
    monkeypatch.setenv("ANYSPEC_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("PATH", str(empty))
    return tmp_path


def _program(folder: Path, name: str, body: str = "exit 0") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return path


def test_missing_llama_cpp_is_one_line_naming_the_fix(nowhere):
    assert bl.llama_cpp_bin("llama-server") is None
    note = bl.llama_cpp_problem()
    assert note is not None and "\n" not in note
    assert "llama-server" in note and "llama-bench" in note and "make llama-cpp" in note
    with pytest.raises(bl.LlamaCppUnavailable, match="make llama-cpp"):
        with bl.llama_server(nowhere / "model.gguf"):
            pass


def test_programs_are_found_in_env_folder_then_cache(nowhere, monkeypatch):
    cached = _program(nowhere / "cache" / "llama.cpp" / "bin", "llama-bench")
    _program(nowhere / "cache" / "llama.cpp" / "bin", "llama-server")
    assert bl.llama_cpp_bin("llama-bench") == cached
    assert bl.llama_cpp_problem() is None
    mine = _program(nowhere / "mine", "llama-bench")
    monkeypatch.setenv("ANYSPEC_LLAMA_CPP", str(nowhere / "mine"))
    assert bl.llama_cpp_bin("llama-bench") == mine
    # a folder set there that lacks a program is said, never replaced by the cache's build
    assert bl.llama_cpp_bin("llama-server") is None
    note = bl.llama_cpp_problem()
    assert note.startswith(f"ANYSPEC_LLAMA_CPP={nowhere / 'mine'} holds no llama-server;")
    assert "\n" not in note
    monkeypatch.setenv("ANYSPEC_LLAMA_CPP", str(nowhere / "no-such-folder"))
    assert "holds no llama-server or llama-bench" in bl.llama_cpp_problem()
    monkeypatch.setenv("ANYSPEC_LLAMA_CPP", str(nowhere / "mine"))
    _program(nowhere / "mine", "llama-server")
    # a target that is not a GGUF file is a note too
    note = bl.llama_cpp_problem(nowhere / "some-hf-folder")
    assert note and "is not a GGUF file" in note and "\n" not in note
    assert "does not exist" in bl.llama_cpp_problem(nowhere / "missing.gguf")
    gguf = nowhere / "m.gguf"
    gguf.write_bytes(b"GGUF")
    assert bl.llama_cpp_problem(gguf) is None
    assert bl.target_gguf(gguf) == gguf and bl.target_gguf(nowhere / "missing.gguf") is None


def test_completion_body_is_token_ids_greedy_without_prompt_cache():
    body = bl.completion_body([1, 15, 300], 16)
    assert body["prompt"] == [1, 15, 300]
    assert body["n_predict"] == 16 and body["return_tokens"] is True and body["stream"] is False
    assert body["cache_prompt"] is False
    assert body["temperature"] == 0 and body["top_k"] == 1 and body["samplers"] == ["top_k"]
    assert body["ignore_eos"] is False and bl.completion_body([7], 4, ignore_eos=True)["ignore_eos"] is True
    assert json.loads(json.dumps(body)) == body
    for bad in ([], ["a"], [1.5], [-1], [True]):
        with pytest.raises(ValueError):
            bl.completion_body(bad, 4)


def test_complete_posts_the_body_and_reads_tokens_and_timings():
    seen = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            seen.append((self.path, json.loads(self.rfile.read(int(self.headers["Content-Length"])))))
            out = json.dumps({"content": " hi", "tokens": [5, 6, 2], "stop_type": "eos",
                              "timings": {"prompt_n": 3, "prompt_ms": 1.5, "predicted_n": 3,
                                          "predicted_ms": 4.0}}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_port}"
    try:
        res = bl.complete(url, [1, 2, 3], 8)
        cut = bl.complete(url, [1, 2, 3], 8, eos={6, 99})
        kept = bl.complete(url, [1, 2, 3], 8, ignore_eos=True, eos={6})
    finally:
        server.shutdown()
        server.server_close()
    assert seen[0] == ("/completion", bl.completion_body([1, 2, 3], 8))
    assert seen[2][1]["ignore_eos"] is True
    # like anyspec, the ids end before the end-of-generation token (llama.cpp's, or the first of eos)
    assert res["ids"] == [5, 6] and cut["ids"] == [5] and kept["ids"] == [5, 6, 2]
    assert res["text"] == " hi" and res["seconds"] > 0
    assert (res["drafted"], res["accepted"], res["stop"]) == (0, 0, "eos")
    assert (res["prompt_n"], res["prompt_ms"], res["predicted_n"], res["predicted_ms"]) == (3, 1.5, 3, 4.0)
    # the bench's columns from llama-server's own timings: the first token ends the prompt's time
    assert (res["ttft"], res["prefill_tokens"], res["prefill_seconds"]) == (0.0015, 3, 0.0015)
    assert (res["decode_tokens"], res["decode_seconds"]) == (2, 0.004)


def test_a_later_turn_asks_llama_server_to_keep_its_prefix():
    assert bl.completion_body([1, 2], 4, cache_prompt=True)["cache_prompt"] is True
    assert bl.completion_body([1, 2], 4)["cache_prompt"] is False


def test_a_server_that_dies_at_start_is_one_line_with_its_last_words(nowhere, monkeypatch):
    _program(nowhere / "bin", "llama-server", 'echo "error: failed to load model"; exit 3')
    monkeypatch.setenv("ANYSPEC_LLAMA_CPP", str(nowhere / "bin"))
    monkeypatch.setattr(tempfile, "tempdir", str(nowhere))  # where the kept log goes
    gguf = nowhere / "m.gguf"
    gguf.write_bytes(b"GGUF")
    with pytest.raises(bl.LlamaCppUnavailable, match=r"exited with 3 \(error: failed to load model;") as err:
        with bl.llama_server(gguf, threads=1):
            pass
    kept = list(nowhere.glob("anyspec-llama-server-*.log"))
    assert len(kept) == 1 and str(kept[0]) in str(err.value)


def test_llama_bench_json_parses_to_ms_per_forward_and_per_token():
    # captured: llama-bench -m smollm2-135m.gguf -p 1,2,8 -n 16 -t 2 -r 2 -o json
    got = bl.parse_llama_bench((DATA / "llama_bench_smollm2.json").read_text())
    raw = json.loads((DATA / "llama_bench_smollm2.json").read_text())
    assert sorted(got["forward_ms"]) == [1, 2, 8]
    pp = {t["n_prompt"]: t for t in raw if t["n_gen"] == 0}
    for n, ms in got["forward_ms"].items():
        assert ms == pytest.approx(pp[n]["avg_ns"] / 1e6)
        assert ms == pytest.approx(n / pp[n]["avg_ts"] * 1000, rel=0.05)  # tokens/s says the same
    tg = next(t for t in raw if t["n_gen"])
    assert got["token_ms"] == pytest.approx(1000 / tg["avg_ts"], rel=0.05)
    assert got["threads"] == 2 and got["depth"] == 0 and got["build"]
    assert bl.parse_llama_bench("[]")["forward_ms"] == {}


@pytest.mark.slow
@pytest.mark.skipif(bl.llama_cpp_problem() is not None,
                    reason=f"llama.cpp is not built here ({bl.llama_cpp_problem()})")
def test_real_llama_server_greedy_from_token_ids_is_repeatable(tok_smollm2):
    gguf = _registry(lambda: package_file(*SMOLLM2, *SMOLLM2_GGUF))
    ids = tok_smollm2.encode("def fibonacci(n):\n    ")
    with bl.llama_server(gguf, threads=2, ctx_size=256) as url:
        first = bl.complete(url, ids, 16, ignore_eos=True)
        second = bl.complete(url, ids, 16, ignore_eos=True)
    assert len(first["ids"]) == 16 and all(isinstance(t, int) for t in first["ids"])
    assert second["ids"] == first["ids"]
    assert first["prompt_n"] == len(ids) == second["prompt_n"]  # no prompt cache: all of it, both times
    assert first["predicted_n"] == 16 and first["seconds"] > 0
    assert first["text"] == tok_smollm2.decode(first["ids"])
    chat = tok_smollm2.apply_chat_template([{"role": "user", "content": "Say hi."}], tokenize=False,
                                           add_generation_prompt=True)
    with bl.llama_server(gguf, threads=2, ctx_size=512) as url:
        short = bl.complete(url, tok_smollm2.encode(chat, add_special_tokens=False), 200)
    assert short["stop"] == "eos" and 0 < len(short["ids"]) < 200  # stops at EOS, which it leaves out
    assert tok_smollm2.eos_token_id not in short["ids"] and len(short["ids"]) == short["predicted_n"] - 1
