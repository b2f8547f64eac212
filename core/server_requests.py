"""The request bodies of ``tileinfer serve``, checked by pydantic models: a body is decoded
(``decode_json``: JSON, at most ``MAX_DEPTH`` levels deep) and validated by its endpoint's model
(``validate``), and any problem is an ``APIError(400)`` naming the field in ``param``
(``messages[0].role``): a wrong type or value, an unknown field (code ``unknown_parameter``), or an
OpenAI field tileinfer does not implement (``best_of`` > 1, ``suffix``, ``echo`` in chat, ...:
code ``unsupported_parameter``) unless it has its no-op value (``best_of: 1``, ``echo: false``).
``n`` (choices per prompt) and ``logit_bias`` (string token ids) are OpenAI's; ``echo`` and
``max_tokens`` 0 with it score a completion request's prompt (``CompletionRequest``).

Besides OpenAI's fields, the generation requests take vLLM's ``top_k``, ``min_p``,
``repetition_penalty``, ``stop_token_ids``, ``ignore_eos``, ``min_tokens``,
``include_stop_str_in_output``, ``skip_special_tokens`` and ``cache_salt``
(``tileinfer.SamplingParams`` fields), the structured-output fields (``response_format``, vLLM's
``guided_json``, ``guided_regex``, ``guided_choice``, ``guided_grammar``:
``tileinfer.server_structured``), and chat's ``chat_template_kwargs``; chat's ``tools`` and
``tool_choice`` are ``tileinfer.server_tools``', ``parallel_tool_calls`` ``tileinfer.server_chat``'s.

Types are strict (``"1.2"`` is not a number, ``1`` is not a boolean; an integral float such as
``2.0`` counts as the integer 2) and ``null`` counts as absent, as in OpenAI's API. The sampling
values' ranges are checked by ``tileinfer.SamplingParams``, whose error names the field too.
"""

from __future__ import annotations

import json
import numbers
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (BaseModel, BeforeValidator, ConfigDict, Field, Strict, ValidationError, field_validator,
                      model_validator)
from pydantic_core import PydanticCustomError

from tileinfer.openai_api import bad
from tileinfer.server_structured import ResponseFormat, structured_request
from tileinfer.server_tools import MessageToolCall, Tool, ToolChoice, check_tool_choice

MAX_DEPTH = 64  # nesting levels of a request body
MAX_STOPS = 16
MAX_LOGPROBS = 20
MAX_PROMPTS = 64  # prompts in one /v1/completions batch (times n: choices in one request)
MAX_N = 16  # choices per prompt


def _whole(value: Any) -> Any:
    return int(value) if isinstance(value, float) and value.is_integer() else value


Int = Annotated[int, BeforeValidator(_whole), Strict()]
Number = Annotated[float, Field(allow_inf_nan=False)]
TopN = Annotated[Int, Field(ge=0, le=MAX_LOGPROBS)]


def decode_json(body: bytes) -> Any:
    """The decoded JSON of a request body; APIError(400) for text that is not JSON (NaN and
    Infinity included) or that nests deeper than ``MAX_DEPTH``."""
    try:
        value = json.loads(body, parse_constant=_no_constant)
    except RecursionError:
        raise bad(f"the request body nests more than {MAX_DEPTH} levels deep") from None
    except ValueError:  # not JSON, not UTF-8, or a number too long to convert
        raise bad("the request body is not valid JSON") from None
    level = [value]
    for _ in range(MAX_DEPTH):
        level = [v for item in level if isinstance(item, (dict, list))
                 for v in (item.values() if isinstance(item, dict) else item)]
        if not level:
            return value
    raise bad(f"the request body nests more than {MAX_DEPTH} levels deep")


def _no_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")


def validate(model: type[BaseModel], body: Any) -> Any:
    """``body`` checked into ``model``; APIError(400) naming the first bad field."""
    if not isinstance(body, dict):
        raise bad(f"the request body must be a JSON object, got {type(body).__name__}")
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        error = exc.errors(include_url=False)[0]
        param = _param(error["loc"])
        if error["type"] == "extra_forbidden":
            raise bad(f"unknown field {param!r}", param, "unknown_parameter") from None
        if error["type"] == "missing":
            raise bad(f"{param} is required", param) from None
        raise bad(f"{param}: {error['msg']}", param) from None


def _param(loc: tuple) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


class _Body(BaseModel):
    """Strict fields, no unknown ones, ``null`` as absent; ``NOT_IMPLEMENTED`` maps an OpenAI field
    tileinfer refuses to its accepted no-op values."""

    model_config = ConfigDict(extra="forbid", strict=True)
    NOT_IMPLEMENTED: ClassVar[dict[str, tuple]] = {}

    @model_validator(mode="before")
    @classmethod
    def _absent_and_unimplemented(cls, body: Any) -> Any:
        if not isinstance(body, dict):
            return body
        body = {k: v for k, v in body.items() if v is not None}
        for name, neutral in cls.NOT_IMPLEMENTED.items():
            if name in body:
                value = body.pop(name)
                if not any(_same(value, n) for n in neutral):
                    raise bad(f"{name} is not supported by tileinfer" + (f" (only {neutral[0]!r})" if neutral else ""),
                              name, "unsupported_parameter")
        return body


def _same(value: Any, neutral: Any) -> bool:
    if isinstance(value, numbers.Real) and isinstance(neutral, numbers.Real):
        return isinstance(value, bool) == isinstance(neutral, bool) and value == neutral
    return type(value) is type(neutral) and value == neutral


class StreamOptions(_Body):
    include_usage: bool = False


class Message(_Body):
    """A chat message: ``content`` a string or an array of text parts (joined), or absent ("")."""

    role: Literal["system", "user", "assistant", "tool"]
    content: str = ""
    name: str | None = None
    tool_call_id: str | None = None
    tool_calls: list[MessageToolCall] | None = None
    reasoning_content: str | None = None

    @field_validator("content", mode="before")
    @classmethod
    def _text(cls, content: Any) -> Any:
        if not isinstance(content, list):
            return content
        for part in content:
            if not (isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)):
                raise PydanticCustomError("text_only", 'a content part must be {"type": "text", "text": ...}: '
                                          "tileinfer takes text only")
        return "".join(part["text"] for part in content)


class _Generation(_Body):
    """The fields /v1/chat/completions and /v1/completions share."""

    NOT_IMPLEMENTED: ClassVar[dict[str, tuple]] = {}
    SAMPLING: ClassVar[tuple[str, ...]] = ("temperature", "top_p", "top_k", "min_p", "seed", "presence_penalty",
                                           "frequency_penalty", "repetition_penalty")

    model: str | None = None
    max_tokens: Int | None = Field(None, ge=1)
    temperature: Number | None = None
    top_p: Number | None = None
    top_k: Int | None = Field(None, ge=-1)
    min_p: Number | None = None
    seed: Int | None = None
    presence_penalty: Number | None = None
    frequency_penalty: Number | None = None
    repetition_penalty: Number | None = None
    stop: list[str] = Field(default_factory=list, max_length=MAX_STOPS)
    stop_token_ids: list[Annotated[Int, Field(ge=0)]] = Field(default_factory=list)
    ignore_eos: bool = False
    min_tokens: Int = Field(0, ge=0)
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None  # OpenAI's end-user id for abuse monitoring: no effect
    n: Int = Field(1, ge=1, le=MAX_N)
    logit_bias: dict[str, Number] = Field(default_factory=dict)
    response_format: ResponseFormat | None = None  # the structured-output fields: tileinfer.server_structured
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    cache_salt: str | None = Field(None, min_length=1)  # vLLM's: keys the prefix reuse (tileinfer.prefix_cache)

    @field_validator("logit_bias")
    @classmethod
    def _token_keys(cls, bias: dict[str, float]) -> dict[str, float]:
        for key in bias:
            if not (key.isascii() and key.isdigit()):
                raise PydanticCustomError("token_id", "the key {key} is not a token id (a string of digits)",
                                          {"key": json.dumps(key)})
        return bias

    @field_validator("stop", mode="before")
    @classmethod
    def _one_or_many(cls, stop: Any) -> Any:
        stops = [stop] if isinstance(stop, str) else stop
        if isinstance(stops, list) and "" in stops:
            raise PydanticCustomError("empty_stop", "stop strings must not be empty")
        return stops

    @model_validator(mode="after")
    def _stream_options(self):
        if self.stream_options is not None and "include_usage" in self.stream_options.model_fields_set \
                and not self.stream:
            raise bad("stream_options is only allowed with stream: true", "stream_options")
        return self

    @property
    def include_usage(self) -> bool:
        return self.stream and self.stream_options is not None and self.stream_options.include_usage

    def params(self) -> dict[str, Any]:
        """The ``tileinfer.SamplingParams`` fields of the request: the sampling values it sets (the
        others take the engine's defaults; ``top_k: -1`` is off, as vLLM spells it), its length,
        stops and logprobs."""
        out = {name: getattr(self, name) for name in self.SAMPLING if getattr(self, name) is not None}
        if out.get("top_k") == -1:
            out["top_k"] = 0
        return {**out, "max_tokens": self.max_tokens, "stop": self.stop, "stop_token_ids": self.stop_token_ids,
                "ignore_eos": self.ignore_eos, "min_tokens": self.min_tokens,
                "include_stop_str_in_output": self.include_stop_str_in_output,
                "skip_special_tokens": self.skip_special_tokens, "logprobs": self.top_n,
                "logit_bias": {int(k): v for k, v in self.logit_bias.items()} or None,
                "structured": structured_request(self)[0], "cache_salt": self.cache_salt}


class ChatRequest(_Generation):
    NOT_IMPLEMENTED: ClassVar[dict[str, tuple]] = {
        **_Generation.NOT_IMPLEMENTED, "functions": ([],), "function_call": ("none",),
        "store": (False,),
        "metadata": ({},), "modalities": (["text"],), "reasoning_effort": (), "service_tier": ("auto", "default"),
        "prediction": (), "audio": (), "web_search_options": ()}
    TEMPLATE_RESERVED: ClassVar[frozenset] = frozenset({"messages", "add_generation_prompt", "bos_token", "eos_token"})

    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: Int | None = Field(None, ge=1)
    chat_template_kwargs: dict[str, Any] = Field(default_factory=dict)
    logprobs: bool = False
    top_logprobs: TopN | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool = True  # false: the reply's first call only (tileinfer.server_chat)

    @model_validator(mode="before")
    @classmethod
    def _no_echo(cls, body: Any) -> Any:
        if isinstance(body, dict) and body.get("echo") not in (None, False):
            raise bad("echo is not supported in chat completions: score a prompt with /v1/completions "
                      "(echo with logprobs)", "echo", "unsupported_parameter")
        if isinstance(body, dict):
            body = {k: v for k, v in body.items() if k != "echo"}
        return body

    @model_validator(mode="after")
    def _consistent(self):
        if None not in (self.max_tokens, self.max_completion_tokens) and self.max_tokens != self.max_completion_tokens:
            raise bad("max_tokens and max_completion_tokens differ: give one", "max_completion_tokens")
        self.max_tokens = self.max_tokens or self.max_completion_tokens
        if self.top_logprobs and not self.logprobs:
            raise bad("top_logprobs needs logprobs: true", "top_logprobs")
        reserved = sorted(self.TEMPLATE_RESERVED & set(self.chat_template_kwargs))
        if reserved:
            raise bad(f"chat_template_kwargs may not set {', '.join(reserved)}", "chat_template_kwargs")
        check_tool_choice(self.tools, self.tool_choice)
        return self

    @property
    def top_n(self) -> int | None:
        """Top tokens per position, or None: no logprobs."""
        return (self.top_logprobs or 0) if self.logprobs else None

    def template_messages(self) -> list[dict]:
        return [m.model_dump(exclude_none=True) for m in self.messages]


class CompletionRequest(_Generation):
    """``prompt``: a string or token ids, or an array of either (a batch: ``n`` choices per prompt).
    ``echo``: each choice's text and logprobs start with its prompt's (the prompt tokens' logprobs,
    the first one null, computed in the prefill: ``SamplingParams.prompt_logprobs``); ``max_tokens``
    0 is allowed with it (the prompt scored, nothing generated)."""

    NOT_IMPLEMENTED: ClassVar[dict[str, tuple]] = {**_Generation.NOT_IMPLEMENTED, "best_of": (1,), "suffix": ("",)}

    prompt: list[str | list[int]] = Field(max_length=MAX_PROMPTS)
    logprobs: TopN | None = None
    echo: bool = False
    max_tokens: Int | None = Field(None, ge=0)

    @model_validator(mode="after")
    def _echo_and_choices(self):
        if self.max_tokens == 0 and not self.echo:
            raise bad("max_tokens: 0 is only allowed with echo (the prompt scored, nothing generated)", "max_tokens")
        if len(self.prompt) * self.n > MAX_PROMPTS:
            raise bad(f"n: {len(self.prompt)} prompts x n={self.n} choices is more than {MAX_PROMPTS}", "n")
        return self

    @property
    def generates(self) -> bool:
        """Whether the reply has generated text (not ``echo`` with ``max_tokens`` 0)."""
        return self.max_tokens != 0

    def params(self) -> dict[str, Any]:
        """``_Generation.params`` with the prompt's logprobs when ``echo`` asks for logprobs; ``max_tokens``
        0 runs one token, which the reply leaves out (``generates``)."""
        out = super().params()
        if self.max_tokens == 0:
            out["max_tokens"] = 1
        if self.echo and self.logprobs is not None:
            out["prompt_logprobs"] = self.logprobs
        return out

    @field_validator("prompt", mode="before")
    @classmethod
    def _batch(cls, prompt: Any) -> Any:
        if isinstance(prompt, str) or _token_ids(prompt):
            return [prompt]
        if isinstance(prompt, list) and prompt and all(isinstance(p, str) or _token_ids(p) for p in prompt):
            return prompt
        raise PydanticCustomError("prompt", "prompt must be a string, an array of token ids, or an array of either")

    @property
    def top_n(self) -> int | None:
        return self.logprobs


def _token_ids(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(t, int) and not isinstance(t, bool)
                                                           for t in value)


class TokenizeRequest(_Body):
    """vLLM's /tokenize: a ``prompt``, or chat ``messages`` rendered with the chat template as
    /v1/chat/completions renders them (``chat_template_kwargs``, ``tools``; and ``tool_choice``,
    whose "none" leaves the tools out, as chat does)."""

    CHAT_ONLY: ClassVar[tuple[str, ...]] = ("add_generation_prompt", "chat_template_kwargs", "tools", "tool_choice")

    model: str | None = None
    prompt: str | None = None
    messages: list[Message] | None = None
    add_special_tokens: bool | None = None  # default: true for a prompt, false for messages (as vLLM)
    add_generation_prompt: bool = True
    chat_template_kwargs: dict[str, Any] = Field(default_factory=dict)
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    return_token_strs: bool = False

    @model_validator(mode="after")
    def _one_input(self):
        if self.prompt is None and self.messages is None:
            raise bad("prompt is required (or messages)", "prompt")
        if self.prompt is not None and self.messages is not None:
            raise bad("give prompt or messages, not both")
        if self.prompt is not None:
            for name in self.CHAT_ONLY:
                if name in self.model_fields_set:
                    raise bad(f"{name} is only allowed with messages (a prompt is not rendered)", name)
        reserved = sorted(ChatRequest.TEMPLATE_RESERVED & set(self.chat_template_kwargs))
        if reserved:
            raise bad(f"chat_template_kwargs may not set {', '.join(reserved)}", "chat_template_kwargs")
        check_tool_choice(self.tools, self.tool_choice)
        return self

    def template_messages(self) -> list[dict]:
        return [m.model_dump(exclude_none=True) for m in self.messages]


class DetokenizeRequest(_Body):
    model: str | None = None
    tokens: list[Annotated[Int, Field(ge=0)]]


__all__ = ["ChatRequest", "CompletionRequest", "DetokenizeRequest", "MAX_DEPTH", "MAX_LOGPROBS", "MAX_PROMPTS",
           "MAX_STOPS", "Message", "TokenizeRequest", "decode_json", "validate"]
