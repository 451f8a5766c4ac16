"""The server's counters, exposed for Prometheus through ``prometheus_client``.

The counts live here, under a lock (the worker thread and the event loop both add to them); a
collector on the server's own registry turns them into metric families on each scrape, so the
rates (acceptance, tokens per second) are computed from the same totals. ``count_requests``, an
ASGI middleware, counts each HTTP request by its route (``route_label``) and status.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from anyspec.engine import Stats

ACCEPTANCE_BUCKETS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, float("inf"))


class Metrics:
    def __init__(self):
        self.requests: collections.Counter = collections.Counter()  # (path, status)
        self.generations: collections.Counter = collections.Counter()  # outcome
        self.tokens = 0
        self.gen_seconds = 0.0
        self.prompt_tokens = self.prompt_cached = 0
        self.prefill_seconds = 0.0
        self.drafted = self.accepted = self.rounds = 0
        self.passes = self.pass_generations = self.pass_rows = 0
        self.last_batch = 0
        self.acceptance = [0] * len(ACCEPTANCE_BUCKETS)  # requests by acceptance rate, cumulative buckets
        self.acceptance_sum = 0.0
        self.lock = threading.Lock()
        self.registry = CollectorRegistry(auto_describe=False)
        self.queue_state: Callable[[], tuple[int, int]] = lambda: (0, 0)  # (waiting, running)
        self.registry.register(self)

    def add_generation(self, outcome: str, tokens: int, seconds: float, stats: Stats | None) -> None:
        with self.lock:
            self.generations[outcome] += 1
            self.tokens += tokens
            self.gen_seconds += seconds
            if stats is not None:
                self.prompt_tokens += stats.prompt_tokens
                self.prompt_cached += stats.prompt_cached
                self.prefill_seconds += stats.prefill_seconds
            if stats is not None and stats.drafted:
                self.drafted += stats.drafted
                self.accepted += stats.accepted
                self.rounds += stats.rounds
                rate = stats.acceptance_rate
                self.acceptance_sum += rate
                for i, bound in enumerate(ACCEPTANCE_BUCKETS):
                    self.acceptance[i] += rate <= bound

    def add_pass(self, generations: int, rows: int) -> None:
        """One model pass of the worker over ``generations`` generations, ``rows`` new tokens in all."""
        with self.lock:
            self.last_batch = generations
            if rows:
                self.passes += 1
                self.pass_generations += generations
                self.pass_rows += rows

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
            "anyspec_generations", "Generations by outcome (completed, cancelled by a disconnect, "
            "queue_timeout (never started), timed_out, error).", labels=["outcome"])
        with self.lock:
            for (path, status), n in sorted(self.requests.items()):
                requests.add_metric([path, str(status)], n)
            for outcome, n in sorted(self.generations.items()):
                generations.add_metric([outcome], n)
            counters = [("generated_tokens", "Tokens generated (target vocabulary), those of cancelled "
                         "generations included.", self.tokens),
                        ("generation_seconds", "Wall time spent generating.", self.gen_seconds),
                        ("prompt_tokens", "Prompt tokens of the generations that ended (not cancelled).",
                         self.prompt_tokens),
                        ("prompt_cached_tokens", "Of those, the tokens the prefix cache held (not computed).",
                         self.prompt_cached),
                        ("prefill_seconds", "Time their prompts took to enter the target's cache.",
                         self.prefill_seconds),
                        ("draft_tokens", "Draft tokens proposed.", self.drafted),
                        ("accepted_tokens", "Draft tokens accepted by the target.", self.accepted),
                        ("model_passes", "Model passes of the worker (a draft or a target forward over "
                                         "the batch).", self.passes),
                        ("pass_generations", "Generations in each model pass, summed over passes.",
                         self.pass_generations),
                        ("pass_rows", "New tokens computed in each model pass, summed over passes.",
                         self.pass_rows)]
            gauges = [("acceptance_rate", "Accepted / proposed draft tokens, since start.",
                       self.accepted / self.drafted if self.drafted else 0.0),
                      ("mean_accepted_length", "Draft tokens accepted per speculative round, since start.",
                       self.accepted / self.rounds if self.rounds else 0.0),
                      ("tokens_per_second", "Generated tokens / generation wall time, since start.",
                       self.tokens / self.gen_seconds if self.gen_seconds else 0.0),
                      ("batch_size", "Generations in the worker's last model pass.", self.last_batch),
                      ("mean_batch_size", "Generations per model pass, since start.",
                       self.pass_generations / self.passes if self.passes else 0.0)]
            acceptance = HistogramMetricFamily(
                "anyspec_request_acceptance_rate", "Each completed speculative request's accepted / proposed "
                "draft tokens.", buckets=[(_bound(b), n) for b, n in zip(ACCEPTANCE_BUCKETS, self.acceptance,
                                                                          strict=True)],
                sum_value=self.acceptance_sum)
        gauges += [("queue_depth", "Requests waiting for a free slot.", waiting),
                   ("running", "Generations running now (at most --max-batch).", int(running))]
        return ([requests, generations, acceptance]
                + [CounterMetricFamily(f"anyspec_{name}", text, value=v) for name, text, v in counters]
                + [GaugeMetricFamily(f"anyspec_{name}", text, value=v) for name, text, v in gauges])

    def render(self) -> bytes:
        """The Prometheus text exposition format."""
        return generate_latest(self.registry)


def _bound(b: float) -> str:
    return "+Inf" if b == float("inf") else f"{b:g}"


ROUTES = ("/v1/completions", "/v1/chat/completions", "/v1/responses", "/v1/messages",
          "/v1/messages/count_tokens", "/v1/models", "/health", "/metrics", "/tokenize", "/detokenize")


def route_label(path: str) -> str:
    """A request's path as /metrics counts it: a route, its id in braces, or ``other`` (unknown
    paths, so that no client can make the labels grow)."""
    if path in ROUTES:
        return path
    parts = path.split("/")[1:]  # "/v1/models/m": ["v1", "models", "m"]
    if parts[:2] == ["v1", "responses"] and len(parts) == 3:
        return "/v1/responses/{id}"
    if parts[:2] == ["v1", "responses"] and len(parts) == 4 and parts[3] == "input_items":
        return "/v1/responses/{id}/input_items"
    if parts[:2] == ["v1", "models"] and len(parts) == 3:
        return "/v1/models/{model}"
    return "other"


def count_requests(app, metrics: Metrics):
    """ASGI middleware: count every answered HTTP request by route and status for /metrics, once its
    answer ends: a crash (a 500 from the catch-all handler) too, and an answer whose client left
    before its end (a stream begun as 200) as 499, as nginx logs it."""
    async def wrapped(scope, receive, send):
        if scope["type"] != "http":
            return await app(scope, receive, send)
        path = route_label(scope["path"])
        status, counted, gone = None, False, False

        async def watching_receive():
            nonlocal gone
            message = await receive()
            gone = gone or message["type"] == "http.disconnect"
            return message

        async def counting_send(message):
            nonlocal status, counted, gone
            if message["type"] == "http.response.start":
                status = message["status"]
            try:
                await send(message)
            except OSError:  # the client left (ASGI 2.4 servers raise it on send)
                gone = True
                raise
            if message["type"] == "http.response.body" and not message.get("more_body"):
                counted = True
                metrics.add_request(path, status)

        try:
            await app(scope, watching_receive, counting_send)
        except Exception:  # answered 500 by the outermost handler, outside this middleware
            status = 500 if status is None else status
            raise
        finally:
            if status is not None and not counted:
                metrics.add_request(path, 499 if gone else status)
    return wrapped
