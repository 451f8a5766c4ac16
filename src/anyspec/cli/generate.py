"""``anyspec generate``: speculative decoding from the command line.

Everything that cannot work (settings out of range, a missing model, an empty prompt) fails with
one line before any model is loaded. Text streams to stdout, statistics go to stderr; ``--json``
prints exactly one object instead.
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace

from anyspec.cli.options import (
    add_engine_options,
    add_model_options,
    add_sampling_options,
    check_prompt_text,
    pair_plan,
    read_text,
    sampling_params,
    speculative_config,
)
from anyspec.config import check_with_grammar
from anyspec.errors import ConfigError

STAT_KEYS = ("algorithm", "rounds", "drafted", "accepted", "acceptance_rate", "mean_accepted_length",
             "tokens_per_second", "draft_seconds", "target_seconds", "ended_by", "rejected_at",
             "ngram_proposed", "ngram_accepted")
GRAMMAR_STAT_KEYS = ("forced", "grammar_seconds")  # with --json-schema, --regex or --choice
PREDICTION_STAT_KEYS = ("prediction_tokens", "prediction_matched", "prediction_accepted")  # --prediction-file


def add_parser(sub) -> None:
    p = sub.add_parser("generate", help="generate text with a draft and a target model",
                       description=__doc__)
    add_model_options(p)
    given = p.add_mutually_exclusive_group(required=True)
    given.add_argument("--prompt", help="the prompt text")
    given.add_argument("--prompt-file", metavar="FILE",
                       help="read the prompt from this UTF-8 text file (- for standard input)")
    p.add_argument("--chat", action="store_true", help="send the prompt as a user message (chat template)")
    p.add_argument("--prediction-file", metavar="FILE",
                   help="text the answer likely repeats, as the file an edit rewrites (OpenAI's Predicted "
                        "Outputs): prompt lookup proposes from it too; the answer is the same without it "
                        "(- for standard input)")
    add_sampling_options(p, seed_shown="reported with --json")
    p.add_argument("--logprobs", type=int, default=None, metavar="N",
                   help="with --json: each token's logprob and its N likeliest alternatives (0-20)")
    p.add_argument("--json-schema", metavar="FILE", default=None,
                   help="constrain the answer to this JSON Schema (a .json file); needs llguidance")
    p.add_argument("--regex", default=None, help="constrain the answer to match this regular expression")
    p.add_argument("--choice", action="append", default=None,
                   help="constrain the answer to one of these strings (repeatable)")
    p.add_argument("--grammar-file", metavar="FILE", default=None,
                   help="constrain the answer to this grammar (GBNF, as llama.cpp's, or llguidance's Lark)")
    add_engine_options(p)
    p.add_argument("--allow-download", action="store_true", help="let transformers fetch hub ids")
    p.add_argument("--trust-remote-code", action="store_true",
                   help="let transformers run the Python code a model folder or hub repository ships (a "
                        "model of its own architecture) when it loads the target or the draft; only for "
                        "models you trust (default: off)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of streaming")
    p.set_defaults(func=run)


def read_file(path: str, flag: str, schema: bool):
    """The JSON Schema (``schema``) or the text in ``path`` (``-``: standard input)."""
    text = read_text(path, flag)
    if not schema:
        return text
    try:
        return json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"{flag}: {path} is not valid JSON: {exc}") from None


def prompt_text(args) -> str:
    """The prompt, from ``--prompt`` or the file ``--prompt-file`` names, checked."""
    if args.prompt is not None:
        check_prompt_text(args.prompt)
        return args.prompt
    text = read_text(args.prompt_file, "--prompt-file")
    if not text.strip():
        raise ConfigError(f"--prompt-file: {args.prompt_file} holds no text")
    return text


def read_guide(args) -> tuple[str, object, str] | None:
    """What the answer is held to, ``(kind, value, flag)`` (``engine.grammar_text.GUIDES``), checked before
    any model loads; None for free text."""
    from anyspec.engine.grammar_text import GUIDES, check_grammar, guide_grammar

    asked = [(kind, value, flag) for kind, value, flag in (
        ("json", args.json_schema, "--json-schema"), ("regex", args.regex, "--regex"),
        ("choice", args.choice, "--choice"), ("grammar", args.grammar_file, "--grammar-file"))
        if value is not None]
    if len(asked) > 1:
        raise ConfigError(f"{asked[0][2]} and {asked[1][2]} cannot be used together")
    if not asked:
        return None
    kind, value, flag = asked[0]
    if kind == "choice" and not all(value):
        raise ConfigError("--choice takes a non-empty string, one of the answers allowed (repeat it for "
                          "each); one is empty")
    if kind in ("json", "grammar"):
        value = read_file(value, flag, kind == "json")
    check_grammar(guide_grammar(kind, value, flag), flag, GUIDES[kind])
    return kind, value, flag


def run(args) -> int:
    from anyspec.engine import Engine
    from anyspec.pair import check_new_tokens, load_pair

    config = speculative_config(args)
    params = sampling_params(args, logprobs=args.logprobs)
    if args.logprobs is not None and not args.json:
        raise ConfigError("--logprobs needs --json, which prints them")
    if args.prediction_file == "-" == args.prompt_file:
        raise ConfigError("--prompt-file and --prediction-file cannot both read standard input")
    text = prompt_text(args)
    if args.prediction_file is not None:
        params = replace(params, prediction=read_text(args.prediction_file, "--prediction-file"))
    if args.chat_template is not None and not args.chat:
        raise ConfigError("--chat-template needs --chat (without it the prompt is plain text)")
    guide = read_guide(args)
    if guide is not None:
        check_with_grammar(params)
    prompt = [{"role": "user", "content": text}] if args.chat else text
    plan = pair_plan(args)
    check_new_tokens(plan, params.max_new_tokens)
    pair = load_pair(plan)
    engine = Engine(pair.target, pair.draft, config)
    if guide is not None:
        from anyspec.engine.grammar import Grammars

        grammars = Grammars(pair.target.tokenizer, pair.target.vocab_size, engine.eos_ids)
        params = replace(params, grammar=grammars.guide(*guide))

    def write(text: str) -> None:
        sys.stdout.write(text)
        sys.stdout.flush()

    result = engine.generate(prompt, params, on_text=None if args.json else write)
    stats = result.stats.to_dict()
    if args.json:
        keys = STAT_KEYS + (GRAMMAR_STAT_KEYS if guide is not None else ()) + (
            PREDICTION_STAT_KEYS if params.prediction is not None else ())
        extra = {"seed": stats["seed"]} if stats["seed"] is not None else {}  # reproduces a sampled answer
        if result.logprobs is not None:
            extra["logprobs"] = [{"token": e.token, "logprob": e.logprob, "top": e.top}
                                 for e in result.logprobs]
        print(json.dumps({"text": result.text, "token_ids": result.token_ids,
                          "finish_reason": result.finish_reason, "stop_reason": result.stop_reason, **extra,
                          "stats": {key: stats[key] for key in keys}}))
        return 0
    print()
    print(stats_line(result, config, params.prediction is not None), file=sys.stderr)
    return 0


def stats_line(result, config, predicted: bool) -> str:
    """The line after an answer: its speed, rounds, what the draft and prompt lookup proposed and
    what was accepted (the draft's part only where a draft ran)."""
    s = result.stats
    hist = " ".join(f"{n}:{c}" for n, c in enumerate(s.accepted_hist))
    ended = " ".join(f"{cause}:{n}" for cause, n in sorted(s.ended_by.items()))
    lookup = f", prompt lookup accepted {s.ngram_accepted}/{s.ngram_proposed}" if s.ngram_proposed else ""
    if predicted:
        lookup += (f", the answer holds {s.prediction_matched} of the prediction's {s.prediction_tokens} "
                   f"tokens ({s.prediction_accepted} proposed from it and accepted)")
    k = f"k{'<=' if config.adaptive_k else '='}{config.num_speculative_tokens}"
    how = "target only" if s.algorithm == "none" else f"{s.algorithm} {k}"
    drafts = (f", drafted {s.drafted}, accepted {s.accepted} ({100 * s.acceptance_rate:.1f}%), mean accepted "
              f"{s.mean_accepted_length:.2f}, accepted-length histogram {hist}") if s.drafted else ""
    return (f"[{how}] {s.generated} token{'s' * (s.generated != 1)} in {s.total_seconds:.2f}s "
            f"({s.tokens_per_second:.2f} tok/s); rounds {s.rounds}{drafts}; rounds ended by {ended or '-'}"
            f"{lookup}; draft {s.draft_seconds:.2f}s, target {s.target_seconds:.2f}s; "
            f"finish: {result.finish_reason}")
