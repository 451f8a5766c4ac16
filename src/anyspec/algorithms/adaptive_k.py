"""Adaptive k: how many tokens to draft this round, from measured acceptance and measured costs.

Speculation pays only when the tokens a round commits outweigh what the round costs. With a
per-token acceptance rate a (each draft token accepted with probability a, independently), a round
that drafts k tokens commits on average

    E(k) = 1 + a + a^2 + ... + a^k = (1 - a^(k+1)) / (1 - a)     (the bonus token included)

and costs ``k * draft_forward + verify(k + 1)`` seconds. ``k = 0`` is the target alone: one token
for one single-token forward. Each round picks the k in 0..k_max with the most tokens per second,
using running estimates of a and of both costs as measured on this machine. When k = 0 wins, the
draft still gets one round every ``explore_every`` rounds so that the estimate of a can recover
(prose after code, say). Each generation has one ``BatchSchedule``; the costs it reads are those of
its batch's passes as ``engine.batch.Batch.step`` measures them, a generation alone being a batch of
one. Even at a fixed k, a draft whose acceptance falls below ``FLOOR`` backs off to k = 0, so that
a draft that gets nothing accepted (text it cannot predict) does not leave the generation slower
than the target alone.

The choice of k never depends on the current round's draws, so the output is exactly as lossless
as with a fixed k: greedy output is identical and sampled tokens follow the target's distribution.

Within a round, ``draft_confidence`` ends the draft early: after a token to which the draft itself
gives a probability below the threshold (``confidence``), the tokens after it would rarely be
accepted, and each one still costs a draft forward and a row of the verify pass. The stop depends
only on the draft's own numbers (and its own random draws when sampling), never on the target's,
so it is as lossless as any other choice of k.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from anyspec.algorithms.tli import constrain

DECAY = 0.9  # per round: older rounds count less (acceptance drifts with the text)
OPTIMISTIC = 0.9  # the acceptance a generation of a batch is given when it considers exploring
FLOOR = 0.1  # an acceptance below this: the draft's tokens are not worth proposing (k = 0, exploring)


def confidence(draft_logits: torch.Tensor, token: int, q: torch.Tensor | None = None,
               intersection_mask: torch.Tensor | None = None) -> float:
    """The draft's probability of the token it proposed: ``q[token]`` when it sampled from q,
    else the softmax of its logits (confined to ``intersection_mask`` for TLI)."""
    if q is not None:
        return float(q[token])
    return float(torch.softmax(constrain(draft_logits, intersection_mask).float(), dim=-1)[token])


def expected_tokens(a: float, k: int) -> float:
    """Tokens one round commits on average when it drafts k tokens accepted with probability a."""
    if a >= 1.0:
        return k + 1.0
    return (1.0 - a ** (k + 1)) / (1.0 - a)


@dataclass
class Acceptance:
    """Decayed counts of a generation's draft tokens (a prior of one accept and one reject: a = 0.5);
    the estimate of a is accepted / (accepted + rejected)."""

    accepted: float = 1.0
    rejected: float = 1.0

    @property
    def rate(self) -> float:
        return self.accepted / (self.accepted + self.rejected)

    def count(self, accepted: int, proposed: int) -> None:
        """A round: ``accepted`` accepted tokens, and one rejection unless all ``proposed`` were."""
        self.accepted = DECAY * self.accepted + accepted
        self.rejected = DECAY * self.rejected + (1 if accepted < proposed else 0)


def mix(old: float | None, new: float, weight: float = 0.3) -> float:
    return new if old is None else (1 - weight) * old + weight * new


class PassCosts:
    """Seconds of one pass by the rows it computed: a decayed mean per row count, linear in between
    and beyond the measured counts (flat while only one is measured)."""

    def __init__(self):
        self.mean: dict[int, float] = {}

    def record(self, rows: int, seconds: float) -> None:
        self.mean[rows] = mix(self.mean.get(rows), seconds)

    def known(self) -> bool:
        return len(self.mean) >= 2

    def __contains__(self, rows: int) -> bool:
        return rows in self.mean

    def __call__(self, rows: int) -> float:
        if rows in self.mean:
            return self.mean[rows]
        known = sorted(self.mean)
        if len(known) == 1:
            return self.mean[known[0]]
        lo = [m for m in known if m < rows][-2:]
        hi = [m for m in known if m > rows][:2]
        a, b = (lo[-1], hi[0]) if lo and hi else tuple(lo or hi)
        slope = max(0.0, (self.mean[b] - self.mean[a]) / (b - a))
        return max(1e-6, self.mean[a] + slope * (rows - a))


def round_seconds(ks: list[int], target_seconds, draft_seconds, behind: list[int] | None = None) -> float:
    """A round of a batch in which generation i drafts ks[i] tokens: draft pass p carries the
    generations that draft more than p tokens, the first one also the ``behind[i]`` tokens each
    draft has yet to read; then one target pass verifies every k_i + 1 rows."""
    behind = behind or [1] * len(ks)
    first = sum(max(1, b) for k, b in zip(ks, behind, strict=True) if k)
    passes = range(max(ks, default=0))
    drafts = sum(draft_seconds(first if p == 0 else sum(k > p for k in ks)) for p in passes)
    return drafts + target_seconds(sum(k + 1 for k in ks))


def batch_ks(k_max: int, acceptances: list[float], target_seconds, draft_seconds,
             behind: list[int] | None = None) -> list[int]:
    """How many tokens each generation of a batch drafts this round, given each one's acceptance
    (and how far its draft is behind): the allocation with the most expected tokens per second,
    grown one draft token at a time where it adds most, and checked against every k shared by all.
    For one generation that is the best k in 0..k_max (the smallest of equals).

    On a CPU a pass costs the one read of the weights until its rows' compute exceeds it; past that,
    each row costs compute. So a few draft tokens ride almost free, and they pay most where the
    draft is accepted most; with many generations in the pass, none may pay."""
    def rate(ks):
        tokens = sum(expected_tokens(a, k) for a, k in zip(acceptances, ks, strict=True))
        return tokens / round_seconds(ks, target_seconds, draft_seconds, behind)

    n = len(acceptances)
    ks, best = [0] * n, rate([0] * n)
    while True:
        trials = [(rate(ks[:i] + [ks[i] + 1] + ks[i + 1:]), i) for i in range(n) if ks[i] < k_max]
        if not trials or max(trials)[0] <= best:
            break
        best, i = max(trials)
        ks[i] += 1
    for k in range(1, k_max + 1):
        if rate([k] * n) > best:
            ks, best = [k] * n, rate([k] * n)
    return ks


@dataclass(eq=False)  # peers are told apart by identity, not by equal counts
class BatchSchedule:
    """How many tokens one generation drafts each round, from its acceptance and the measured costs
    of its batch's passes (``Batch.step`` records them; a generation alone is a batch of one).

    In a batch (``shared``), ``choose`` gives its share of ``batch_ks`` for the generations now in
    the batch, from each one's own acceptance; one left at k = 0 drafts one token every
    ``explore_every`` rounds, so that its acceptance stays current, unless even an acceptance of
    ``OPTIMISTIC`` would get it no draft tokens in this batch. Alone, with ``adaptive``, it measures
    a full round, then a round of the target alone, then takes the best k in 0..k_max (``batch_ks``
    for one), exploring likewise. Otherwise it keeps ``k_max`` (and the draft's confidence stop),
    until the acceptance falls below ``FLOOR``: a draft that gets next to nothing accepted costs its
    passes for nothing, so it then drafts one token every ``explore_every`` rounds only."""

    k_max: int
    peers: object  # () -> the schedules of the generations in the batch now, this one among them
    target: PassCosts
    draft: PassCosts
    acceptance: Acceptance = field(default_factory=Acceptance)
    shared: bool = True
    adaptive: bool = False
    explore_every: int = 8
    idle_rounds: int = 0
    behind: int = 1  # tokens its draft has yet to read (as of its last choose)

    def choose(self, behind: int = 1) -> int:
        self.behind = behind
        peers = self.peers()
        if self.shared and len(peers) >= 2 and self in peers:
            if self.target.known() and self.draft.known():
                return self._share(peers)
        elif self.adaptive:
            return self._best_alone()
        return self._explore(0 if self.acceptance.rate < FLOOR else self.k_max)

    def _share(self, peers: list[BatchSchedule]) -> int:
        me, acceptances = peers.index(self), [p.acceptance.rate for p in peers]
        behind = [p.behind for p in peers]
        k = batch_ks(self.k_max, acceptances, self.target, self.draft, behind)[me]
        if self._explore(k) > k:
            acceptances[me] = max(acceptances[me], OPTIMISTIC)
            if batch_ks(self.k_max, acceptances, self.target, self.draft, behind)[me]:
                return 1  # worth a look only if a draft accepted that often would get tokens here
        return k

    def _best_alone(self) -> int:
        if 1 not in self.draft or self.k_max + 1 not in self.target:
            return self.k_max  # measure a full round first,
        if 1 not in self.target:
            return 0  # then the target alone
        return self._explore(batch_ks(self.k_max, [self.acceptance.rate], self.target, self.draft,
                                      [self.behind])[0])

    def _explore(self, k: int) -> int:
        """``k``, but 1 where it is the ``explore_every``-th round in a row at k = 0."""
        self.idle_rounds = self.idle_rounds + 1 if k == 0 else 0
        if self.idle_rounds >= self.explore_every:
            self.idle_rounds = 0
            return 1
        return k

    def update(self, drafted: int, accepted: int, proposed: int | None = None) -> None:
        """Record a round's acceptance: ``drafted`` draft tokens, ``proposed`` target tokens
        (default: ``drafted``) verified, ``accepted`` of them accepted. Its passes' costs are the
        batch's (``Batch.step``)."""
        proposed = drafted if proposed is None else proposed
        if proposed:
            self.acceptance.count(accepted, proposed)
