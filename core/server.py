"""``tileinfer serve``: an OpenAI-compatible HTTP API (FastAPI, uvicorn, server-sent events).

One Engine serves the requests one at a time, in arrival order. A request is checked (its fields,
model, prompt and length: ``Engine.stream`` checks a prompt when called) in the event loop, then
admitted to a bounded queue (503 when ``queue`` requests already wait behind the one running); a
worker thread iterates each request's stream and hands its text to the request's own asyncio
queue, so nothing is lost or mixed between requests. A client that goes away (or a stop string
that matched) closes the stream at the next step, which frees the engine for the next request.

Per request, ``temperature``, ``top_p``, ``top_k``, ``min_p``, ``seed`` and the penalties default
to the server's config (the checkpoint's generation_config.json, then ``--config``, the sampling
flags and KEY=VALUE), and ``max_tokens`` to its ``max_new_tokens``. The wire format is
``tileinfer.openai_api``.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import os
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.exceptions import HTTPException

from tileinfer import openai_api as api
from tileinfer.errors import ConfigError, TileinferError, UsageError
from tileinfer.openai_api import APIError, StopMatcher, bad

API_KEY_ENV = "TILEINFER_API_KEY"
_FINISH = {"eos": "stop", "length": "length"}
_DISCONNECT_CHECK_S = 0.1  # how often a waiting response asks whether its client is still there


@dataclass
class Job:
    """One admitted request: its engine stream (not started), its stop strings, and the queue of
    events the worker sends back: ("text", str, logprobs), ("done", finish_reason,
    completion_tokens) or ("error", exception). ``describe`` turns the engine's TokenLogprob into
    an ``openai_api.Logprob``; the logprobs of a "text" event are its tokens' (None when the
    request asked for none; tokens whose text is held back go with the next event)."""

    stream: Iterator
    stops: list[str]
    loop: asyncio.AbstractEventLoop
    describe: Callable[[Any], api.Logprob] | None = None
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    cancelled: bool = False

    def send(self, *event) -> None:
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, event)
        except RuntimeError:  # the event loop is closed: the server is gone
            self.cancelled = True


class Worker:
    """The thread that runs the admitted jobs one at a time, in arrival order; at most
    ``queue_size`` jobs wait behind the one running."""

    def __init__(self, queue_size: int) -> None:
        self.limit = queue_size + 1
        self._jobs: queue.Queue[Job | None] = queue.Queue()
        self._lock = threading.Lock()
        self._admitted = 0
        self._thread = threading.Thread(target=self._loop, name="tileinfer-engine", daemon=True)
        self._stopping = False

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Cancel what runs or waits (at its next step) and end the thread."""
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
            try:
                if not (job.cancelled or self._stopping):
                    self._run(job)
            finally:
                job.stream.close()
                with self._lock:
                    self._admitted -= 1

    def _run(self, job: Job) -> None:
        matcher = StopMatcher(job.stops)
        tokens, finish = 0, None
        pending: list[api.Logprob] | None = [] if job.describe else None
        try:
            for piece in job.stream:
                if job.cancelled or self._stopping:
                    return
                tokens += len(piece.token_ids)
                if pending is not None and piece.logprobs:
                    pending += [job.describe(lp) for lp in piece.logprobs]
                text, stopped = matcher.push(piece.text or "")
                if text:
                    job.send("text", text, pending)
                    pending = [] if pending is not None else None
                if stopped:
                    finish = "stop"
                    break
                if piece.stats is not None:
                    finish = _FINISH[piece.stats.finish_reason]
        except Exception as exc:  # noqa: BLE001 - reported to the request, the server goes on
            job.send("error", exc)
            return
        finally:
            job.stream.close()  # a stop string matched: free the engine now
        rest = matcher.flush() if finish != "stop" else ""
        if rest or pending:
            job.send("text", rest, pending)
        job.send("done", finish or "length", tokens)


def create_app(engine, *, queue_size: int = 16, api_key: str | None = None, model_id: str | None = None) -> FastAPI:
    """The FastAPI app serving ``engine`` (an Engine with a tokenizer). ``api_key``: the bearer
    token every /v1 request must carry (None: no key)."""
    if engine.tokenizer is None:
        raise ConfigError(f"serve needs a checkpoint with a tokenizer.json ({engine.folder} has none)")
    if not isinstance(queue_size, int) or queue_size < 0:
        raise UsageError(f"the queue size must be an integer >= 0, got {queue_size!r}")
    model_id = model_id or engine.folder.name
    worker = Worker(queue_size)
    key = api_key.encode() if api_key else None
    created = int(time.time())

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        worker.start()
        yield
        await asyncio.to_thread(worker.stop)

    app = FastAPI(title="tileinfer", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.worker = worker

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError):
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.exception_handler(HTTPException)
    async def _http_error(request: Request, exc: HTTPException):
        return JSONResponse(api.error_body(str(exc.detail), "invalid_request_error"), status_code=exc.status_code)

    def authorize(request: Request) -> None:
        if key is None:
            return
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        if not (scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), key)):
            raise APIError(401, "missing or wrong API key: send the header 'Authorization: Bearer KEY'",
                           code="invalid_api_key")

    @app.get("/health")
    async def health():
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models(request: Request):
        authorize(request)
        return {"object": "list", "data": [{"id": model_id, "object": "model", "created": created,
                                            "owned_by": "tileinfer"}]}

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await complete("chat", request)

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await complete("completion", request)

    async def complete(kind: str, request: Request):
        authorize(request)
        try:
            body = await request.json()
        except ValueError:  # not JSON, or not UTF-8
            raise bad("the request body is not valid JSON") from None
        parsed = api.parse_request(kind, body)
        if parsed.model is not None and parsed.model != model_id:
            raise APIError(404, f"the model {parsed.model!r} does not exist: this server serves {model_id!r}",
                           param="model", code="model_not_found")
        stream, prompt_tokens = _start(engine, parsed)
        describe = _describer(engine.tokenizer) if parsed.logprobs is not None else None
        job = Job(stream, parsed.stop, asyncio.get_running_loop(), describe)
        if not worker.submit(job):
            stream.close()
            raise APIError(503, f"the server is busy: {worker.limit - 1} requests already wait; retry later",
                           type="server_error", code="queue_full")
        rid, made = api.new_id(kind), api.now()
        if parsed.stream:
            return StreamingResponse(_sse(kind, rid, made, model_id, parsed, job, prompt_tokens, request),
                                     media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        texts: list[str] = []
        logprobs: list[api.Logprob] | None = [] if describe else None
        try:
            async for event in _events(job, request):
                if event[0] == "text":
                    texts.append(event[1])
                    if logprobs is not None:
                        logprobs += event[2]
                elif event[0] == "error":
                    raise _server_error(event[1])
                else:
                    counts = api.usage(prompt_tokens, event[2])
                    return api.response(kind, rid, made, model_id, "".join(texts), event[1], counts, logprobs)
        finally:
            job.cancelled = True
        return JSONResponse(api.error_body("the client went away", "server_error"), status_code=499)

    return app


def _start(engine, parsed: api.ParsedRequest) -> tuple[Iterator, int]:
    """The engine's stream for a request (not started: the worker starts it) and the prompt's
    length; APIError(400) for a prompt the engine rejects (too long, empty, not in the vocabulary)."""
    param = "messages" if parsed.kind == "chat" else "prompt"
    try:
        sampling = replace(engine.default_sampling, **parsed.sampling)
    except ConfigError as exc:  # "temperature=-1 is not valid: ..."
        name = str(exc).partition("=")[0]
        raise bad(str(exc), name if name in parsed.sampling else None) from None
    try:
        if parsed.kind == "chat":
            text = engine.tokenizer.apply_chat_template(parsed.messages, add_generation_prompt=True,
                                                        **parsed.chat_template_kwargs)
            ids = engine.tokenizer.encode(text, add_special_tokens=False)
        else:
            ids = engine.encode_prompt(parsed.prompt) if isinstance(parsed.prompt, str) else parsed.prompt
        stream = engine.stream(ids, max_new_tokens=parsed.max_tokens, sampling=sampling, logprobs=parsed.logprobs)
    except UsageError as exc:
        too_long = "positions, more than" in str(exc)
        raise bad(str(exc), param, "context_length_exceeded" if too_long else None) from None
    return stream, len(ids)


def _describer(tokenizer) -> Callable[[Any], api.Logprob]:
    """TokenLogprob -> openai_api.Logprob, each token's text decoded alone (special tokens kept)."""
    def text(token: int) -> str:
        return tokenizer.decode([token], skip_special_tokens=False)

    def describe(lp) -> api.Logprob:
        return api.Logprob(text(lp.token_id), lp.logprob, [(text(t), v) for t, v in lp.top])

    return describe


def _server_error(exc: BaseException) -> APIError:
    message = str(exc) if isinstance(exc, TileinferError) else f"{type(exc).__name__}: {exc}"
    return APIError(500, message, type="server_error")


async def _events(job: Job, request: Request) -> AsyncIterator[tuple]:
    """The job's events until it is done; stops (and cancels the job) when the client goes away."""
    checked = time.monotonic()
    while True:
        try:
            event = await asyncio.wait_for(job.events.get(), _DISCONNECT_CHECK_S)
        except TimeoutError:
            event = None
        if event is None or time.monotonic() - checked > _DISCONNECT_CHECK_S:
            checked = time.monotonic()
            if await request.is_disconnected():
                job.cancelled = True
                return
        if event is None:
            continue
        yield event
        if event[0] != "text":
            return


async def _sse(kind: str, rid: str, made: int, model: str, parsed: api.ParsedRequest, job: Job, prompt_tokens: int,
               request: Request) -> AsyncIterator[str]:
    usage_field = parsed.include_usage

    def data(obj: dict) -> str:
        return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"

    offset = 0  # completions' text_offset of the next token
    try:
        if kind == "chat":
            yield data(api.chunk(kind, rid, made, model, role=True, include_usage=usage_field))
        async for event in _events(job, request):
            if event[0] == "text":
                logprobs = api.logprobs_body(kind, event[2], offset)
                offset += sum(len(e.token) for e in event[2] or ())
                yield data(api.chunk(kind, rid, made, model, text=event[1], include_usage=usage_field,
                                     logprobs=logprobs))
            elif event[0] == "error":
                yield data(_server_error(event[1]).body())
                return
            else:
                yield data(api.chunk(kind, rid, made, model, finish=event[1], include_usage=usage_field))
                if usage_field:
                    yield data(api.chunk(kind, rid, made, model, counts=api.usage(prompt_tokens, event[2]),
                                         include_usage=True))
                yield "data: [DONE]\n\n"
    finally:
        job.cancelled = True  # the client went away (or all was sent): the worker closes the stream


def serve(engine, *, host: str = "127.0.0.1", port: int = 8000, queue_size: int = 16, api_key: str | None = None,
          log_level: str = "info") -> None:
    """Run the server until interrupted (uvicorn handles Ctrl-C)."""
    import uvicorn

    api_key = api_key or os.environ.get(API_KEY_ENV) or None
    app = create_app(engine, queue_size=queue_size, api_key=api_key)
    uvicorn.run(app, host=host, port=port, log_level=log_level)
