"""``GET /metrics``: Prometheus metrics of ``formtax serve`` (prometheus_client, one registry per app).

vLLM's names where they mean the same, so the dashboards and alerts operators have for vLLM read formtax too:
``vllm:num_requests_running`` / ``vllm:num_requests_waiting`` (gauges), ``vllm:prompt_tokens_total`` /
``vllm:generation_tokens_total``, ``vllm:request_success_total{finished_reason}``, and the histograms
``vllm:time_to_first_token_seconds``, ``vllm:inter_token_latency_seconds`` and ``vllm:e2e_request_latency_seconds``
(every series carries ``model_name``). Token times are taken where the row emits them (single-pass strategies
on step-wise backends); a multi-call strategy has its end-to-end latency only.

formtax's own, per strategy: ``formtax:answers_total{outcome="parsed"|"failed"}`` (a constrained answer that the
oracle refused, or a free answer with no parse), ``formtax:closing_interventions_total`` (requests where closing
mode changed a token) and ``formtax:closing_changed_tokens_total``, ``formtax:schema_approximations_total``,
``formtax:formats_unchecked_total``, and ``formtax:queue_refusals_total`` (the 429s).

Like vLLM's, the endpoint is open (no API key): scrapers send none.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from formtax.strategies.base import Result

LATENCY_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                   40.0, 80.0, 160.0, 640.0)
"""Seconds; vLLM's time-to-first-token buckets, extended to a CPU's slower end."""


class ServerMetrics:
    """The server's metrics (module docstring); ``render()`` is the scrape's text."""

    def __init__(self, model_name: str) -> None:
        self.model = model_name
        self.registry = r = CollectorRegistry()
        m = ["model_name"]
        self.running = Gauge("vllm:num_requests_running", "Requests decoding now.", m, registry=r)
        self.waiting = Gauge("vllm:num_requests_waiting", "Requests waiting in the queue.", m, registry=r)
        self.prompt_tokens = Counter("vllm:prompt_tokens", "Prompt tokens processed.", m, registry=r)
        self.generation_tokens = Counter("vllm:generation_tokens", "Tokens generated.", m, registry=r)
        self.success = Counter("vllm:request_success", "Requests finished, by finish reason.",
                               [*m, "finished_reason"], registry=r)
        self.ttft = Histogram("vllm:time_to_first_token_seconds", "Time to the first token.", m,
                              buckets=LATENCY_BUCKETS, registry=r)
        self.itl = Histogram("vllm:inter_token_latency_seconds", "Time between consecutive tokens.", m,
                             buckets=LATENCY_BUCKETS, registry=r)
        self.e2e = Histogram("vllm:e2e_request_latency_seconds", "Request latency, arrival to last token.", m,
                             buckets=LATENCY_BUCKETS, registry=r)
        s = [*m, "strategy"]
        self.answers = Counter("formtax:answers", "Answers, parsed or failed.", [*s, "outcome"], registry=r)
        self.closing_requests = Counter("formtax:closing_interventions",
                                        "Requests where closing mode changed at least one token.", s, registry=r)
        self.closing_tokens = Counter("formtax:closing_changed_tokens", "Tokens closing mode changed.", s,
                                      registry=r)
        self.approximated = Counter("formtax:schema_approximations",
                                    "Answers whose schema the grammar approximated (the oracle checked the rest).",
                                    s, registry=r)
        self.unchecked = Counter("formtax:formats_unchecked", "Answers with a format no checker knows.", s,
                                 registry=r)
        self.oracle_unchecked = Counter("formtax:oracle_unchecked",
                                        "Answers whose check could not be decided in its time bound (a regex no "
                                        "linear-time engine takes); flagged, not hung.", s, registry=r)
        self.faults = Counter("formtax:request_faults", "Requests answered 500 by a fault of the server's own.", m,
                              registry=r)
        self.refusals = Counter("formtax:queue_refusals", "Requests refused because the queue was full (429).", m,
                                registry=r)
        self._in_flight = 0
        for series in (self.prompt_tokens, self.generation_tokens, self.refusals, self.faults):
            series.labels(model_name)  # exported at 0 from the start, so a rate() has a first sample

    def started(self) -> float:
        """A request entered (returns its arrival time for :meth:`finished`)."""
        self._in_flight += 1
        return time.monotonic()

    def ended(self) -> None:
        self._in_flight = max(0, self._in_flight - 1)

    def faulted(self) -> None:
        self.faults.labels(self.model).inc()

    def refused(self) -> None:
        self.refusals.labels(self.model).inc()

    def finished(self, arrival: float, results: Sequence[Result], token_times: Sequence[Sequence[float]],
                 answered: bool) -> None:
        """Record finished choices: tokens, finish reasons, latencies, and where the request had an answer format
        (``answered``), the answers and formtax's own counters."""
        now, model = time.monotonic(), self.model
        self.e2e.labels(model).observe(now - arrival)
        self.prompt_tokens.labels(model).inc(results[0].tokens.prompt if results else 0)
        for res, times in zip(results, token_times, strict=False):
            self.generation_tokens.labels(model).inc(res.tokens.total)
            self.success.labels(model, res.finish_reason).inc()
            if times:
                self.ttft.labels(model).observe(times[0] - arrival)
                for a, b in zip(times, times[1:], strict=False):
                    self.itl.labels(model).observe(b - a)
            if not answered:
                continue
            labels = (model, res.strategy)
            outcome = "parsed" if res.parse_ok else "failed"
            self.answers.labels(*labels, outcome).inc()
            changed = int(res.stats.get("closing_changed_tokens") or 0)
            if changed:
                self.closing_requests.labels(*labels).inc()
                self.closing_tokens.labels(*labels).inc(changed)
            if res.stats.get("schema_approximated"):
                self.approximated.labels(*labels).inc()
            if res.stats.get("formats_unchecked"):
                self.unchecked.labels(*labels).inc()
            if res.stats.get("oracle_unchecked"):
                self.oracle_unchecked.labels(*labels).inc()

    def render(self, waiting: int) -> bytes:
        self.waiting.labels(self.model).set(waiting)
        self.running.labels(self.model).set(max(0, self._in_flight - waiting))
        return generate_latest(self.registry)
