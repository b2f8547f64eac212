"""The thread of ``tileinfer serve`` that runs the engine: admitted jobs one at a time, in arrival
order, each job's prompts one after another, every event handed to the job's own asyncio queue
(so nothing is lost or mixed between requests), with the timings the metrics and the access log
report. Where a generation stops (EOS, stop strings, stop tokens) is the engine's
(``tileinfer.stops``)."""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from tileinfer import openai_api as api
from tileinfer.server_metrics import Metrics, RequestRecord

_FINISH = {"eos": "stop", "stop": "stop", "length": "length", "grammar": "grammar"}


@dataclass
class Echo:
    """``echo``'s prompt before the replies of its choices: its text, its first token's (whose
    logprob is null) and its tokens' logprobs (``scores``), kept from the first choice's prefill for
    the later choices, whose streams do not compute them again."""

    text: str
    first_token: str
    scores: list | None = None

    def entries(self, scores: list | None, describe: Callable[[Any], api.Logprob]) -> list[api.Logprob]:
        """The prompt tokens' wire logprobs from the engine's ``Chunk.prompt_logprobs`` (first None),
        or, where a stream has none, the ones an earlier choice's stream gave."""
        if scores is not None:
            self.scores = scores
        return [api.Logprob(self.first_token, None, None)] + [describe(lp) for lp in (self.scores or [None])[1:]]


@dataclass
class Job:
    """One admitted request: an engine stream per prompt (not started), and the queue of events
    the worker sends back, in order: ("text", index, str, logprobs) and ("done", index,
    finish_reason, stop_reason) per prompt, or ("error", exception) which ends the job.
    ``describe`` turns the engine's TokenLogprob into an ``openai_api.Logprob``; the logprobs of a
    "text" event are its tokens' (None when the request asked for none; tokens whose text is held
    back go with the next event). ``record`` receives the token counts and the first token's
    time. ``echo`` (one per stream): the prompt sent first, as a "text" event with its tokens'
    logprobs (when asked for); ``generates`` False: the generated tokens are left out of the events
    and the counts (``echo`` with ``max_tokens`` 0), the finish reason is "length"."""

    streams: list[Iterator]
    loop: asyncio.AbstractEventLoop
    record: RequestRecord
    describe: Callable[[Any], api.Logprob] | None = None
    echo: list[Echo] | None = None
    generates: bool = True
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    cancelled: bool = False

    def send(self, *event) -> None:
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, event)
        except RuntimeError:  # the event loop is closed: the server is gone
            self.cancelled = True

    def close(self) -> None:
        for stream in self.streams:
            stream.close()


class Worker:
    """The thread that runs the admitted jobs one at a time, in arrival order; at most
    ``queue_size`` jobs wait behind the one running."""

    def __init__(self, queue_size: int, metrics: Metrics) -> None:
        self.limit = queue_size + 1
        self.metrics = metrics
        self._jobs: queue.Queue[Job | None] = queue.Queue()
        self._lock = threading.Lock()
        self._admitted = 0
        self._running = False
        self._thread = threading.Thread(target=self._loop, name="tileinfer-engine", daemon=True)
        self._stopping = False

    @property
    def waiting(self) -> int:
        """Admitted jobs not yet running."""
        return self._admitted - self._running

    @property
    def running(self) -> int:
        """The job the engine runs: 0 or 1."""
        return int(self._running)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Cancel what runs or waits (at its next step) and end the thread, waiting at most
        ``timeout`` seconds for a step under way."""
        self._stopping = True
        self._jobs.put(None)
        self._thread.join(timeout)

    def submit(self, job: Job) -> bool:
        with self._lock:
            if self._admitted >= self.limit:
                return False
            self._admitted += 1
        self._jobs.put(job)
        return True

    def _loop(self) -> None:
        while (job := self._jobs.get()) is not None:
            self._running = True
            try:
                for index, stream in enumerate(job.streams):
                    if job.cancelled or self._stopping or not self._run(job, index, stream):
                        break
            finally:
                job.close()
                with self._lock:
                    self._admitted -= 1
                    self._running = False

    def _run(self, job: Job, index: int, stream: Iterator) -> bool:
        """Prompt ``index`` of ``job``, its events sent; False when the job ends here (cancelled,
        or an error)."""
        stats, last = None, None
        pending: list[api.Logprob] | None = [] if job.describe else None
        echo = job.echo[index] if job.echo else None
        try:
            for piece in stream:
                if job.cancelled or self._stopping:
                    return False
                if echo is not None:  # the first piece: the prompt's text and logprobs go first
                    job.send("text", index, echo.text,
                             echo.entries(piece.prompt_logprobs, job.describe) if job.describe else None)
                    echo = None
                if not job.generates:
                    stats = piece.stats or stats
                    continue
                if piece.token_ids:
                    last = self._timed(job, len(piece.token_ids), last)
                if pending is not None and piece.logprobs:
                    pending += [job.describe(lp) for lp in piece.logprobs]
                if piece.text or (piece.stats is not None and pending):
                    job.send("text", index, piece.text or "", pending)
                    pending = [] if pending is not None else None
                stats = piece.stats or stats
        except Exception as exc:  # noqa: BLE001 - reported to the request, the server goes on
            job.send("error", exc)
            return False
        finally:
            stream.close()
        job.record.cached_tokens += stats.cached_tokens
        if not job.generates:
            job.send("done", index, "length", None)
            return True
        job.send("done", index, _FINISH[stats.finish_reason], stats.stop_reason)
        return True

    def _timed(self, job: Job, tokens: int, last: float | None) -> float:
        """Counts ``tokens`` new tokens of ``job`` at this moment, after the previous ones at
        ``last`` (None: these are its prompt's first): the time to the first token from the
        request's arrival, the inter-token latency after it."""
        now = time.monotonic()
        record = job.record
        record.completion_tokens += tokens
        self.metrics.generated(tokens)
        if last is None:
            if record.first_token_s is None:
                record.first_token_s = now - record.start
            self.metrics.first_token(now - record.start)
        else:
            self.metrics.inter_token((now - last) / tokens, tokens)
        return now


__all__ = ["Job", "Worker"]
