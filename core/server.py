"""``tileinfer serve``: an OpenAI-compatible HTTP API (FastAPI, uvicorn, server-sent events).

One Engine serves the requests one at a time, in arrival order. A request passes the guard
(``tileinfer.server_guard``: Host header, content type, API key, a body read within its size and
time limits), then its body is decoded, validated (``tileinfer.server_requests``), templated and
tokenized in a thread, off the event loop, so that no client's request stalls the others. It is
admitted to a bounded queue (503 when ``queue_size`` requests already wait behind the one
running); the engine's thread (``tileinfer.server_worker``) runs it and hands its text to the
request's own asyncio queue. A client that goes away closes the stream at the next step, which
frees the engine for the next request.

A request's fields make one ``tileinfer.SamplingParams``: where a generation stops (EOS, stop
strings, stop tokens) and the text it shows are the engine's, as for the CLI and the Python API.
``temperature``, ``top_p``, ``top_k``, ``min_p``, ``seed`` and the penalties a request does not
set take the server's config (the checkpoint's generation_config.json, then ``--config``, the
sampling flags and KEY=VALUE), and ``max_tokens`` its ``max_new_tokens``. The wire format is
``tileinfer.openai_api``; the metrics and the access log are ``tileinfer.server_metrics``.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import re
import time
from collections.abc import Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException

from tileinfer import __version__
from tileinfer import openai_api as api
from tileinfer import server_requests as requests
from tileinfer.errors import ConfigError, UsageError
from tileinfer.sampling_params import SamplingParams
from tileinfer.openai_api import APIError, bad
from tileinfer.server_guard import (ApiKey, ClientDisconnect, Guard, HeadDeadlineH11, allowed_hosts, api_key_of,
                                    read_body)
from tileinfer.server_metrics import AccessLog, Metrics
from tileinfer.chat_output import ReplyFormat
from tileinfer.server_chat import chat_prompt, render, template_kwargs
from tileinfer.server_reply import Reply, server_error
from tileinfer.server_structured import constrain, structured_request, thinks_first
from tileinfer.server_worker import Echo, Job, Worker

MAX_BODY_BYTES = 4 << 20
BODY_TIMEOUT_S = 30.0
IDLE_TIMEOUT_S = 5  # a connection's wait for a request's head
SHUTDOWN_TIMEOUT_S = 10  # what a stop signal leaves running requests before they are cancelled


@dataclass
class Prepared:
    """A generation request ready to admit: its engine streams (``n`` per prompt, prompt by prompt,
    not started), its prompts' lengths (each once) and, with ``echo``, each stream's prompt."""

    streams: list
    prompt_tokens: list[int]
    echo: list[Echo] | None = None
    form: ReplyFormat | None = None  # how a chat reply reads (reasoning, tool calls)


def create_app(engine, *, queue_size: int = 16, api_key: str | None = None,
               served_model_names: Sequence[str] | None = None, host: str = "127.0.0.1",
               hosts: Sequence[str] | None = None, max_body_bytes: int = MAX_BODY_BYTES,
               body_timeout_s: float = BODY_TIMEOUT_S) -> FastAPI:
    """The FastAPI app serving ``engine`` (an Engine with a tokenizer). ``api_key``: the bearer
    token every /v1, /tokenize and /detokenize request must carry (None: no key; a blank key is a
    UsageError). ``served_model_names``: the names a request's ``model`` may give (default: the
    model folder's name), the first one reported. ``host``: the address served, whose name (with
    localhost's) a Host header must give when there is no key, unless ``hosts`` lists the names
    to accept. Bodies over ``max_body_bytes`` are 413s, bodies slower than ``body_timeout_s`` 408s."""
    if engine.tokenizer is None:
        raise ConfigError(f"serve needs a checkpoint with a tokenizer.json ({engine.folder} has none)")
    if not isinstance(queue_size, int) or queue_size < 0:
        raise UsageError(f"the queue size must be an integer >= 0, got {queue_size!r}")
    if api_key is not None and not api_key.strip():
        raise UsageError("the API key is blank: give a key, or None to serve without one")
    if isinstance(served_model_names, str):
        served_model_names = [served_model_names]
    names = list(served_model_names or [engine.folder.name])
    if not all(isinstance(n, str) and n.strip() for n in names):
        raise UsageError(f"served model names must be non-empty strings, got {names!r}")
    key = ApiKey(api_key) if api_key is not None else None
    metrics = Metrics()
    worker = Worker(queue_size, metrics)
    metrics.track_queue(lambda: worker.waiting, lambda: worker.running)
    created = int(time.time())

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        worker.start()
        yield
        await asyncio.to_thread(worker.stop)

    app = FastAPI(title="tileinfer", version=__version__, lifespan=lifespan, docs_url=None, redoc_url=None,
                  openapi_url=None)
    app.state.worker, app.state.metrics = worker, metrics
    app.add_middleware(Guard, hosts=allowed_hosts(host, hosts, key is not None), max_body=max_body_bytes)
    app.add_middleware(AccessLog, metrics=metrics)

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError):
        close = {"connection": "close"} if exc.status in (408, 413) else None  # the body is left unread
        return JSONResponse(exc.body(), status_code=exc.status, headers=close)

    @app.exception_handler(HTTPException)
    async def _http_error(request: Request, exc: HTTPException):
        return JSONResponse(api.error_body(str(exc.detail), "invalid_request_error"), status_code=exc.status_code)

    @app.exception_handler(ClientDisconnect)
    async def _gone(request: Request, exc: ClientDisconnect):
        request.state.record.note = "client went away"
        return Response(status_code=499)  # not delivered: there is no one to deliver it to

    @app.exception_handler(Exception)
    async def _failure(request: Request, exc: Exception):
        return JSONResponse(server_error(exc).body(), status_code=500)

    def authorize(request: Request) -> None:
        if key is not None:
            key.check(request)

    async def body_of(request: Request, model: type) -> Any:
        """The request's body, read within the limits, decoded and validated in a thread."""
        authorize(request)
        body = await read_body(request, max_body_bytes, body_timeout_s)
        return await asyncio.to_thread(lambda: requests.validate(model, requests.decode_json(body)))

    def check_model(name: str | None) -> None:
        if name is not None and name not in names:
            raise APIError(404, f"the model {name!r} does not exist: this server serves {', '.join(map(repr, names))}",
                           param="model", code="model_not_found")

    @app.get("/health")
    async def health():
        return {"status": "ok"}

    @app.get("/version")
    async def version():
        return {"version": __version__}

    @app.get("/metrics")
    async def metrics_page():
        content, media_type = metrics.exposition()
        return Response(content, headers={"content-type": media_type})

    @app.get("/v1/models")
    async def models(request: Request):
        authorize(request)
        return {"object": "list", "data": [{"id": name, "object": "model", "created": created, "owned_by": "tileinfer",
                                            "max_model_len": engine.capacity} for name in names]}

    @app.post("/tokenize")
    async def tokenize(request: Request):
        parsed = await body_of(request, requests.TokenizeRequest)
        check_model(parsed.model)
        ids = await asyncio.to_thread(_tokenize, engine, parsed)
        strs = [engine.tokenizer.decode([t], skip_special_tokens=False) for t in ids] if parsed.return_token_strs \
            else None
        return {"count": len(ids), "max_model_len": engine.capacity, "tokens": ids, "token_strs": strs}

    @app.post("/detokenize")
    async def detokenize(request: Request):
        parsed = await body_of(request, requests.DetokenizeRequest)
        check_model(parsed.model)
        vocab = engine.tokenizer.vocab_size
        for i, token in enumerate(parsed.tokens):
            if token >= vocab:
                raise bad(f"tokens[{i}]: {token} is not in the vocabulary (size {vocab})", f"tokens[{i}]")
        text = await asyncio.to_thread(engine.tokenizer.decode, parsed.tokens, skip_special_tokens=False)
        return {"prompt": text}

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await complete("chat", request)

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await complete("completion", request)

    async def complete(kind: str, request: Request):
        model = requests.ChatRequest if kind == "chat" else requests.CompletionRequest
        parsed = await body_of(request, model)
        check_model(parsed.model)
        prepared = await asyncio.to_thread(_prepare, engine, parsed)
        record = request.state.record
        record.prompt_tokens = sum(prepared.prompt_tokens)
        describe = _describer(engine.tokenizer) if parsed.top_n is not None else None
        job = Job(prepared.streams, asyncio.get_running_loop(), record, describe, echo=prepared.echo,
                  generates=getattr(parsed, "generates", True))
        if not worker.submit(job):
            job.close()
            raise APIError(503, f"the server is busy: {worker.limit - 1} requests already wait; retry later",
                           type="server_error", code="queue_full")
        metrics.prompt(record.prompt_tokens)
        reply = Reply(kind, api.new_id(kind), api.now(), names[0], parsed, job, record, prepared.form)
        if parsed.stream:
            return StreamingResponse(reply.stream(request), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        return await reply.whole(request)

    return app


def _prepare(engine, parsed) -> Prepared:
    """The engine's streams of a generation request (not started: the worker starts them), ``n``
    per prompt: choice ``c`` of a prompt samples with seed ``seed + c`` (mod 2**63; ``seed``: the
    request's, else the server's), and only choice 0 computes the prompt's logprobs that ``echo``
    asks for; APIError(400) naming the field for params or a prompt the engine rejects (too long,
    empty, not in the vocabulary, a template that fails)."""
    fields = parsed.params()
    chat = chat_prompt(engine, parsed) if isinstance(parsed, requests.ChatRequest) else None
    if chat is not None and chat.structured is not None:
        if fields.get("structured") is not None:
            raise bad("tool_choice forces a tool call, response_format another shape: give one", "tool_choice")
        fields["structured"] = constrain(engine, chat.structured, "tools")
    elif fields.get("structured") is not None:  # response_format or a guided_* field
        thinks = chat is not None and thinks_first(chat.form.mode, engine.tokenizer)
        fields["structured"] = constrain(engine, fields["structured"], structured_request(parsed)[1], thinks=thinks)
    try:
        params = SamplingParams(**fields)
    except UsageError as exc:  # "temperature=-1 is not valid: ..."
        raise bad(str(exc), _field_of(str(exc), fields)) from None
    seed = params.seed if params.seed is not None else engine.default_sampling.seed
    # the prompt's logprobs are the same for every choice: the first computes them, the others reuse
    # its prefill (the prefix cache) and echo its scores (Echo.scores)
    choices = [dataclasses.replace(params, seed=(seed + c) % 2**63, prompt_logprobs=None) if c else params
               for c in range(parsed.n)]
    if isinstance(parsed, requests.ChatRequest):
        param, prompts = "messages", [chat.ids]
    else:
        param, prompts = "prompt", parsed.prompt
    streams, lengths, echo = [], [], [] if getattr(parsed, "echo", False) else None
    try:
        for i, prompt in enumerate(prompts):
            ids = engine.encode_prompt(prompt) if isinstance(prompt, str) else prompt
            streams += [engine.stream(ids, choice) for choice in choices]
            lengths.append(len(ids))
            if echo is not None:
                echo += [_echo(engine.tokenizer, prompt, ids)] * parsed.n  # one Echo for the n choices
    except UsageError as exc:
        for stream in streams:
            stream.close()
        too_long = "positions, more than" in str(exc)
        where = f"prompt {i}: " if len(prompts) > 1 else ""
        raise bad(where + str(exc), _field_of(str(exc), fields) or param,
                  "context_length_exceeded" if too_long else None) from None
    return Prepared(streams, lengths, echo, chat.form if chat is not None else None)


def _echo(tokenizer, prompt: str | list[int], ids: list[int]) -> Echo:
    """What ``echo`` puts before a choice: the prompt as given (token ids decoded, special tokens
    kept) and its first token's text."""
    text = prompt if isinstance(prompt, str) else tokenizer.decode(ids, skip_special_tokens=False)
    return Echo(text, tokenizer.decode(ids[:1], skip_special_tokens=False))


def _field_of(message: str, fields: dict) -> str | None:
    """The field an error message starts with ("temperature=-1 is not valid", "stop is not valid",
    "stop_token_ids: 9 is outside ..."), if it is one of ``fields``."""
    name = re.match(r"\w*", message).group()
    return name if name in fields else None


def _tokenize(engine, parsed: requests.TokenizeRequest) -> list[int]:
    """vLLM's /tokenize: special tokens added to a prompt, not to rendered messages, by default;
    messages rendered as /v1/chat/completions renders them (``server_chat.template_kwargs``: the
    tools and the template's variables), with or without the generation prompt; APIError(400)
    when the template fails on them."""
    if parsed.messages is not None:
        text = render(engine.tokenizer, parsed.template_messages(), template_kwargs(parsed),
                      add_generation_prompt=parsed.add_generation_prompt)
        return engine.tokenizer.encode(text, add_special_tokens=bool(parsed.add_special_tokens))
    add = True if parsed.add_special_tokens is None else parsed.add_special_tokens
    return engine.tokenizer.encode(parsed.prompt, add_special_tokens=add)


def _describer(tokenizer) -> Callable[[Any], api.Logprob]:
    """TokenLogprob -> openai_api.Logprob, each token's text decoded alone (special tokens kept)."""
    def text(token: int) -> str:
        return tokenizer.decode([token], skip_special_tokens=False)

    def describe(lp) -> api.Logprob:
        return api.Logprob(text(lp.token_id), lp.logprob, [(text(t), v) for t, v in lp.top])

    return describe


def uvicorn_config(app: FastAPI, *, host: str = "127.0.0.1", port: int = 8000, log_level: str = "info",
                   idle_timeout_s: float = IDLE_TIMEOUT_S, shutdown_timeout_s: float = SHUTDOWN_TIMEOUT_S):
    """uvicorn's config for ``app``: h11 with the request-head deadline (``HeadDeadlineH11``: a
    connection idle ``idle_timeout_s`` is closed), at most ``shutdown_timeout_s`` after a stop
    signal for the running requests before they are cancelled, and the access log of
    ``tileinfer.server`` (one line per request, with its tokens and timings) in place of uvicorn's."""
    import uvicorn
    from uvicorn.config import LOGGING_CONFIG

    logging_config = copy.deepcopy(LOGGING_CONFIG)
    logging_config["loggers"]["tileinfer.server"] = {"handlers": ["default"], "level": log_level.upper(),
                                                     "propagate": False}
    return uvicorn.Config(app, host=host, port=port, log_level=log_level, http=HeadDeadlineH11, access_log=False,
                          log_config=logging_config, timeout_keep_alive=idle_timeout_s,
                          timeout_graceful_shutdown=shutdown_timeout_s, lifespan="on")


def serve(engine, *, host: str = "127.0.0.1", port: int = 8000, queue_size: int = 16, api_key: str | None = None,
          served_model_names: Sequence[str] | None = None, hosts: Sequence[str] | None = None,
          log_level: str = "info") -> None:
    """Run the server until interrupted (Ctrl-C or SIGTERM: running requests get
    ``SHUTDOWN_TIMEOUT_S`` to finish). ``api_key``: as given (the command line resolves
    --api-key, --api-key-file and TILEINFER_API_KEY with ``server_guard.api_key_of``)."""
    import uvicorn

    app = create_app(engine, queue_size=queue_size, api_key=api_key, served_model_names=served_model_names,
                     host=host, hosts=hosts)
    try:
        uvicorn.Server(uvicorn_config(app, host=host, port=port, log_level=log_level)).run()
    except KeyboardInterrupt:  # Ctrl-C twice: uvicorn's forced exit
        pass


__all__ = ["BODY_TIMEOUT_S", "IDLE_TIMEOUT_S", "MAX_BODY_BYTES", "SHUTDOWN_TIMEOUT_S", "api_key_of", "create_app",
           "serve", "uvicorn_config"]
