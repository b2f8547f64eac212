"""The OpenAI wire format of ``tileinfer serve``: responses and stream chunks built as OpenAI's
API shapes them, and errors as ``{"error": {"message", "type", "param", "code"}}``. Requests are
checked by ``tileinfer.server_requests``. Each choice also carries vLLM's ``stop_reason``: the stop
string or stop token that ended it (None otherwise).

Logprobs (chat: ``logprobs: true`` and ``top_logprobs`` 0 to 20; completions: ``logprobs`` 0 to
20) are of the model's raw distribution (log-softmax of its logits, before penalties and
temperature, as vLLM returns by default); a token's ``token`` is its text decoded alone.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field


class APIError(Exception):
    """An error answered in OpenAI's shape with an HTTP status."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code

    def body(self) -> dict:
        return error_body(self.message, self.type, self.param, self.code)


def error_body(message: str, type: str, param: str | None = None, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def bad(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


# -- responses ---------------------------------------------------------------------------------


def new_id(kind: str) -> str:
    return ("chatcmpl-" if kind == "chat" else "cmpl-") + secrets.token_hex(12)


def now() -> int:
    return int(time.time())


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> dict:
    """OpenAI's usage object; ``cached_tokens``: the prompt tokens not prefilled again (the
    engine's prefix cache), reported as ``prompt_tokens_details.cached_tokens``."""
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens}}


@dataclass
class Logprob:
    """One token for the wire: its text, logprob, and the top tokens' (text, logprob); ``logprob``
    and ``top`` None for an echoed prompt's first token (null on the wire)."""

    token: str
    logprob: float | None
    top: list[tuple[str, float]] | None = field(default_factory=list)


def _entry(token: str, logprob: float) -> dict:
    return {"token": token, "logprob": logprob, "bytes": list(token.encode("utf-8"))}


def logprobs_body(kind: str, entries: list[Logprob] | None, offset: int = 0) -> dict | None:
    """OpenAI's ``logprobs`` of a choice: chat ``{"content": [{token, logprob, bytes, top_logprobs}]}``;
    completions ``{tokens, token_logprobs, top_logprobs, text_offset}`` (offsets from ``offset``)."""
    if entries is None:
        return None
    if kind == "chat":
        return {"content": [{**_entry(e.token, e.logprob), "top_logprobs": [_entry(t, lp) for t, lp in e.top]}
                            for e in entries]}
    offsets = []
    for e in entries:
        offsets.append(offset)
        offset += len(e.token)
    return {"tokens": [e.token for e in entries], "token_logprobs": [e.logprob for e in entries],
            "top_logprobs": [None if e.top is None else _top_dict(e.top) for e in entries], "text_offset": offsets}


def _top_dict(top: list[tuple[str, float]]) -> dict[str, float]:
    """Completions' ``{token: logprob}``, most likely first; of two tokens with the same text (two
    byte pieces decoded alone as U+FFFD) the likelier one."""
    out: dict[str, float] = {}
    for token, logprob in top:
        out.setdefault(token, logprob)
    return out


@dataclass
class Choice:
    """One finished choice: its text, finish reason, stop reason (the stop string or token that
    ended it) and (when asked for) its tokens' logprobs; a chat choice's ``reasoning`` (None: it
    did not think) and ``tool_calls`` (OpenAI's, or None; its text is then None when empty)."""

    text: str | None
    finish: str
    stop_reason: str | int | None = None
    logprobs: list[Logprob] | None = None
    reasoning: str | None = None
    tool_calls: list[dict] | None = None


def _message(choice: Choice) -> dict:
    message = {"role": "assistant", "content": choice.text}
    if choice.reasoning is not None:
        message["reasoning_content"] = choice.reasoning
    if choice.tool_calls:
        message["tool_calls"] = choice.tool_calls
    return message


def response(kind: str, rid: str, created: int, model: str, choices: list[Choice], counts: dict) -> dict:
    """A whole reply: chat's ``message`` or completions' ``text`` per choice, indexed in order."""
    if kind == "chat":
        body = [{"index": i, "message": _message(c),
                 "logprobs": logprobs_body(kind, c.logprobs), "finish_reason": c.finish, "stop_reason": c.stop_reason}
                for i, c in enumerate(choices)]
    else:
        body = [{"index": i, "text": c.text, "logprobs": logprobs_body(kind, c.logprobs), "finish_reason": c.finish,
                 "stop_reason": c.stop_reason} for i, c in enumerate(choices)]
    return {"id": rid, "object": "chat.completion" if kind == "chat" else "text_completion", "created": created,
            "model": model, "choices": body, "usage": counts}


def chunk(kind: str, rid: str, created: int, model: str, *, index: int = 0, text: str | None = None,
          finish: str | None = None, stop_reason: str | int | None = None, role: bool = False,
          counts: dict | None = None, include_usage: bool = False, logprobs: dict | None = None,
          reasoning: str | None = None, tool_calls: list[dict] | None = None) -> dict:
    """One streamed chunk of choice ``index``: a text delta (``role`` on the first chat chunk; chat
    also ``reasoning_content`` and ``tool_calls`` deltas) with its tokens' ``logprobs``
    (``logprobs_body``), the finish and stop reasons, or (``counts``) the last chunk with usage and
    no choices."""
    if counts is not None:
        choices = []
    elif kind == "chat":
        delta: dict = {"role": "assistant", "content": text or ""} if role else {}
        if text and not role:
            delta["content"] = text
        if reasoning:
            delta["reasoning_content"] = reasoning
        if tool_calls:
            delta["tool_calls"] = tool_calls
        choices = [{"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish,
                    "stop_reason": stop_reason}]
    else:
        choices = [{"index": index, "text": text or "", "logprobs": logprobs, "finish_reason": finish,
                    "stop_reason": stop_reason}]
    out = {"id": rid, "object": "chat.completion.chunk" if kind == "chat" else "text_completion", "created": created,
           "model": model, "choices": choices}
    if include_usage:
        out["usage"] = counts
    return out
