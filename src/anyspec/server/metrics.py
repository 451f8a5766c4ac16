"""The server's counters, exposed for Prometheus through ``prometheus_client``.

The counts live here, under a lock (the worker thread and the event loop both add to them); a
collector on the server's own registry turns them into metric families on each scrape, so the
rates (acceptance, tokens per second) are computed from the same totals.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from anyspec.engine import Stats


class Metrics:
    def __init__(self):
        self.requests: collections.Counter = collections.Counter()  # (path, status)
        self.generations: collections.Counter = collections.Counter()  # outcome
        self.tokens = 0
        self.gen_seconds = 0.0
        self.drafted = self.accepted = self.rounds = 0
        self.lock = threading.Lock()
        self.registry = CollectorRegistry(auto_describe=False)
        self.queue_state: Callable[[], tuple[int, bool]] = lambda: (0, False)  # (waiting, running)
        self.registry.register(self)

    def add_generation(self, outcome: str, tokens: int, seconds: float, stats: Stats | None) -> None:
        with self.lock:
            self.generations[outcome] += 1
            self.tokens += tokens
            self.gen_seconds += seconds
            if stats is not None and stats.drafted:
                self.drafted += stats.drafted
                self.accepted += stats.accepted
                self.rounds += stats.rounds

    def add_request(self, path: str, status: int) -> None:
        with self.lock:
            self.requests[(path, status)] += 1

    def mean_generation_seconds(self) -> float:
        with self.lock:
            done = sum(self.generations.values())
            return self.gen_seconds / done if done else 1.0

    def collect(self) -> list:
        waiting, running = self.queue_state()
        requests = CounterMetricFamily("anyspec_requests", "HTTP requests answered, by path and status.",
                                       labels=["path", "status"])
        generations = CounterMetricFamily(
            "anyspec_generations", "Generations by outcome (completed, cancelled by a disconnect, timed_out, "
            "error).", labels=["outcome"])
        with self.lock:
            for (path, status), n in sorted(self.requests.items()):
                requests.add_metric([path, str(status)], n)
            for outcome, n in sorted(self.generations.items()):
                generations.add_metric([outcome], n)
            counters = [("generated_tokens", "Tokens generated (target vocabulary).", self.tokens),
                        ("generation_seconds", "Wall time spent generating.", self.gen_seconds),
                        ("draft_tokens", "Draft tokens proposed.", self.drafted),
                        ("accepted_tokens", "Draft tokens accepted by the target.", self.accepted)]
            gauges = [("acceptance_rate", "Accepted / proposed draft tokens, since start.",
                       self.accepted / self.drafted if self.drafted else 0.0),
                      ("mean_accepted_length", "Draft tokens accepted per speculative round, since start.",
                       self.accepted / self.rounds if self.rounds else 0.0),
                      ("tokens_per_second", "Generated tokens / generation wall time, since start.",
                       self.tokens / self.gen_seconds if self.gen_seconds else 0.0)]
        gauges += [("queue_depth", "Requests waiting for the worker.", waiting),
                   ("running", "Generations running now (0 or 1).", int(running))]
        return ([requests, generations]
                + [CounterMetricFamily(f"anyspec_{name}", text, value=v) for name, text, v in counters]
                + [GaugeMetricFamily(f"anyspec_{name}", text, value=v) for name, text, v in gauges])

    def render(self) -> bytes:
        """The Prometheus text exposition format."""
        return generate_latest(self.registry)
