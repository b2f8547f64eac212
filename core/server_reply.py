"""The answer of ``tileinfer serve`` to an admitted generation request: its job's events turned
into one JSON reply or into server-sent events, one choice per prompt, indexed in order."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Iterator

from fastapi.responses import JSONResponse, Response
from starlette.requests import Request

from tileinfer import openai_api as api
from tileinfer.chat_output import ChatParser, Delta, ReplyFormat, parse_reply
from tileinfer.errors import TileinferError
from tileinfer.openai_api import APIError
from tileinfer.server_metrics import LOGGER, RequestRecord
from tileinfer.server_worker import Job

DISCONNECT_CHECK_S = 0.1  # how often a waiting response asks whether its client is still there


def server_error(exc: BaseException) -> APIError:
    message = str(exc) if isinstance(exc, TileinferError) else f"{type(exc).__name__}: {exc}"
    return APIError(500, message, type="server_error")


class Reply:
    """``kind`` ("chat" or "completion") reply ``rid`` to ``job`` (its request ``parsed``), naming
    ``model``; ``whole`` or ``stream`` it once. Either cancels the job when it ends (the worker then
    closes the engine's stream at its next step) and notes in ``record`` a client that went away.
    ``form``: how a chat choice's text reads (``tileinfer.chat_output``: its reasoning, its answer
    and tool calls); None: as it is."""

    def __init__(self, kind: str, rid: str, created: int, model: str, parsed, job: Job, record: RequestRecord,
                 form: ReplyFormat | None = None) -> None:
        self.kind, self.rid, self.created, self.model = kind, rid, created, model
        self.parsed, self.job, self.record = parsed, job, record
        self.form = form
        self.finished = False  # every prompt done, or an error reported

    async def events(self, request: Request) -> AsyncIterator[tuple]:
        """The job's events until all its prompts are done or it failed; ends early, cancelling the
        job, when the client goes away."""
        done, checked = 0, time.monotonic()
        while done < len(self.job.streams):
            try:
                event = await asyncio.wait_for(self.job.events.get(), DISCONNECT_CHECK_S)
            except TimeoutError:
                event = None
            if event is None or time.monotonic() - checked > DISCONNECT_CHECK_S:
                checked = time.monotonic()
                if await request.is_disconnected():
                    return
            if event is None:
                continue
            if event[0] == "error":
                self.finished = True
                LOGGER.error(f"generation {self.rid} failed: {server_error(event[1]).message}")
            yield event
            if event[0] == "error":
                return
            done += event[0] == "done"
        self.finished = True

    def _end(self) -> None:
        self.job.cancelled = True
        if not self.finished:
            self.record.note = "client went away"

    def _usage(self) -> dict:
        return api.usage(self.record.prompt_tokens, self.record.completion_tokens, self.record.cached_tokens)

    async def whole(self, request: Request) -> Response:
        n = len(self.job.streams)
        texts: list[list[str]] = [[] for _ in range(n)]
        logprobs = [[] for _ in range(n)] if self.job.describe else None
        finishes: list[tuple | None] = [None] * n  # (finish_reason, stop_reason)
        try:
            async for event in self.events(request):
                if event[0] == "text":
                    texts[event[1]].append(event[2])
                    if logprobs is not None:
                        logprobs[event[1]] += event[3]
                elif event[0] == "error":
                    raise server_error(event[1])
                else:
                    finishes[event[1]] = event[2:]
        finally:
            self._end()
        if not self.finished:
            return Response(status_code=499)  # not delivered: the client is gone
        choices = [self._choice("".join(t), f, logprobs[i] if logprobs is not None else None)
                   for i, (t, f) in enumerate(zip(texts, finishes))]
        return JSONResponse(api.response(self.kind, self.rid, self.created, self.model, choices, self._usage()))

    def _choice(self, text: str, finish: tuple, logprobs: list | None) -> api.Choice:
        if self.form is None:
            return api.Choice(text, *finish, logprobs)
        reasoning, content, calls = parse_reply(text, self.form)
        reason = "tool_calls" if calls and finish[0] == "stop" else finish[0]
        return api.Choice(content, reason, finish[1], logprobs, reasoning, [c.to_openai() for c in calls] or None)

    async def stream(self, request: Request) -> AsyncIterator[str]:
        """Server-sent events: chat's role chunk, a chunk per text event with its tokens' logprobs,
        a finish chunk per prompt, the usage chunk when asked for, then ``[DONE]``."""
        include_usage = self.parsed.include_usage
        offsets = [0] * len(self.job.streams)  # completions' text_offset of each choice's next token

        parsers = [ChatParser(self.form) for _ in self.job.streams] if self.form is not None else None

        def chunk(**kw) -> str:
            body = api.chunk(self.kind, self.rid, self.created, self.model, include_usage=include_usage, **kw)
            return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"

        def parsed(index: int, delta: Delta, logprobs: dict | None) -> Iterator[str]:
            """A chat delta's chunks: its reasoning and text (with the logprobs), then per call
            one with its id and name and one with its arguments, as OpenAI streams them."""
            if delta.reasoning or delta.content or logprobs is not None:
                yield chunk(index=index, text=delta.content, reasoning=delta.reasoning, logprobs=logprobs)
            first = parsers[index].calls - len(delta.calls)
            for k, call in enumerate(delta.calls, first):
                yield chunk(index=index, tool_calls=[{"index": k, "id": call.id, "type": "function",
                                                      "function": {"name": call.name, "arguments": ""}}])
                yield chunk(index=index, tool_calls=[{"index": k, "function": {"arguments": call.arguments}}])

        try:
            if self.kind == "chat":
                for index in range(len(self.job.streams)):
                    yield chunk(index=index, role=True)
            async for event in self.events(request):
                if event[0] == "text":
                    _, index, text, entries = event
                    logprobs = api.logprobs_body(self.kind, entries, offsets[index])
                    offsets[index] += sum(len(e.token) for e in entries or ())
                    if parsers is None:
                        yield chunk(index=index, text=text, logprobs=logprobs)
                    else:
                        for line in parsed(index, parsers[index].feed(text), logprobs):
                            yield line
                elif event[0] == "error":
                    yield f"data: {json.dumps(server_error(event[1]).body())}\n\n"
                    return
                else:
                    finish = event[2]
                    if parsers is not None:
                        for line in parsed(event[1], parsers[event[1]].finish(), None):
                            yield line
                        finish = parsers[event[1]].finish_reason(finish)
                    yield chunk(index=event[1], finish=finish, stop_reason=event[3])
            if self.finished:
                if include_usage:
                    yield chunk(counts=self._usage())
                yield "data: [DONE]\n\n"
        finally:
            self._end()


__all__ = ["DISCONNECT_CHECK_S", "Reply", "server_error"]
