"""What ``tileinfer serve`` reports about its requests: Prometheus metrics (prometheus_client, one
registry per app, served at /metrics) and one access-log line per request, written by the
``AccessLog`` middleware with the request's status, tokens and timings."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LOGGER = logging.getLogger("tileinfer.server")

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0,
                    2.5, 5.0, 10.0)
_FIRST_TOKEN_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                        40.0, 80.0)


@dataclass
class RequestRecord:
    """One HTTP request as the access log reports it; the endpoint and the engine's worker fill in
    the tokens, the first token's time (seconds after ``start``, a ``time.monotonic()``) and a note
    such as "client went away"."""

    start: float
    prompt_tokens: int = 0
    cached_tokens: int = 0  # of the prompt tokens, those the KV cache held from the previous generation
    completion_tokens: int = 0
    first_token_s: float | None = None
    note: str = ""


class Metrics:
    """The server's Prometheus metrics, in a registry of their own:

    - ``tileinfer_requests_total{endpoint, status}``: HTTP requests answered (an unknown path's
      endpoint is "other");
    - ``tileinfer_prompt_tokens_total``, ``tileinfer_generation_tokens_total``: the prompt tokens of
      admitted requests, the tokens generated;
    - ``tileinfer_time_to_first_token_seconds``: from a request's arrival (its wait in the queue
      included) to each of its prompts' first token;
    - ``tileinfer_inter_token_latency_seconds``: between a prompt's consecutive tokens (a step that
      commits n tokens counts n gaps of a n-th of its time);
    - ``tileinfer_requests_waiting``, ``tileinfer_requests_running``: the queue's depth and the
      request the engine runs (0 or 1)."""

    ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/models", "/tokenize", "/detokenize", "/health",
                 "/metrics", "/version")

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self._requests = Counter("tileinfer_requests", "HTTP requests answered, by endpoint and status code",
                                 ["endpoint", "status"], registry=self.registry)
        self._prompt = Counter("tileinfer_prompt_tokens", "Prompt tokens of admitted requests",
                               registry=self.registry)
        self._generated = Counter("tileinfer_generation_tokens", "Tokens generated", registry=self.registry)
        self._first = Histogram("tileinfer_time_to_first_token_seconds", "Time from a request's arrival to a "
                                "prompt's first token", buckets=_FIRST_TOKEN_BUCKETS, registry=self.registry)
        self._gap = Histogram("tileinfer_inter_token_latency_seconds", "Time between consecutive tokens of a prompt",
                              buckets=_LATENCY_BUCKETS, registry=self.registry)
        self._waiting = Gauge("tileinfer_requests_waiting", "Admitted requests waiting for the engine",
                              registry=self.registry)
        self._running = Gauge("tileinfer_requests_running", "Requests the engine runs", registry=self.registry)

    def track_queue(self, waiting: Callable[[], int], running: Callable[[], int]) -> None:
        """Read the queue's depth and the running count from these callables at each scrape."""
        self._waiting.set_function(waiting)
        self._running.set_function(running)

    def request(self, path: str, status: int) -> None:
        self._requests.labels(path if path in self.ENDPOINTS else "other", str(status)).inc()

    def prompt(self, tokens: int) -> None:
        self._prompt.inc(tokens)

    def generated(self, tokens: int) -> None:
        self._generated.inc(tokens)

    def first_token(self, seconds: float) -> None:
        self._first.observe(seconds)

    def inter_token(self, seconds: float, tokens: int = 1) -> None:
        for _ in range(tokens):
            self._gap.observe(seconds)

    def exposition(self) -> tuple[bytes, str]:
        """The metrics in Prometheus' text format, and its content type."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


class AccessLog:
    """ASGI middleware: a ``RequestRecord`` in each HTTP request's ``scope["state"]["record"]``
    (``request.state.record``), counted in ``metrics`` and logged at INFO on the
    ``tileinfer.server`` logger once the response is sent, as

    ``127.0.0.1:52731 "POST /v1/completions" 200 prompt_tokens=5 completion_tokens=16 first_token_ms=41.0 total_ms=380.2``
    """

    def __init__(self, app, metrics: Metrics) -> None:
        self.app, self.metrics = app, metrics

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        record = RequestRecord(time.monotonic())
        scope.setdefault("state", {})["record"] = record
        status = 500  # what the server answers when the app fails before it responds

        async def send_status(message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            self.metrics.request(scope["path"], status)
            LOGGER.info(access_line(scope, status, record, time.monotonic()))


def access_line(scope, status: int, record: RequestRecord, end: float) -> str:
    client = scope.get("client")
    where = f"{client[0]}:{client[1]}" if client else "-"
    parts = [f'{where} "{scope["method"]} {scope["path"]}" {status}']
    if record.prompt_tokens or record.completion_tokens:
        parts.append(f"prompt_tokens={record.prompt_tokens} completion_tokens={record.completion_tokens}")
    if record.first_token_s is not None:
        parts.append(f"first_token_ms={record.first_token_s * 1e3:.1f}")
    parts.append(f"total_ms={(end - record.start) * 1e3:.1f}")
    if record.note:
        parts.append(f"({record.note})")
    return " ".join(parts)


__all__ = ["AccessLog", "LOGGER", "Metrics", "RequestRecord", "access_line"]
