"""The tool-call parser (tileinfer.tool_calls) and a chat reply's assembly (tileinfer.chat_output):
Qwen3's <tool_call> markup parsed into calls whole and in pieces cut at every split point, bad
markup left as text, the schema of a forced call checked with jsonschema."""

from __future__ import annotations

import json

import jsonschema
import pytest

from tileinfer.chat_output import FORCED, MARKUP, TEXT, ChatParser, ReplyFormat, parse_reply
from tileinfer.reasoning import START
from tileinfer.tool_calls import ToolCallParser, call_schema, parse_call, parse_tool_calls

WEATHER = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n</tool_call>'
TIME = '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'
CALLS = [("get_weather", {"city": "Paris", "unit": "celsius"}), ("get_time", {})]

CASES = [  # (text, content, calls)
    (WEATHER + "\n" + TIME, "", CALLS),
    ("Let me check.\n" + WEATHER + "\n" + TIME + "\n\nThat is all.", "Let me check.That is all.", CALLS),
    ("No call here: x < y and <tool> tags.\n", "No call here: x < y and <tool> tags.\n", []),
    ('a <tool_call>\n{"name": "f", "arguments": {oops}\n</tool_call> b',
     'a <tool_call>\n{"name": "f", "arguments": {oops}\n</tool_call> b', []),
    ('<tool_call>\n{"name": "f", "arguments": "not an object"}\n</tool_call>',
     '<tool_call>\n{"name": "f", "arguments": "not an object"}\n</tool_call>', []),
    ("Calling: " + WEATHER + ' then <tool_call>\n{"name": "g", "argu', "Calling:then <tool_call>\n"
     '{"name": "g", "argu', CALLS[:1]),
    ("<tool_ca", "<tool_ca", []),
]


def calls_of(calls) -> list[tuple[str, dict]]:
    return [(c.name, json.loads(c.arguments)) for c in calls]


@pytest.mark.parametrize("text, content, calls", CASES, ids=range(len(CASES)))
def test_whole(text, content, calls):
    got_content, got_calls = parse_tool_calls(text)
    assert (got_content, calls_of(got_calls)) == (content, calls)


@pytest.mark.parametrize("text, content, calls", CASES, ids=range(len(CASES)))
def test_every_split(text, content, calls):
    for i in range(len(text) + 1):
        for j in range(i, len(text) + 1, 3):
            parser = ToolCallParser()
            parts = [parser.feed(p) for p in (text[:i], text[i:j], text[j:])] + [parser.finish()]
            got = "".join(p.content for p in parts), calls_of([c for p in parts for c in p.calls])
            assert got == (content, calls), (i, j)


def test_a_call_comes_out_when_its_markup_closes():
    parser = ToolCallParser()
    assert parser.feed("Sure.\n<tool_call>\n").content == "Sure."
    assert parser.feed('{"name": "get_time", "arguments": {}}\n').calls == []  # not closed yet
    done = parser.feed("</tool_call>")
    assert calls_of(done.calls) == [("get_time", {})] and done.content == ""


def test_call_ids_differ_and_serialise_as_openai():
    (a, b) = parse_tool_calls(TIME + TIME)[1]
    assert a.id != b.id and a.id.startswith("call_")
    assert a.to_openai() == {"id": a.id, "type": "function", "function": {"name": "get_time", "arguments": "{}"}}


def test_parse_call_needs_a_name_and_object_arguments():
    assert parse_call('{"name": "f", "arguments": {"x": [1, 2]}}').arguments == '{"x": [1, 2]}'
    for bad in ('{"name": "", "arguments": {}}', '{"arguments": {}}', '["f", {}]', '{"name": "f"}', "{"):
        assert parse_call(bad) is None, bad


def test_reply_with_thinking_and_calls():
    text = "<think>\nThe user wants the weather.\n</think>\n\n" + WEATHER + "\n" + TIME
    reasoning, content, calls = parse_reply(text, ReplyFormat(START, MARKUP))
    assert (reasoning, content, calls_of(calls)) == ("The user wants the weather.", None, CALLS)
    for i in range(len(text) + 1):  # a call written in the thinking is thinking, not a call
        parser = ChatParser(ReplyFormat(START, MARKUP))
        deltas = [parser.feed(text[:i]), parser.feed(text[i:]), parser.finish()]
        assert "".join(d.reasoning for d in deltas) == "The user wants the weather."
        assert calls_of([c for d in deltas for c in d.calls]) == CALLS
        assert parser.finish_reason("stop") == "tool_calls" and parser.finish_reason("length") == "length"


def test_markup_is_text_without_tools():
    reasoning, content, calls = parse_reply(WEATHER, ReplyFormat(START, TEXT))
    assert (reasoning, content, calls) == (None, WEATHER, [])


TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city.",
                                            "parameters": {"type": "object", "required": ["city"],
                                                           "properties": {"city": {"type": "string"},
                                                                          "unit": {"enum": ["celsius", "kelvin"]}}}}},
         {"type": "function", "function": {"name": "get_time"}}]


def test_forced_reply_is_one_call_body():
    body = '{"name": "get_weather", "arguments": {"city": "Oslo"}}'
    jsonschema.validate(json.loads(body), call_schema(TOOLS))
    jsonschema.validate(json.loads(body), call_schema(TOOLS, "get_weather"))
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(json.loads(body), call_schema(TOOLS, "get_time"))
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"name": "get_weather", "arguments": {"unit": "kelvin"}}, call_schema(TOOLS))
    jsonschema.validate({"name": "get_time", "arguments": {}}, call_schema(TOOLS))
    reasoning, content, calls = parse_reply("<think>\nhm\n</think>\n\n" + body, ReplyFormat(START, FORCED))
    assert (reasoning, content, calls_of(calls)) == ("hm", None, [("get_weather", {"city": "Oslo"})])
    assert parse_reply('{"name": "get_weather", "argu', ReplyFormat(START, FORCED))[1:] == \
        ('{"name": "get_weather", "argu', [])  # cut off by max_tokens: left as text
    with pytest.raises(ValueError, match="no tool is called 'nope'"):
        call_schema(TOOLS, "nope")
