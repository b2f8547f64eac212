"""Qwen3's tool calls: the markup a reply writes to call a function,

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

(possibly several, possibly with text around them), parsed as the text streams into OpenAI's
tool calls (``ToolCall``: an id, the function's name, its arguments as JSON text). A call whose
body is not a JSON object with a string ``name`` and an object ``arguments`` is left in the text
as written, tags included; so is a ``<tool_call>`` never closed. The blanks around a call are
dropped.

``call_schema`` is the JSON schema of one call's body, for a reply the grammar forces to be a call
(``tool_choice`` "required" or a named function): such a reply is the body alone, without the
tags (``parse_call``).
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from tileinfer.reasoning import held_prefix

TOOL_CALL, END_TOOL_CALL = "<tool_call>", "</tool_call>"


@dataclass(frozen=True)
class ToolCall:
    """One call: the function's ``name``, its ``arguments`` as JSON text, and an id for the
    ``tool`` message that answers it."""

    name: str
    arguments: str
    id: str = field(default_factory=lambda: "call_" + secrets.token_hex(12))

    def to_openai(self) -> dict:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


def parse_call(body: str) -> ToolCall | None:
    """The call a body (``{"name": ..., "arguments": {...}}``) writes, or None when it is not one."""
    try:
        value = json.loads(body)
    except ValueError:
        return None
    if not (isinstance(value, dict) and isinstance(value.get("name"), str) and value["name"]
            and isinstance(value.get("arguments"), dict)):
        return None
    return ToolCall(value["name"], json.dumps(value["arguments"], ensure_ascii=False))


@dataclass
class Parsed:
    """A piece of a reply's answer: its text, and the calls that closed in it."""

    content: str = ""
    calls: list[ToolCall] = field(default_factory=list)


class ToolCallParser:
    """Splits an answer's text deltas into text and tool calls; ``feed`` each delta, then
    ``finish`` once. A start of ``<tool_call>`` at the end of a delta waits for the next one, a
    call's body until its ``</tool_call>``, and blanks until text follows them."""

    def __init__(self) -> None:
        self._held = ""  # text not yet given out
        self._inside = False  # after a <tool_call>, before its </tool_call>
        self._after_call = False  # the text since the last call is blanks so far
        self._blanks = ""  # the blanks before the open call
        self.calls = 0

    def feed(self, text: str) -> Parsed:
        out = Parsed()
        self._held += text
        while True:
            if self._inside:
                end = self._held.find(END_TOOL_CALL)
                if end < 0:
                    return out
                body, self._held = self._held[:end], self._held[end + len(END_TOOL_CALL):]
                self._inside = False
                call = parse_call(body)
                if call is None:
                    out.content += self._blanks + TOOL_CALL + body + END_TOOL_CALL
                    self._after_call = False
                else:
                    out.calls.append(call)
                    self.calls += 1
                    self._after_call = True
                continue
            start = self._held.find(TOOL_CALL)
            if start >= 0:
                before = self._text(self._held[:start])
                text = before.rstrip()
                out.content += text
                self._blanks = before[len(text):]  # dropped if the call parses
                self._held, self._inside = self._held[start + len(TOOL_CALL):], True
                continue
            keep = held_prefix(self._held, TOOL_CALL)
            text, rest = self._held[:len(self._held) - keep], self._held[len(self._held) - keep:]
            body = text.rstrip()
            out.content += self._text(body)
            self._held = text[len(body):] + rest  # trailing blanks wait for what follows them
            return out

    def finish(self) -> Parsed:
        """What was held back, as text: an unclosed call with its tag, blanks unless after a call."""
        held, self._held = self._held, ""
        if self._inside:
            self._inside = False
            return Parsed(self._blanks + TOOL_CALL + held)
        return Parsed(held.strip() if self._after_call else held)

    def _text(self, text: str) -> str:
        """Text outside the calls; the blanks that follow a call dropped."""
        if self._after_call:
            text = text.lstrip()
            if text:
                self._after_call = False
        return text


def parse_tool_calls(text: str) -> tuple[str, list[ToolCall]]:
    """A whole answer's text (calls and the blanks around them removed) and its calls."""
    parser = ToolCallParser()
    first, last = parser.feed(text), parser.finish()
    return first.content + last.content, first.calls + last.calls


def call_schema(tools: Sequence[Mapping], name: str | None = None) -> dict:
    """The JSON schema of a call's body, ``{"name": ..., "arguments": ...}``, to one of ``tools``
    (OpenAI's ``{"type": "function", "function": {"name", "parameters"}}``), or to the one called
    ``name``; its ``arguments`` match that function's parameters."""
    options = []
    for tool in tools:
        function = tool["function"]
        if name is not None and function["name"] != name:
            continue
        parameters = function.get("parameters") or {"type": "object", "properties": {}}
        options.append({"type": "object", "properties": {"name": {"const": function["name"]}, "arguments": parameters},
                        "required": ["name", "arguments"], "additionalProperties": False})
    if not options:
        raise ValueError(f"no tool is called {name!r}")
    return options[0] if len(options) == 1 else {"anyOf": options}


__all__ = ["END_TOOL_CALL", "Parsed", "TOOL_CALL", "ToolCall", "ToolCallParser", "call_schema", "parse_call",
           "parse_tool_calls"]
