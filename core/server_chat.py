"""A /v1/chat/completions request's prompt, and how its reply is to be read.

The messages (and, unless ``tool_choice`` is "none", the ``tools``) are rendered with the
checkpoint's chat template, ``chat_template_kwargs`` passed to it (Qwen3's ``enable_thinking``).
The text the template adds after the history to open the assistant's turn tells where the reply
starts (``tileinfer.reasoning.thinking_mode``). The reply's answer is text without tools, text
with ``<tool_call>`` markup with tools ("auto"), or, for "required" and a named function, the body
of one call that the grammar forces (``tileinfer.StructuredOutput`` with the JSON schema of
``tileinfer.tool_calls.call_schema``): from the first token, or after the reply's ``</think>``
when it thinks first (``tileinfer.server_structured.thinks_first``, as for ``response_format``).
"none" renders the prompt without the tools, so the model is not offered them, and reads any
markup it writes as text. ``parallel_tool_calls: false`` returns an "auto" reply's first call only
(a forced reply is one call either way).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from tileinfer.chat_output import FORCED, ReplyFormat, render_chat
from tileinfer.errors import UsageError
from tileinfer.openai_api import bad
from tileinfer.reasoning import END_THINK
from tileinfer.server_structured import thinks_first
from tileinfer.server_tools import choice_of
from tileinfer.tool_calls import call_schema


@dataclass
class ChatPrompt:
    """A chat request's prompt ids, how its reply reads, the text after which its answer starts
    (``</think>`` when the reply thinks first, else None: a constraint on the answer starts
    there), and the constraint forcing a tool call (a ``tileinfer.StructuredOutput``, or None)."""

    ids: list[int]
    form: ReplyFormat
    after: str | None = None
    structured: Any = None


@contextmanager
def _template_errors() -> Iterator[None]:
    """A chat template that fails on the messages: APIError(400) naming ``messages``."""
    try:
        yield
    except UsageError as exc:
        raise bad(str(exc), "messages") from None
    except (TypeError, ValueError, KeyError, AttributeError, IndexError) as exc:  # a template meets odd values
        raise bad(f"chat template failed: {type(exc).__name__}: {exc}", "messages") from None


def render(tokenizer, messages: list[dict], kwargs: dict, *, add_generation_prompt: bool = True) -> str:
    """``messages`` rendered with the chat template; APIError(400) naming ``messages`` when the
    template fails on them."""
    with _template_errors():
        return tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, **kwargs)


def template_kwargs(parsed) -> dict[str, Any]:
    """The chat template's variables for ``parsed`` (a ``server_requests.ChatRequest``, or a
    ``TokenizeRequest`` of messages, which renders the same prompt): its ``chat_template_kwargs``
    and, unless ``tool_choice`` is "none", its ``tools``; a 400 naming ``chat_template_kwargs`` when
    they set ``tools``."""
    kind, _ = choice_of(parsed.tools, parsed.tool_choice)
    kwargs = dict(parsed.chat_template_kwargs)
    if "tools" in kwargs:
        raise bad("give the tools in tools, not in chat_template_kwargs", "chat_template_kwargs")
    if parsed.tools and kind != "none":
        kwargs["tools"] = [tool.model_dump(exclude_none=True) for tool in parsed.tools]
    return kwargs


def chat_prompt(engine, parsed) -> ChatPrompt:
    """The prompt of ``parsed`` (a ``server_requests.ChatRequest``) for ``engine``."""
    tokenizer = engine.tokenizer
    kind, name = choice_of(parsed.tools, parsed.tool_choice)
    kwargs = template_kwargs(parsed)
    tools = kwargs.pop("tools", None)
    with _template_errors():
        text, form = render_chat(tokenizer, parsed.template_messages(), tools=tools, **kwargs)
    ids = tokenizer.encode(text, add_special_tokens=False)
    after = END_THINK if thinks_first(form.mode, tokenizer) else None
    if tools is None or kind == "auto":
        return ChatPrompt(ids, dataclasses.replace(form, parallel=parsed.parallel_tool_calls), after)
    try:
        from tileinfer.structured import StructuredOutput
    except ImportError:
        raise bad(f"tool_choice {kind!r} needs structured outputs, which this tileinfer lacks", "tool_choice",
                  "unsupported_parameter") from None
    structured = StructuredOutput(json=call_schema(tools, name), after=after)
    return ChatPrompt(ids, ReplyFormat(form.mode, FORCED), after, structured)


__all__ = ["ChatPrompt", "chat_prompt", "render", "template_kwargs"]
