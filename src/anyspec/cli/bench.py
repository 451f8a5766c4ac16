"""``anyspec bench``: anyspec against the target alone, Hugging Face's assisted generation and vLLM
(``anyspec/bench/``), on the prompts shipped with the package unless ``--prompts`` names others."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from anyspec.cli.options import (
    add_engine_options,
    add_model_options,
    check_max_new_tokens,
    check_output,
    speculative_config,
    write_atomically,
)

FIXED = ("algorithm", "draft_sample_method", "draft_context", "prefix_cache")  # the methods set these


def add_parser(sub) -> None:
    from anyspec.bench.llama_spec import DEFAULT_LLAMA_SPEC
    from anyspec.bench.methods import DEFAULT_METHODS, METHODS
    from anyspec.config import AUTO_NGRAM

    p = sub.add_parser("bench", help="tokens/s, speedup, acceptance and exactness against baselines",
                       description=__doc__)
    add_model_options(p, no_draft=False, chat_template=False)
    p.add_argument("--prompts", nargs="+", default=None, metavar="SET_OR_FILE",
                   help="JSONL prompt files, or sets shipped with anyspec by name: code, prose, edit, doc, "
                        "long, chat, json, languages (default: code prose)")
    p.add_argument("--limit", type=int, default=None, metavar="N",
                   help="at most N prompts from each file (default: all)")
    p.add_argument("--repeat", type=int, default=1, metavar="N",
                   help="run the whole rotation N times (tok/s then pools every run; a noisy machine; "
                        "default %(default)s)")
    explained = {
        "target": "the target alone on anyspec's loop, greedy (the reference each greedy output is "
                  "compared with, token by token)",
        "target-sampled": "the target alone, sampled (--temperature, --top-p, --seed)",
        "target-ngram": f"the target alone with prompt lookup on every prompt (--ngram, else {AUTO_NGRAM})",
        "anyspec-greedy": "anyspec with the draft, TLI, greedy",
        "anyspec-slem": "anyspec with the draft, SLEM, greedy",
        "anyspec-slem-ngram": f"anyspec-slem with prompt lookup on every prompt (--ngram, else {AUTO_NGRAM})",
        "target-predicted": "the target alone given each prompt's prediction (the edit set's: the file it "
                            "pastes) as OpenAI's Predicted Outputs: prompt lookup proposes from it",
        "anyspec-slem-predicted": "anyspec-slem given each prompt's prediction, as target-predicted",
        "anyspec-slem-chain": "anyspec-slem without branches beside the draft's chain (--tree 0)",
        "anyspec-sampled": "anyspec with the draft, sampled (algorithm auto: SLEM), against "
                           "target-sampled with the same seed",
        "llama.cpp": "llama.cpp's llama-server on the target's GGUF file alone, greedy",
        "llama.cpp-ngram": "the same with llama.cpp's own lookup speculation (--llama-spec)",
        "hf-target": "transformers' generate with the target alone, greedy",
        "hf-uag": "transformers' assisted generation with the draft (Universal Assisted Generation, "
                  "--hf-assistant), against hf-target",
        "vllm-target": "vLLM with the target alone, greedy",
        "vllm": "vLLM's own speculative decoding with the same pair (method draft_model), greedy",
    }
    p.add_argument("--methods", nargs="+", default=DEFAULT_METHODS, choices=METHODS, metavar="METHOD",
                   help="what runs on the same prompts, in a rotating order: "
                        + "; ".join(f"{m}{'' if m in DEFAULT_METHODS else ' (opt-in)'}: {explained[m]}"
                                    for m in METHODS)
                        + ". Each speedup is over target, but anyspec-sampled's (over target-sampled) and "
                          f"hf-uag's (over hf-target) (default: {' '.join(DEFAULT_METHODS)})")
    p.add_argument("--also-draft-dtype", nargs="+", default=[], metavar="DTYPE",
                   help="run each anyspec method with a draft again with the draft in DTYPE (named "
                        "METHOD@DTYPE), in the same alternating rotation: e.g. gguf against bf16")
    p.add_argument("--max-new-tokens", type=int, default=64, metavar="N",
                   help="the most tokens each answer may have (default 64)")
    add_engine_options(p, fixed=FIXED, context=False)
    p.add_argument("--temperature", type=float, default=0.7,
                   help="for anyspec-sampled and target-sampled (default %(default)s)")
    p.add_argument("--top-p", type=float, default=1.0, metavar="P",
                   help="nucleus sampling for anyspec-sampled and target-sampled (1 = off; "
                        "default %(default)s)")
    p.add_argument("--presence-penalty", type=float, default=0.0,
                   help="OpenAI's, from -2 to 2, for the target and anyspec methods only (0 = off; "
                        "default %(default)s)")
    p.add_argument("--frequency-penalty", type=float, default=0.0,
                   help="OpenAI's, from -2 to 2, for the target and anyspec methods only (0 = off; "
                        "default %(default)s)")
    p.add_argument("--seed", type=int, default=0,
                   help="the seed of anyspec-sampled and target-sampled, the same for both, so their "
                        "answers must match; also vLLM's engine seed (0 to 2**64 - 1; default %(default)s)")
    p.add_argument("--hf-assistant", choices=["default", "k"], default="default",
                   help="HF assisted generation: its adaptive default, or the same fixed k as anyspec "
                        "(default: %(default)s)")
    p.add_argument("--vllm-python", default=os.environ.get("ANYSPEC_VLLM_PYTHON") or None, metavar="PATH",
                   help="run the vllm methods in a subprocess of this python (a venv with vLLM, e.g. "
                        ".venv-vllm/bin/python; default: $ANYSPEC_VLLM_PYTHON, else vLLM in this process)")
    p.add_argument("--llama-spec", default=DEFAULT_LLAMA_SPEC, metavar="ARGS",
                   help="llama-server's lookup speculation for the llama.cpp-ngram method: --spec-type "
                        "(ngram-simple, ngram-map-k, ngram-map-k4v, ngram-mod, ngram-cache) and its "
                        f"--spec-ngram-* sizes, as one string (default: {DEFAULT_LLAMA_SPEC!r})")
    p.add_argument("--json", type=Path, default=None, metavar="FILE", help="write the full result here")
    p.add_argument("--markdown", type=Path, default=None, metavar="FILE",
                   help="write the table here (it is printed anyway)")
    p.add_argument("--plot", type=Path, default=None, metavar="FILE",
                   help="write a PNG bar chart here (needs matplotlib)")
    p.set_defaults(func=run)


def run(args) -> int:
    from anyspec.bench.context import BenchSettings
    from anyspec.bench.prompts import DEFAULT_PROMPTS, prompt_file
    from anyspec.bench.report import markdown, plot, pyplot
    from anyspec.bench.run import run_bench

    check_max_new_tokens(args.max_new_tokens)
    for path, option in ((args.json, "--json"), (args.markdown, "--markdown"), (args.plot, "--plot")):
        check_output(path, option)
    if args.plot:
        pyplot()
    files = [prompt_file(p) for p in args.prompts] if args.prompts else DEFAULT_PROMPTS
    settings = BenchSettings(args.target, args.draft, files, args.methods,
                             max_new_tokens=args.max_new_tokens, speculative=speculative_config(args),
                             dtype=args.dtype, draft_dtype=args.draft_dtype,
                             kv_cache_dtype=args.kv_cache_dtype, also_draft_dtypes=args.also_draft_dtype,
                             temperature=args.temperature,
                             top_p=args.top_p, penalties=(args.presence_penalty, args.frequency_penalty),
                             seed=args.seed, threads=args.threads, limit=args.limit,
                             repeat=args.repeat,
                             hf_assistant=args.hf_assistant, vllm_python=args.vllm_python,
                             llama_spec=args.llama_spec)
    result = run_bench(settings, log=lambda s: print(s, file=sys.stderr, flush=True))
    publish(result, markdown(result), args.json, args.markdown)
    if args.plot:
        with write_atomically(args.plot, "--plot") as tmp:
            plot(result, tmp)
    return 0


def publish(result: dict, table: str, json_path: Path | None, markdown_path: Path | None) -> None:
    """A bench's ``table`` to stdout, and with it ``result`` and ``table`` into the files named,
    each written whole or not at all (``write_atomically``); the benchmarks' scripts end so too."""
    print(table)
    if json_path:
        with write_atomically(json_path, "--json") as tmp:
            tmp.write_text(json.dumps(result, indent=1) + "\n")
    if markdown_path:
        with write_atomically(markdown_path, "--markdown") as tmp:
            tmp.write_text(table)
