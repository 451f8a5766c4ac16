"""``anyspec chat``: a conversation in the terminal, each answer streamed as it is verified.

Each line read is a user message; the answer goes to stdout, and a line of statistics to stderr
(tokens/s, acceptance, how much of the conversation's prompt the cache already held). Every turn
resends the whole conversation through the chat template, and the target's cache keeps the
prefix it shares with the turn before, so only the new messages are prefilled. ``/reset`` starts
the conversation over, ``/exit`` or end of input (Ctrl-D) ends it; any other ``/word`` alone on its
line is not sent but answered with the commands. Ctrl-C while an answer streams
stops it there and keeps what was shown as the assistant's turn; at the prompt it only says how to
leave. Lines from a pipe are read the same way, one message each, without the prompt sign. An
answer gets at most the new tokens the target's context still holds after the conversation
(``--max-new-tokens`` or fewer; its statistics then say ``context full`` where that ended it); a
conversation that fills the context is said in one line, and ``/reset`` starts over.
"""

from __future__ import annotations

import dataclasses
import io
import signal
import sys
import threading

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
        check_prompt_text(args.system, "--system")
    start = [{"role": "system", "content": args.system}] if args.system else []
    plan = pair_plan(args)  # any --max-new-tokens: each answer asks for the room left at most (fitted)
    pair = load_pair(plan)
    engine = Engine(pair.target, pair.draft, config)
    messages, interactive = list(start), sys.stdin.isatty()
    if isinstance(sys.stdin, io.TextIOWrapper):  # bytes that are not UTF-8 reach check_prompt_text
        sys.stdin.reconfigure(errors="surrogateescape")

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
        if command.startswith("/") and " " not in command and command not in ("/exit", "/quit", "/reset"):
            print(f"anyspec chat: {command} is not a command; /reset starts a new conversation, /exit "
                  "(or Ctrl-D) ends it", file=sys.stderr)
            continue
        try:
            check_prompt_text(line)
        except ConfigError as exc:  # bytes that are not UTF-8: this line alone is refused
            print(f"anyspec chat: {exc}; the line was not sent", file=sys.stderr)
            continue
        try:
            asked = [*messages, {"role": "user", "content": line}]
            turn, encoded = fitted(engine, asked, params)
            text, stats, finish = answer(engine, asked, turn, encoded, write)
        except ConfigError as exc:  # the conversation outgrew the context: say so, keep the session
            print(f"anyspec chat: {exc}; /reset starts a new conversation", file=sys.stderr)
            continue
        print()
        messages += [{"role": "user", "content": line}, {"role": "assistant", "content": text}]
        full = finish == "length" and turn.max_new_tokens < params.max_new_tokens
        stopped = "stopped; " if finish == "abort" else "context full; " if full else ""
        lookup = (f", lookup accepted {stats.ngram_accepted}/{stats.ngram_proposed}"
                  if stats.ngram_proposed else "")
        print(f"[{stopped}{stats.generated} token{'s' * (stats.generated != 1)}, "
              f"{stats.tokens_per_second:.1f} tok/s, acceptance {stats.acceptance_rate:.0%}{lookup}, prompt "
              f"{stats.prompt_tokens} tokens ({stats.prompt_cached} cached), first token "
              f"{stats.first_token_seconds:.2f} s]", file=sys.stderr)
    return 0


def fitted(engine, messages: list[dict], params):
    """``params`` with no more new tokens than the target's context holds after ``messages`` (as the
    server does for a request's default ``max_tokens``), and the messages' target ids and text, which
    the engine then reads without encoding them again; a ``ConfigError`` where the context holds
    none."""
    from anyspec.engine.prompt import encode_prompt

    ids, text, _ = encode_prompt(engine.target.tokenizer, messages)
    context = engine.target.context_length
    if context is None:
        return params, (ids, text)
    if len(ids) >= context:
        raise ConfigError(f"the conversation has {len(ids)} tokens, no room left in the target's context of "
                          f"{context} tokens")
    room = min(params.max_new_tokens, context - len(ids))
    return dataclasses.replace(params, max_new_tokens=room), (ids, text)


def answer(engine, messages: list[dict], params, encoded: tuple[list[int], str], write):
    """The answer to ``messages`` (``encoded``: their target ids and text, ``fitted``'s), streamed
    through ``write``, its statistics and finish reason; Ctrl-C (SIGINT) ends it after its current
    round (``"abort"``), so the caches hold committed tokens only and the next turn reuses them."""
    stop = threading.Event()
    before = signal.signal(signal.SIGINT, lambda *_: stop.set())
    try:
        result = engine.generate(messages, params, on_text=write, stop=stop, encoded=encoded)
    finally:
        signal.signal(signal.SIGINT, before)
    return result.text, result.stats, result.finish_reason


def read_line(sign: str) -> str | None:
    """The next line of input (None at its end); Ctrl-C at a terminal's prompt says how to leave."""
    while True:
        try:
            return input(sign)
        except EOFError:
            return None
        except KeyboardInterrupt:
            if not sign:
                raise
            print("\n(Ctrl-D or /exit ends the conversation)", file=sys.stderr)
