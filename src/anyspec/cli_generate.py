"""``anyspec generate``: speculative decoding from the command line.

Everything that cannot work (settings out of range, a missing model, an empty prompt) fails with
one line before any model is loaded. Text streams to stdout, statistics go to stderr; ``--json``
prints exactly one object instead.
"""

from __future__ import annotations

import json
import sys

from anyspec import defaults
from anyspec.cli import add_engine_options, engine_options, set_threads
from anyspec.errors import ConfigError

STAT_KEYS = ("algorithm", "rounds", "drafted", "accepted", "acceptance_rate", "mean_accepted_length",
             "tokens_per_second", "draft_seconds", "target_seconds")


def add_parser(sub) -> None:
    p = sub.add_parser("generate", help="generate text with a draft and a target model",
                       description=__doc__)
    p.add_argument("--target", default="qwen2.5-coder-1.5b",
                   help="target model: a folder, a .gguf file or a built-in name (default %(default)s)")
    p.add_argument("--draft", default="smollm2-135m",
                   help="draft model: a folder, a .gguf file or a built-in name (default %(default)s)")
    p.add_argument("--no-draft", action="store_true", help="decode with the target alone (the baseline)")
    p.add_argument("--prompt", required=True, help="the prompt text")
    p.add_argument("--chat", action="store_true", help="send the prompt as a user message (chat template)")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--k", type=int, default=defaults.NUM_SPECULATIVE_TOKENS,
                   help="draft tokens per round, at most (num_speculative_tokens)")
    p.add_argument("--method", default="draft_model")
    p.add_argument("--draft-sample-method", default="sample", help="greedy | sample")
    p.add_argument("--draft-context", default="retokenize",
                   help="retokenize (the draft reads its own tokenization) | token-map (vLLM's)")
    p.add_argument("--same-vocab", action="store_true",
                   help="the draft shares the target's vocabulary (use_heterogeneous_vocab off)")
    add_engine_options(p)
    p.add_argument("--allow-download", action="store_true", help="let transformers fetch hub ids")
    p.add_argument("--trust-remote-code", action="store_true")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of streaming")
    p.set_defaults(func=run)


def run(args) -> int:
    from anyspec.engine import SamplingParams, SpeculativeConfig, check_prompt

    config = SpeculativeConfig(method=args.method, num_speculative_tokens=args.k,
                               use_heterogeneous_vocab=not args.same_vocab,
                               draft_sample_method=args.draft_sample_method, algorithm=args.algorithm,
                               draft_context=args.draft_context, **engine_options(args))
    params = SamplingParams(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
                            max_new_tokens=args.max_new_tokens, seed=args.seed, stop=args.stop)
    prompt = [{"role": "user", "content": args.prompt}] if args.chat else args.prompt
    if not args.prompt.strip():
        raise ConfigError("the prompt is empty; pass some text with --prompt")
    check_prompt(prompt)

    from anyspec.backends.transformers import check_model_path, load_model, resolve_dtype

    resolve_dtype(args.dtype)
    draft_dtype = resolve_dtype(args.draft_dtype, draft=True)
    check_model_path(args.target, args.allow_download)
    if not args.no_draft:
        check_model_path(args.draft, args.allow_download)
    set_threads(args)

    from anyspec.engine import Engine

    load = dict(allow_download=args.allow_download, trust_remote_code=args.trust_remote_code)
    target = load_model(args.target, dtype=args.dtype, name="target", **load)
    draft = None if args.no_draft else load_model(args.draft, dtype=draft_dtype, name="draft", **load)
    engine = Engine(target, draft, config)

    def write(text: str) -> None:
        sys.stdout.write(text)
        sys.stdout.flush()

    result = engine.generate(prompt, params, on_text=None if args.json else write)
    stats = result.stats.to_dict()
    if args.json:
        print(json.dumps({"text": result.text, "token_ids": result.token_ids,
                          "stats": {key: stats[key] for key in STAT_KEYS}}))
        return 0
    print()
    s = result.stats
    hist = " ".join(f"{n}:{c}" for n, c in enumerate(s.accepted_hist))
    print(f"[{'target only' if draft is None else f'{s.algorithm} k={config.num_speculative_tokens}'}] "
          f"{s.generated} tokens in {s.total_seconds:.2f}s ({s.tokens_per_second:.2f} tok/s); "
          f"rounds {s.rounds}, drafted {s.drafted}, accepted {s.accepted} "
          f"({100 * s.acceptance_rate:.1f}%), mean accepted {s.mean_accepted_length:.2f}, "
          f"accepted-length histogram {hist}; draft {s.draft_seconds:.2f}s, target {s.target_seconds:.2f}s; "
          f"finish: {result.finish_reason}", file=sys.stderr)
    return 0
