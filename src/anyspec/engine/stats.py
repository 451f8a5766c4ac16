"""What a generation reports about itself: its rounds, what the draft proposed and the target
accepted, and the measured seconds of its passes."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

from anyspec.algorithms import ngram
from anyspec.engine.prefix import common_prefix
from anyspec.engine.proposers import Proposal, round_end


@dataclass
class Stats:
    algorithm: str = "none"  # what ran: tli, slem, or none (the target alone)
    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    generated: int = 0
    accepted_hist: list[int] = field(default_factory=list)  # rounds that accepted 0, 1, .., k tokens
    prompt_tokens: int = 0
    prompt_cached: int = 0  # prompt tokens whose KV an earlier request or another slot held (prefix_cache)
    draft_seconds: float = 0.0
    target_seconds: float = 0.0
    total_seconds: float = 0.0
    prefill_seconds: float = 0.0  # the prompt into the target's cache (a kept or copied prefix included)
    first_token_seconds: float = 0.0  # from the start to the first committed token (0: none)
    first_tokens: int = 0  # the tokens committed with it (a round can commit several)
    draft_fallbacks: int = 0
    # why each round's accepted run ended (proposers.round_end); n-gram rounds as "ngram:<cause>"
    ended_by: dict[str, int] = field(default_factory=dict)
    rejected_at: list[int] = field(default_factory=list)  # rounds whose first rejection was at 0, 1, ..
    ngram_proposed: int = 0  # target tokens proposed from the context (prompt lookup), and accepted
    ngram_accepted: int = 0
    prediction_tokens: int = 0  # the target tokens of the request's prediction (SamplingParams.prediction)
    prediction_accepted: int = 0  # tokens of continuations found in it that the target accepted (beside a
    #                               draft, which of the two proposed a token depends on measured costs)
    prediction_matched: int = 0  # its tokens the answer holds, in order (ngram.matched): the same however
    #                              the answer was proposed
    branch_rows: int = 0  # target rows verified on branches beside the chain (algorithms/tree.py)
    branch_rounds: int = 0  # rounds whose accepted tokens left the chain for a branch
    seed: int | None = None  # what a sampled answer is reproduced with (its noise: algorithms/gumbel.py)
    forced: int = 0  # accepted tokens the grammar allowed alone, proposed without the draft (grammar.py)
    grammar_seconds: float = 0.0  # masks and grammar steps

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def mean_accepted_length(self) -> float:
        """Proposed target tokens accepted per round (the bonus token not counted)."""
        return self.accepted / self.rounds if self.rounds else 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.generated / self.total_seconds if self.total_seconds else 0.0

    def to_dict(self) -> dict:
        out = asdict(self)
        out.update(acceptance_rate=self.acceptance_rate, mean_accepted_length=self.mean_accepted_length,
                   tokens_per_second=self.tokens_per_second)
        return out



def count(stats: Stats, proposal: Proposal, accepted: list[int], token: int,
          target_bytes: list[bytes]) -> None:
    """A round's proposal, the tokens it ``accepted`` and the ``token`` the target added, into the stats."""
    n = len(accepted)
    on_chain = accepted == proposal.ids[:n]
    cause = round_end(proposal, n, token, target_bytes) if on_chain else "branch"
    stats.branch_rows += len(proposal.trie[0]) - len(proposal.ids) if proposal.trie else 0
    stats.branch_rounds += not on_chain
    if proposal.source == "grammar":
        stats.forced += n
        cause = f"grammar:{cause}"
    elif proposal.source == "ngram":
        cause = f"ngram:{cause}"
    else:
        chain, found = common_prefix(accepted, proposal.ids), common_prefix(accepted, list(proposal.found))
        mine, own = proposal.drafted_part(chain if found > chain else n)  # not the continuation's beside
        stats.forced += min(n, chain) - mine if on_chain else min(n, proposal.lead)
        stats.drafted += own
        stats.accepted += mine
        stats.accepted_hist[min(mine, len(stats.accepted_hist) - 1)] += 1
    if proposal.found:
        stats.ngram_proposed += len(proposal.found)
        stats.ngram_accepted += common_prefix(accepted, list(proposal.found))
    stats.ended_by[cause] = stats.ended_by.get(cause, 0) + 1
    if not on_chain or n < len(proposal.ids):
        first = max(0, (n if on_chain else common_prefix(accepted, proposal.ids)) - proposal.lead)
        stats.rejected_at += [0] * (first + 1 - len(stats.rejected_at))
        stats.rejected_at[first] += 1


def count_commit(stats: Stats, generated: int, start: float) -> None:
    """The tokens generated after a round's commit; the first commit's latency since ``start``
    (``time.perf_counter``) and its tokens."""
    if not stats.first_tokens and generated:
        stats.first_token_seconds, stats.first_tokens = time.perf_counter() - start, generated
    stats.generated = generated


def count_end(stats: Stats, meter, target, draft, ctx, start: float, lookup=None,
              predicted: list[int] | None = None, answer: list[int] = ()) -> None:
    """A finished generation's measured seconds (``meter``: its passes), the draft context's
    fallbacks, what it took from its prediction (``lookup``: its ``engine.lookup.Lookup``) and how
    much of the prediction (``predicted``, target ids) the ``answer`` holds."""
    if lookup is not None:
        stats.prediction_accepted = lookup.prediction_accepted
    if predicted:
        stats.prediction_matched = ngram.matched(predicted, answer)
    if ctx is not None:
        stats.draft_fallbacks = ctx.fallbacks
    stats.draft_seconds = meter.seconds(draft) if draft is not None else 0.0
    stats.target_seconds = meter.seconds(target)
    stats.total_seconds = time.perf_counter() - start
