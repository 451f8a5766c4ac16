"""Cost per token of a JSON-schema mask on this CPU: llguidance against xgrammar.

    .venv/bin/python benchmarks/grammar_mask.py [--target qwen2.5-coder-1.5b] [--repeats 3]

With the target's own tokenizer (151,936 ids for the default target), each library compiles a few
schemas, then walks a valid document of each token by token as the engine does: the mask of the
next token, then the token consumed. Reported per library and schema: the tokenizer set-up and
compile time once, and the mean and 95th-percentile microseconds of one mask plus one step. A
speculative round also rolls back; ``rollback_us`` is the cost of one step back.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import platform
import statistics
import sys
import time

import torch

SCHEMAS = {
    "flat": ({"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
              "required": ["name", "age"], "additionalProperties": False},
             {"name": "Ada Lovelace", "age": 36}),
    "nested": ({"type": "object", "properties": {
        "user": {"type": "object", "properties": {"id": {"type": "integer"}, "tags": {
            "type": "array", "items": {"type": "string"}}}, "required": ["id", "tags"]},
        "status": {"enum": ["active", "banned", "pending"]}}, "required": ["user", "status"]},
        {"user": {"id": 7, "tags": ["admin", "ops", "on-call"]}, "status": "pending"}),
    "any_object": ({"type": "object"}, {"a": [1, 2, {"b": "text with spaces"}], "c": None, "d": 1.5}),
}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def run_llguidance(tokenizer, vocab: int, schema: dict, ids: list[int]) -> dict:
    import llguidance
    import llguidance.hf
    import llguidance.torch

    t0 = time.perf_counter()
    lltok = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab)
    setup = time.perf_counter() - t0
    t0 = time.perf_counter()
    grammar = llguidance.LLMatcher.grammar_from_json_schema(schema, defaults={"whitespace_flexible": False})
    matcher = llguidance.LLMatcher(lltok, grammar)
    compile_s = time.perf_counter() - t0
    bitmask = llguidance.torch.allocate_token_bitmask(1, vocab)
    steps = []
    for token in ids:
        t0 = time.perf_counter()
        llguidance.torch.fill_next_token_bitmask(matcher, bitmask, 0)
        assert matcher.consume_token(token), matcher.get_error()
        steps.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    matcher.rollback(len(ids))
    back = (time.perf_counter() - t0) / len(ids)
    return dict(setup_s=setup, compile_s=compile_s, steps=steps, rollback_us=back * 1e6)


def run_xgrammar(tokenizer, vocab: int, schema: dict, ids: list[int]) -> dict:
    import xgrammar

    t0 = time.perf_counter()
    info = xgrammar.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab)
    compiler = xgrammar.GrammarCompiler(info)
    setup = time.perf_counter() - t0
    t0 = time.perf_counter()
    compiled = compiler.compile_json_schema(json.dumps(schema), any_whitespace=False,
                                           separators=(",", ":"))
    matcher = xgrammar.GrammarMatcher(compiled)
    compile_s = time.perf_counter() - t0
    bitmask = xgrammar.allocate_token_bitmask(1, vocab)
    steps = []
    for token in ids:
        t0 = time.perf_counter()
        matcher.fill_next_token_bitmask(bitmask)
        assert matcher.accept_token(token)
        steps.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    matcher.rollback(len(ids))
    back = (time.perf_counter() - t0) / len(ids)
    return dict(setup_s=setup, compile_s=compile_s, steps=steps, rollback_us=back * 1e6)


LIBRARIES = {"llguidance": "pip install 'llguidance>=1.9,<2' (anyspec's server extra)",
             "xgrammar": "pip install xgrammar (docs/structured.md: 0.2.9)"}


def main() -> None:
    from anyspec.models import gguf_path
    from anyspec.vocab import load_tokenizer

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="qwen2.5-coder-1.5b")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    for library, install in LIBRARIES.items():
        if importlib.util.find_spec(library) is None:
            print(f"grammar_mask.py: {library} is not installed, and this compares llguidance with xgrammar: "
                  f"{install}", file=sys.stderr)
            raise SystemExit(2)
    torch.set_num_threads(1)
    tokenizer = load_tokenizer(gguf_path(args.target))
    vocab = len(tokenizer)
    print(f"# {platform.processor() or platform.machine()}, tokenizer {args.target} ({vocab} ids)")
    for name, (schema, doc) in SCHEMAS.items():
        ids = tokenizer.encode(json.dumps(doc, separators=(",", ":")), add_special_tokens=False)
        for library, run in (("llguidance", run_llguidance), ("xgrammar", run_xgrammar)):
            runs = [run(tokenizer, vocab, schema, ids) for _ in range(args.repeats)]
            steps = [s * 1e6 for r in runs for s in r["steps"]]
            print(json.dumps(dict(
                library=library, schema=name, tokens=len(ids), setup_s=round(runs[0]["setup_s"], 3),
                compile_ms=round(statistics.median(r["compile_s"] for r in runs) * 1e3, 2),
                mask_us_mean=round(statistics.mean(steps), 1), mask_us_p95=round(percentile(steps, 0.95), 1),
                rollback_us=round(statistics.median(r["rollback_us"] for r in runs), 2))))


if __name__ == "__main__":
    main()
