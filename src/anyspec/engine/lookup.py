"""Prompt lookup in a generation's rounds: when its continuation is proposed alone, when beside the
draft's chain, and how many tokens of it.

Edits, quotes and answers from a document copy long spans of their prompt. While the text copies,
the continuation found in the context (``ngram.Index``) is the likeliest guess and costs no draft
forward, so it is proposed alone. Where the copy ends (an edit, the end of a quote) the draft knows
better, so the draft proposes and the continuation rides beside its chain as a branch of the
round's trie (``tree.py``), where the target takes a tree and its rows pay.

Whether the text "copies" is read from the last rounds, verified or not: the continuations found
for them agreed with every token they committed, two at least (one may be chance). Otherwise the
continuation is still proposed alone where that is expected to commit more tokens a second than a
round of the draft: its tokens at their acceptance over one verify of its rows, against the draft
rounds' measured tokens and seconds, with the draft's catch-up on text it has not read (what
earlier rounds copied) counted at the draft's measured pass costs. So a draft far behind a long
copy is not brought up to date for a round that the continuation does as well.

Comparing each round's continuation with what it committed also counts the continuations'
acceptance, and a continuation is cut to the length with the most expected tokens per second of
verify at the measured costs (``adaptive_k.expected_tokens``); since accepted rows cost little, that
can be more than the draft's k.

None of this reads the target's scores for the round it shapes, so the output is exactly as
lossless as with any other proposal.
"""

from __future__ import annotations

from anyspec.algorithms import ngram
from anyspec.algorithms.adaptive_k import Acceptance, PassCosts, expected_tokens, mix
from anyspec.config import AUTO_NGRAM, AUTO_NGRAM_PROMPT
from anyspec.engine.prefix import common_prefix
from anyspec.errors import ConfigError

SPAN = 32  # the most tokens a continuation proposes in one round


def start(configured: int | None, prompt_ids: list[int], costs: PassCosts, k: int,
          draft_costs: PassCosts | None, predicted: list[int] | None = None) -> Lookup | None:
    """A request's lookup (None: none), matching suffixes of ``configured`` tokens or more; where that
    is None (the default), of ``AUTO_NGRAM`` for a prompt of ``AUTO_NGRAM_PROMPT`` tokens or more
    beside a draft (``draft_costs``), where answers copy their prompt, or with a prediction
    (``predicted``, its target ids), which says the answer copies it. On short prompts chance
    repeats cost more than they gain, and without a draft the target runs alone unless lookup or a
    prediction is asked for."""
    n = min_n(configured, len(prompt_ids), draft_costs is not None, bool(predicted))
    return Lookup(n, prompt_ids, costs, k, draft_costs, predicted) if n else None


def min_n(configured: int | None, prompt_tokens: int, drafting: bool, predicted: bool) -> int:
    """The shortest suffix lookup matches (0: no lookup), as ``start`` says."""
    if configured is not None:
        return configured
    copies = predicted or (drafting and prompt_tokens >= AUTO_NGRAM_PROMPT)
    return AUTO_NGRAM if copies else 0


def prediction_ids(prediction: str | list[int] | None, target, stats) -> list[int] | None:
    """A request's prediction (``SamplingParams.prediction``) in ``target``'s tokens, as many as its
    context holds (no answer takes more); all of them counted in ``stats``."""
    if not prediction:
        return None
    ids = prediction
    if isinstance(ids, str):
        ids = target.tokenizer.encode(ids, add_special_tokens=False)
    elif too_large := [t for t in ids if t >= target.vocab_size]:
        raise ConfigError(f"prediction names token {too_large[0]}, beyond the target's "
                          f"{target.vocab_size} ids", "prediction")
    stats.prediction_tokens = len(ids)
    return ids[:target.context_length]


class Lookup:
    def __init__(self, min_n: int, prompt_ids: list[int], costs: PassCosts, k: int,
                 draft_costs: PassCosts | None = None, predicted: list[int] | None = None):
        self.index = ngram.Index(min_n)
        self.index.extend(prompt_ids)
        self.prediction = None  # the prediction's own index, matched against the context's suffix
        if predicted:
            self.prediction = ngram.Index(min_n)
            self.prediction.extend(predicted)
        self.prompt_tokens = len(prompt_ids)
        self.from_prediction = False  # the continuation found last came from the prediction
        self.prediction_accepted = 0  # tokens of continuations from the prediction the target accepted
        self.costs = costs  # the target's passes, by their rows
        self.draft_costs = draft_costs  # the draft's, None without a draft
        self.draft_tokens: float | None = None  # a draft round's committed tokens, decayed mean
        self.draft_seconds: float | None = None  # and its seconds but for the draft's catch-up
        self.k = k  # the most tokens proposed before those costs are known
        self.acceptance = Acceptance(1.0, 3.0)  # a prior of 0.25: chance repeats are common
        self.agreed = 0  # tokens the continuations found agreed with, in a row, up to the last round
        self.found: list[int] = []

    def find(self, limit: int) -> list[int]:
        """This round's continuation, at most ``limit`` tokens, cut to the length that pays."""
        n, found = self.index.match(min(limit, SPAN))
        self.from_prediction = False
        if self.prediction is not None:
            if len(self.index.ids) == self.prompt_tokens:  # the answer starts where the prediction does
                m, predicted = ngram.MAX_N, self.prediction.ids[:min(limit, SPAN)]
            else:
                m, predicted = self.prediction.match(min(limit, SPAN), self.index.ids)
            if predicted and m >= n:  # as long a match: the prediction's word is the better guess
                found, self.from_prediction = predicted, True
        if not self.costs.known():
            found = found[:self.k]
        elif len(found) > 1:
            a = self.acceptance.rate
            found = found[:max(range(1, len(found) + 1),
                               key=lambda m: expected_tokens(a, m) / self.costs(m + 1))]
        self.found = found
        return found

    def alone_pays(self, found: list[int], behind: int) -> bool:
        """Whether ``found`` alone is expected to commit more tokens a second than a draft round
        whose draft has ``behind`` tokens to read first (False until both are measured)."""
        if self.draft_tokens is None or not self.costs.known() or not self.draft_costs.known():
            return False
        alone = expected_tokens(self.acceptance.rate, len(found)) / self.costs(len(found) + 1)
        return alone > self.draft_tokens / (self.draft_seconds + self.draft_costs(max(1, behind)))

    def drafted(self, committed: int, seconds: float, behind: int) -> None:
        """A draft round: it committed ``committed`` tokens in ``seconds``, its draft ``behind``."""
        if self.draft_costs is not None and self.draft_costs.known():
            catch_up = self.draft_costs(max(1, behind))
            self.draft_tokens = mix(self.draft_tokens, committed)
            self.draft_seconds = mix(self.draft_seconds, max(0.0, seconds - catch_up))

    def commit(self, committed: list[int]) -> None:
        """The round's committed tokens: into the index, and against the continuation found for it."""
        self.index.extend(committed)
        if self.found:
            n, seen = common_prefix(committed, self.found), min(len(committed), len(self.found))
            self.acceptance.count(n, seen)
            self.prediction_accepted += n if self.from_prediction else 0
            self.agreed = self.agreed + n if n == seen else 0
        else:
            self.agreed = 0
        self.found = []

    @property
    def copying(self) -> bool:
        return self.agreed >= 2  # one token agreeing may be chance
