"""The OpenAI wire format of ``tileinfer serve``: requests checked into a ``ParsedRequest``,
responses and stream chunks built as OpenAI's API shapes them, errors as
``{"error": {"message", "type", "param", "code"}}``, and stop strings matched in streamed text.

Nothing here decodes: the server hands ``ParsedRequest`` to ``Engine.stream``. A field tileinfer
does not implement (``logit_bias``, tools, n > 1, ...) is a 400 error naming it unless it has its
no-op value (``n: 1``, ``logit_bias: {}``); a field OpenAI does not define is a 400 error too.
``null`` counts as absent, as in OpenAI's API.

Logprobs (chat: ``logprobs: true`` and ``top_logprobs`` 0 to 20; completions: ``logprobs`` 0 to
20) are of the model's raw distribution (log-softmax of its logits, before penalties and
temperature, as vLLM returns by default); a token's ``token`` is its text decoded alone.
"""

from __future__ import annotations

import math
import numbers
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

# Fields with an effect, per endpoint (``user`` is OpenAI's end-user id for abuse monitoring: no
# effect on the reply, accepted).
_COMMON = {"model", "max_tokens", "temperature", "top_p", "top_k", "min_p", "seed", "stop", "stream",
           "stream_options", "user", "presence_penalty", "frequency_penalty", "repetition_penalty", "logprobs"}
FIELDS = {
    "chat": _COMMON | {"messages", "max_completion_tokens", "chat_template_kwargs", "top_logprobs"},
    "completion": _COMMON | {"prompt"},
}
# OpenAI fields tileinfer does not implement: accepted only at these no-op values.
_NO_OPS = {"logit_bias": ({},), "n": (1,)}
NOT_IMPLEMENTED = {
    "chat": {**_NO_OPS, "tools": ([],), "tool_choice": ("none",),
             "parallel_tool_calls": (True, False), "functions": ([],), "function_call": ("none",),
             "response_format": ({"type": "text"},), "store": (False,), "metadata": ({},), "modalities": (["text"],),
             "reasoning_effort": (), "service_tier": ("auto", "default"), "prediction": (), "audio": (),
             "web_search_options": ()},
    "completion": {**_NO_OPS, "best_of": (1,), "echo": (False,), "suffix": ("",)},
}
_TEMPLATE_RESERVED = {"messages", "add_generation_prompt", "bos_token", "eos_token"}
MAX_STOPS = 16
MAX_LOGPROBS = 20


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


@dataclass
class ParsedRequest:
    kind: str  # "chat" or "completion"
    model: str | None
    messages: list[dict] | None  # chat
    prompt: str | list[int] | None  # completion: text or token ids
    max_tokens: int | None  # None: the server's max_new_tokens
    sampling: dict[str, Any]  # the SamplingParams fields the request sets
    stop: list[str] = field(default_factory=list)
    stream: bool = False
    include_usage: bool = False
    chat_template_kwargs: dict = field(default_factory=dict)
    logprobs: int | None = None  # top tokens per position; None: no logprobs


def parse_request(kind: str, body: object) -> ParsedRequest:
    """The request ``body`` (decoded JSON) of a /v1/chat/completions (``kind="chat"``) or
    /v1/completions (``"completion"``) call, checked; APIError(400) naming the first bad field."""
    if not isinstance(body, dict):
        raise bad(f"the request body must be a JSON object, got {type(body).__name__}")
    body = {k: v for k, v in body.items() if v is not None}
    for name, value in body.items():
        if name in FIELDS[kind]:
            continue
        if name in NOT_IMPLEMENTED[kind]:
            neutral = NOT_IMPLEMENTED[kind][name]
            if not any(value == n and type(value) is type(n) or _same_number(value, n) for n in neutral):
                raise bad(f"{name} is not supported by tileinfer" + (f" (only {neutral[0]!r})" if neutral else ""),
                          name, "unsupported_parameter")
            continue
        raise bad(f"unknown field {name!r}", name, "unknown_parameter")
    model = _typed(body, "model", str)
    stream = _typed(body, "stream", bool) or False
    options = _typed(body, "stream_options", dict) or {}
    if options and not stream:
        raise bad("stream_options is only allowed with stream: true", "stream_options")
    for key in options:
        if key != "include_usage":
            raise bad(f"stream_options.{key} is not supported by tileinfer", "stream_options", "unsupported_parameter")
    include_usage = _typed(options, "include_usage", bool, "stream_options.include_usage") or False
    max_tokens = _positive(body, "max_tokens")
    if kind == "chat":
        other = _positive(body, "max_completion_tokens")
        if max_tokens is not None and other is not None and other != max_tokens:
            raise bad("max_tokens and max_completion_tokens differ: give one", "max_completion_tokens")
        max_tokens = other if max_tokens is None else max_tokens
    request = ParsedRequest(kind, model, None, None, max_tokens, _sampling(body), _stops(body), stream, include_usage)
    request.logprobs = _logprobs(kind, body)
    if kind == "chat":
        request.messages = _messages(body)
        kwargs = _typed(body, "chat_template_kwargs", dict) or {}
        reserved = sorted(_TEMPLATE_RESERVED & set(kwargs))
        if reserved:
            raise bad(f"chat_template_kwargs may not set {', '.join(reserved)}", "chat_template_kwargs")
        request.chat_template_kwargs = kwargs
    else:
        request.prompt = _prompt(body)
    return request


def _same_number(value, neutral) -> bool:
    return (isinstance(value, numbers.Real) and not isinstance(value, bool) and isinstance(neutral, numbers.Real)
            and not isinstance(neutral, bool) and value == neutral)


_TYPE_NAMES = {str: "a string", bool: "a boolean", dict: "an object", list: "an array", int: "an integer"}


def _typed(body: dict, name: str, kind: type, param: str | None = None):
    value = body.get(name)
    if value is not None and not isinstance(value, kind):
        raise bad(f"{param or name} must be {_TYPE_NAMES[kind]}, got {type(value).__name__}", param or name)
    return value


def _integer(body: dict, name: str) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool):
        raise bad(f"{name} must be an integer, got {value!r}", name)
    return value


def _positive(body: dict, name: str) -> int | None:
    value = _integer(body, name)
    if value is not None and value < 1:
        raise bad(f"{name} must be >= 1, got {value}", name)
    return value


def _sampling(body: dict) -> dict[str, Any]:
    """The SamplingParams fields the request sets (their ranges are checked by SamplingParams)."""
    out: dict[str, Any] = {}
    for name in ("temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty"):
        value = body.get(name)
        if value is None:
            continue
        if not isinstance(value, numbers.Real) or isinstance(value, bool) or not math.isfinite(value):
            raise bad(f"{name} must be a finite number, got {value!r}", name)
        out[name] = float(value)
    top_k = _integer(body, "top_k")
    if top_k is not None:
        out["top_k"] = 0 if top_k == -1 else top_k  # -1: off, as vLLM spells it
    seed = _integer(body, "seed")
    if seed is not None:
        out["seed"] = seed
    return out


def _logprobs(kind: str, body: dict) -> int | None:
    """Top tokens per position, or None: chat ``logprobs`` (a boolean) with ``top_logprobs``;
    completions ``logprobs`` (an integer)."""
    if kind == "completion":
        value = _integer(body, "logprobs")
        if value is not None and not 0 <= value <= MAX_LOGPROBS:
            raise bad(f"logprobs must be in [0, {MAX_LOGPROBS}], got {value}", "logprobs")
        return value
    wanted = _typed(body, "logprobs", bool) or False
    top = _integer(body, "top_logprobs")
    if top is not None and not 0 <= top <= MAX_LOGPROBS:
        raise bad(f"top_logprobs must be in [0, {MAX_LOGPROBS}], got {top}", "top_logprobs")
    if top and not wanted:
        raise bad("top_logprobs needs logprobs: true", "top_logprobs")
    return (top or 0) if wanted else None


def _stops(body: dict) -> list[str]:
    stop = body.get("stop")
    if stop is None:
        return []
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise bad("stop must be a string or an array of strings", "stop")
    if len(stops) > MAX_STOPS:
        raise bad(f"stop takes at most {MAX_STOPS} strings, got {len(stops)}", "stop")
    if any(s == "" for s in stops):
        raise bad("stop strings must not be empty", "stop")
    return stops


def _messages(body: dict) -> list[dict]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad("messages must be a non-empty array", "messages")
    out = []
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise bad(f"{where} must be an object with a string role", where)
        content = message.get("content")
        if isinstance(content, list):
            texts = []
            for j, part in enumerate(content):
                if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                    raise bad(f"{where}.content[{j}] must be a text part ({{\"type\": \"text\", \"text\": ...}}): "
                              "tileinfer takes text only", f"{where}.content")
                texts.append(part["text"])
            content = "".join(texts)
        elif content is not None and not isinstance(content, str):
            raise bad(f"{where}.content must be a string or an array of text parts", f"{where}.content")
        out.append({**message, "content": content if content is not None else ""})
    return out


def _prompt(body: dict) -> str | list[int]:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return prompt
    if isinstance(prompt, list) and prompt and all(isinstance(p, (str, list)) for p in prompt):
        raise bad("tileinfer takes one prompt per request, not a batch", "prompt")
    raise bad("prompt must be a string or an array of token ids", "prompt")


# -- stop strings ------------------------------------------------------------------------------


class StopMatcher:
    """Cuts streamed text at the first stop string, matched across chunk boundaries: text that
    could be the start of a stop string is held back until the next chunk tells."""

    def __init__(self, stops: list[str]) -> None:
        self.stops = stops
        self.held = ""

    def push(self, text: str) -> tuple[str, bool]:
        """The text that may be sent now, and whether a stop string was found (the text then ends
        right before it, and nothing more may be sent)."""
        if not self.stops:
            return text, False
        buffer = self.held + text
        hits = [i for i in (buffer.find(s) for s in self.stops) if i >= 0]
        if hits:
            self.held = ""
            return buffer[:min(hits)], True
        keep = 0
        for s in self.stops:
            for n in range(min(len(s) - 1, len(buffer)), keep, -1):
                if buffer.endswith(s[:n]):
                    keep = n
                    break
        self.held = buffer[len(buffer) - keep:] if keep else ""
        return buffer[:len(buffer) - keep], False

    def flush(self) -> str:
        """What was held back, at the end of the generation (no stop string came)."""
        held, self.held = self.held, ""
        return held


# -- responses ---------------------------------------------------------------------------------


def new_id(kind: str) -> str:
    return ("chatcmpl-" if kind == "chat" else "cmpl-") + secrets.token_hex(12)


def now() -> int:
    return int(time.time())


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


@dataclass
class Logprob:
    """One generated token for the wire: its text, logprob, and the top tokens' (text, logprob)."""

    token: str
    logprob: float
    top: list[tuple[str, float]] = field(default_factory=list)


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
            "top_logprobs": [_top_dict(e.top) for e in entries], "text_offset": offsets}


def _top_dict(top: list[tuple[str, float]]) -> dict[str, float]:
    """Completions' ``{token: logprob}``, most likely first; of two tokens with the same text (two
    byte pieces decoded alone as U+FFFD) the likelier one."""
    out: dict[str, float] = {}
    for token, logprob in top:
        out.setdefault(token, logprob)
    return out


def response(kind: str, rid: str, created: int, model: str, text: str, finish: str, counts: dict,
             logprobs: list[Logprob] | None = None) -> dict:
    if kind == "chat":
        choice = {"index": 0, "message": {"role": "assistant", "content": text},
                  "logprobs": logprobs_body(kind, logprobs), "finish_reason": finish}
        return {"id": rid, "object": "chat.completion", "created": created, "model": model, "choices": [choice],
                "usage": counts}
    choice = {"index": 0, "text": text, "logprobs": logprobs_body(kind, logprobs), "finish_reason": finish}
    return {"id": rid, "object": "text_completion", "created": created, "model": model, "choices": [choice],
            "usage": counts}


def chunk(kind: str, rid: str, created: int, model: str, *, text: str | None = None, finish: str | None = None,
          role: bool = False, counts: dict | None = None, include_usage: bool = False,
          logprobs: dict | None = None) -> dict:
    """One streamed chunk: a text delta (``role`` on the first chat chunk) with its tokens'
    ``logprobs`` (``logprobs_body``), the finish reason, or (``counts``) the last chunk with usage
    and no choices."""
    if counts is not None:
        choices = []
    elif kind == "chat":
        delta: dict = {"role": "assistant", "content": text or ""} if role else {}
        if text and not role:
            delta["content"] = text
        choices = [{"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}]
    else:
        choices = [{"index": 0, "text": text or "", "logprobs": logprobs, "finish_reason": finish}]
    out = {"id": rid, "object": "chat.completion.chunk" if kind == "chat" else "text_completion", "created": created,
           "model": model, "choices": choices}
    if include_usage:
        out["usage"] = counts
    return out
