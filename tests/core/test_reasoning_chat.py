"""Engine.chat reads its reply as the server does: reasoning, content and tool calls, with tools
and chat_template_kwargs passed to the chat template (the shipped model's, which is Qwen3's)."""

from __future__ import annotations

import dataclasses
import json

import pytest

import tileinfer
from conftest import REFERENCE_CPU as BASE
from tileinfer.generation import Chunk
from tileinfer.errors import UsageError

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
USER = [{"role": "user", "content": "Weather in Oslo?"}]


@pytest.fixture(scope="module")
def shipped():
    return tileinfer.Engine.from_config(overrides=BASE, progress=False)


def test_tools_reach_the_template_and_a_plain_reply_is_content(shipped):
    params = tileinfer.SamplingParams(max_tokens=8)
    reply = shipped.chat(USER, params, tools=[WEATHER])
    text = shipped.tokenizer.apply_chat_template(USER, tools=[WEATHER])
    assert reply.stats.prompt_tokens == len(shipped.tokenizer.encode(text, add_special_tokens=False))
    expected = shipped.generate(shipped.tokenizer.encode(text, add_special_tokens=False), params)
    assert (reply.text, reply.content, reply.reasoning, reply.tool_calls) == (expected.text, expected.text, None, [])
    no_tools = shipped.chat(USER, params, chat_template_kwargs={"enable_thinking": False})
    assert no_tools.stats.prompt_tokens == len(shipped.tokenizer.encode(
        shipped.tokenizer.apply_chat_template(USER, enable_thinking=False), add_special_tokens=False))
    assert no_tools.tool_calls is None


def test_a_reply_that_thinks_and_calls(shipped, monkeypatch):
    script = ['<think>\nOslo, so the', ' tool.\n</th', 'ink>\n\n<tool_call>\n{"name": "get_weather", ',
              '"arguments": {"city": "Oslo"}}\n</tool_call>']
    stats = dataclasses.replace(shipped.generate("x", tileinfer.SamplingParams(max_tokens=1)).stats,
                                finish_reason="eos")
    monkeypatch.setattr(shipped, "_stream", lambda ids, params: iter(
        [Chunk([5], piece) for piece in script] + [Chunk([2], "", stats=stats)]))
    reply = shipped.chat(USER, tools=[WEATHER])
    assert (reply.reasoning, reply.content) == ("Oslo, so the tool.", None)
    assert [(c.name, json.loads(c.arguments)) for c in reply.tool_calls] == [("get_weather", {"city": "Oslo"})]
    assert reply.to_dict()["tool_calls"][0]["function"]["name"] == "get_weather"


@pytest.mark.parametrize("kw, words", [
    ({"tools": {"type": "function"}}, "tools must be a list"),
    ({"tools": [{"type": "function", "function": {}}]}, r"tools\[0\] must be"),
    ({"chat_template_kwargs": {"tools": []}}, "may not set tools"),
    ({"chat_template_kwargs": ["enable_thinking"]}, "must be a mapping"),
])
def test_bad_tools_and_template_kwargs(shipped, kw, words):
    with pytest.raises(UsageError, match=words):
        shipped.chat(USER, **kw)
