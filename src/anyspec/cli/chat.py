"""``anyspec chat``: a conversation in the terminal, each answer streamed as it is verified.

Each line read is a user message; the answer goes to stdout, and a line of statistics to stderr
(tokens/s, acceptance, how much of the conversation's prompt the cache already held). Every turn
resends the whole conversation through the chat template, and the target's cache keeps the
prefix it shares with the turn before, so only the new messages are prefilled. ``/reset`` starts
the conversation over, ``/exit`` or end of input (Ctrl-D) ends it. Lines from a pipe are read the
same way, one message each, without the prompt sign.
"""

from __future__ import annotations

import sys

from anyspec.cli.options import (
    add_engine_options,
    add_model_options,
    add_sampling_options,
    check_prompt_text,
    pair_plan,
    sampling_params,
    speculative_config,
)
from anyspec.errors import ConfigError


def add_parser(sub) -> None:
    p = sub.add_parser("chat", help="a conversation in the terminal (chat template, cache kept across turns)",
                       description=__doc__)
    add_model_options(p)
    p.add_argument("--system", default=None, help="a system message to begin the conversation with")
    add_sampling_options(p, max_new_tokens=512)
    add_engine_options(p)
    p.set_defaults(func=run)


def run(args) -> int:
    from anyspec.engine import Engine
    from anyspec.pair import load_pair

    config = speculative_config(args)
    params = sampling_params(args)
    if args.system is not None:
        check_prompt_text(args.system)
    start = [{"role": "system", "content": args.system}] if args.system else []
    pair = load_pair(pair_plan(args))
    engine = Engine(pair.target, pair.draft, config)
    messages, interactive = list(start), sys.stdin.isatty()

    def write(text: str) -> None:
        sys.stdout.write(text)
        sys.stdout.flush()

    while (line := read_line("> " if interactive else "")) is not None:
        command = line.strip()
        if command in ("/exit", "/quit"):
            break
        if command == "/reset":
            messages = list(start)
            print("(a new conversation)", file=sys.stderr)
            continue
        if not command:
            continue
        check_prompt_text(line)
        try:
            result = engine.generate([*messages, {"role": "user", "content": line}], params, on_text=write)
        except ConfigError as exc:  # the conversation outgrew the context: say so, keep the session
            print(f"anyspec chat: {exc}; /reset starts a new conversation", file=sys.stderr)
            continue
        print()
        messages += [{"role": "user", "content": line}, {"role": "assistant", "content": result.text}]
        s = result.stats
        print(f"[{s.generated} tokens, {s.tokens_per_second:.1f} tok/s, acceptance {s.acceptance_rate:.0%}, "
              f"prompt {s.prompt_tokens} tokens ({s.prompt_cached} cached), first token "
              f"{s.first_token_seconds:.2f} s]", file=sys.stderr)
    return 0


def read_line(sign: str) -> str | None:
    """The next line of input (None at its end)."""
    try:
        return input(sign)
    except EOFError:
        return None
    except UnicodeDecodeError:
        raise ConfigError("a line of input is not valid UTF-8") from None
