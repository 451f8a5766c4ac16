"""The generated text, token by token: an EOS, ``max_new_tokens``, a stop string or one of
``stop_token_ids`` (kept in the answer, as vLLM keeps it) ends it; a stop string from the
``min_tokens``-th token on (the EOS and stop tokens wait for it in the logits, ``penalties.py``).

Tokens are bytes, and a token may end inside a UTF-8 character, so the bytes go through an
incremental decoder and text streams only in whole characters. While stop strings are set, the last
``len(longest) - 1`` characters are held back, since they may begin one; a stop string is cut off.
With logprobs asked for, each committed token's entry is kept, and each streamed ``Piece`` carries
the entries of the tokens committed since the piece before (a held-back token's goes with a later
piece; what no piece carried is in ``logprobs`` at the end).
"""

from __future__ import annotations

import codecs
from dataclasses import dataclass

import torch

from anyspec.algorithms.sampling import TokenLogprob, token_logprobs
from anyspec.config import SamplingParams
from anyspec.engine.stats import Stats


class Piece(str):
    """Streamed text, with ``logprobs``: the entries of the tokens committed since the piece before."""
    logprobs: list[TokenLogprob]


class Output:
    def __init__(self, token_bytes: list[bytes], eos_ids: set[int], params: SamplingParams):
        self.token_bytes, self.eos_ids = token_bytes, eos_ids
        self.stops, self.max_new_tokens = params.stop, params.max_new_tokens
        self.stop_ids = set(params.stop_token_ids)
        self.include_stop = params.include_stop_str_in_output
        self.min_tokens = params.min_tokens  # stop strings count from this many tokens on
        self.ids: list[int] = []
        self.text = ""
        # "stop" (EOS or a stop string), "length" or "abort"; max_new_tokens 0: nothing to generate
        self.finish: str | None = "length" if params.max_new_tokens == 0 else None
        self.stopped_by: str | int | None = None  # the stop string or stop token id that ended it
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._hold = max((len(s) for s in self.stops), default=1) - 1
        self._streamed = 0
        self.top = params.logprobs  # how many likeliest tokens each entry lists (None: no logprobs)
        self.logprobs: list[TokenLogprob] | None = [] if params.logprobs is not None else None
        self._given = 0  # entries a piece has carried

    def commit(self, tokens: list[int], rows: torch.Tensor | None = None) -> list[int]:
        """Append ``tokens`` up to the one that ends the generation; returns those appended, whose
        logprobs (with logprobs asked for) come from ``rows``, the logits that chose them."""
        committed = self._commit(tokens)
        if self.logprobs is not None:
            self.logprobs += token_logprobs(rows[:len(committed)], committed, self.top)
        return committed

    def _commit(self, tokens: list[int]) -> list[int]:
        committed = []
        for token in tokens:
            if token in self.eos_ids:
                self.finish = "stop"
                break
            committed.append(token)
            self.ids.append(token)
            if self._add(self._decoder.decode(self.token_bytes[token])):
                break
            if token in self.stop_ids:
                self.finish, self.stopped_by = "stop", token
                break
            if len(self.ids) >= self.max_new_tokens:
                self.finish = "length"
                break
        if self.finish is not None:
            if not isinstance(self.stopped_by, str):  # a stop string cut the text where it begins
                self._add(self._decoder.decode(b"", final=True))
            self._hold = 0
        return committed

    def _add(self, text: str) -> bool:
        """Append ``text``; whether a stop string ends in it, which ends the generation there (an
        unfinished character's U+FFFD, flushed at the end, may end one too)."""
        size = len(self.text)
        self.text += text
        found = find_stop(self.text, self.stops, size) if len(self.ids) >= self.min_tokens else None
        if found is None:
            return False
        cut = found[0] + (len(found[1]) if self.include_stop else 0)
        self.text, self.finish, self.stopped_by = self.text[:cut], "stop", found[1]
        return True

    def ended(self, stop=None) -> bool:
        """Whether the generation has ended; where ``stop`` (a ``threading.Event``) is set, it ends
        here (``"abort"``), and the text held back for stop strings may be given out."""
        if self.finish is None and stop is not None and stop.is_set():
            self.finish, self._hold = "abort", 0
            self._add(self._decoder.decode(b"", final=True))
        return self.finish is not None

    def ready(self) -> str:
        """The text that may be streamed now, not yet given out (a ``Piece`` with logprobs)."""
        end = len(self.text) - self._hold
        if end <= self._streamed:
            return ""
        piece, self._streamed = self.text[self._streamed:end], end
        if self.logprobs is None:
            return piece
        piece = Piece(piece)
        piece.logprobs, self._given = self.logprobs[self._given:], len(self.logprobs)
        return piece


def find_stop(text: str, stops: list[str], before: int) -> tuple[int, str] | None:
    """Index of the earliest stop string that ends after position ``before``, and that string (the
    first given of those there), or None."""
    best = None
    for s in stops:
        i = text.find(s, max(0, before - len(s) + 1))
        if i >= 0 and (best is None or i < best[0]):
            best = (i, s)
    return best


@dataclass
class GenerationResult:
    """One answer: its text and target token ids, why it ended, and its statistics (``Stats``:
    rounds, proposed and accepted tokens, seconds, the seed a sampled answer used)."""

    text: str
    token_ids: list[int]  # target ids of the generated tokens (an EOS that ended it not included)
    finish_reason: str  # "stop" (EOS or a stop string), "length", or "abort" (``stop`` set)
    stats: Stats
    logprobs: list[TokenLogprob] | None = None  # one per token id, with SamplingParams.logprobs
    # with SamplingParams.prompt_logprobs: one per prompt token, the first None (nothing before it)
    prompt_logprobs: list[TokenLogprob | None] | None = None
    stop_reason: str | int | None = None  # vLLM's: the stop string or stop token id that ended it
