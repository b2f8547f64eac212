"""A chat reply read as Qwen3 writes it: its thinking (``tileinfer.reasoning``), then an answer
that is text and tool calls (``tileinfer.tool_calls``), split as the text streams.

``ReplyFormat`` says how: the state the reply starts in (from the generation prompt), and what
its answer is: text (``TEXT``), text with ``<tool_call>`` markup (``MARKUP``: tools offered), or
the body of one call (``FORCED``: the grammar made the answer a call). ``ChatParser`` turns a
choice's text deltas into ``Delta``s of reasoning, content and calls.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from tileinfer.reasoning import START, ReasoningParser, thinking_mode
from tileinfer.tool_calls import ToolCall, ToolCallParser, parse_call

TEXT, MARKUP, FORCED = "text", "markup", "forced"


@dataclass(frozen=True)
class ReplyFormat:
    """``mode``: where the reply starts (``tileinfer.reasoning.thinking_mode``); ``tools``:
    ``TEXT``, ``MARKUP`` or ``FORCED``; ``parallel`` False: the reply's first call only (OpenAI's
    ``parallel_tool_calls: false``; the markup of the later ones is dropped, as vLLM drops them)."""

    mode: str = START
    tools: str = TEXT
    parallel: bool = True


@dataclass
class Delta:
    """What a piece of a reply adds: thinking, answer text, and the calls that closed in it."""

    reasoning: str = ""
    content: str = ""
    calls: list[ToolCall] = field(default_factory=list)

    def __add__(self, other: "Delta") -> "Delta":
        return Delta(self.reasoning + other.reasoning, self.content + other.content, self.calls + other.calls)

    def __bool__(self) -> bool:
        return bool(self.reasoning or self.content or self.calls)


class ChatParser:
    """One choice's reply, split as its text comes: ``feed`` each delta, then ``finish`` once.
    ``thought``: whether it opened a thinking block; ``calls``: the calls given out so far."""

    def __init__(self, form: ReplyFormat = ReplyFormat()) -> None:
        self.form = form
        self._reasoning = ReasoningParser(form.mode)
        self._tools = ToolCallParser() if form.tools == MARKUP else None
        self._forced: list[str] = []  # a FORCED answer, parsed whole at the end
        self.calls = 0

    @property
    def thought(self) -> bool:
        return self._reasoning.thought

    def feed(self, text: str) -> Delta:
        split = self._reasoning.feed(text)
        return Delta(split.reasoning) + self._answer(split.content, last=False)

    def finish(self) -> Delta:
        split = self._reasoning.finish()
        return Delta(split.reasoning) + self._answer(split.content, last=True)

    def _answer(self, text: str, *, last: bool) -> Delta:
        if self.form.tools == FORCED:
            self._forced.append(text)
            if not last:
                return Delta()
            body = "".join(self._forced)
            call = parse_call(body)
            out = Delta(calls=[call]) if call is not None else Delta(content=body)
        elif self._tools is not None:
            parsed = self._tools.feed(text)
            if last:
                end = self._tools.finish()
                parsed.content += end.content
                parsed.calls += end.calls
            calls = parsed.calls if self.form.parallel else parsed.calls[:max(0, 1 - self.calls)]
            out = Delta(content=parsed.content, calls=calls)
        else:
            out = Delta(content=text)
        self.calls += len(out.calls)
        return out

    def finish_reason(self, engine_reason: str) -> str:
        """OpenAI's finish reason: "tool_calls" for a reply that ended ("stop") having called."""
        return "tool_calls" if self.calls and engine_reason == "stop" else engine_reason


def parse_reply(text: str, form: ReplyFormat = ReplyFormat()) -> tuple[str | None, str | None, list[ToolCall]]:
    """A whole reply's (reasoning, content, calls): reasoning None when it did not think, content
    None when it is empty and the reply called tools."""
    parser = ChatParser(form)
    out = parser.feed(text) + parser.finish()
    content = out.content if out.content or not out.calls else None
    return (out.reasoning if parser.thought else None), content, out.calls


def render_chat(tokenizer, messages: list[dict], *, tools: Sequence[Mapping] | None = None,
                **kwargs) -> tuple[str, ReplyFormat]:
    """``messages`` rendered with the chat template for a reply (``tools`` offered when given,
    ``kwargs`` passed to the template), and how that reply reads: where it starts, from what the
    template writes after the history (rendered a second time without the generation prompt), and
    ``MARKUP`` with tools, else ``TEXT``."""
    if tools:
        kwargs["tools"] = [dict(tool) for tool in tools]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, **kwargs)
    history = tokenizer.apply_chat_template(messages, add_generation_prompt=False, **kwargs)
    mode = thinking_mode(text[len(history):] if text.startswith(history) else "")
    return text, ReplyFormat(mode, MARKUP if tools else TEXT)


def read_reply(generation, form: ReplyFormat):
    """A chat ``tileinfer.Generation`` with its ``reasoning``, ``content`` and (``MARKUP`` or
    ``FORCED``) ``tool_calls`` filled from its text."""
    reasoning, content, calls = parse_reply(generation.text or "", form)
    return dataclasses.replace(generation, reasoning=reasoning, content=content,
                               tool_calls=calls if form.tools != TEXT else None)


__all__ = ["ChatParser", "Delta", "FORCED", "MARKUP", "ReplyFormat", "TEXT", "parse_reply", "read_reply",
           "render_chat"]
