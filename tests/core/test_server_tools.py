"""Reasoning and tool calls in tileinfer serve's /v1/chat/completions, over real HTTP on localhost
with the official openai client, on the shipped model (whose chat template is Qwen3's).

The shipped model writes Python, never <think> or <tool_call>: to see replies that think and
call, ``Scripted`` stands at the seam the server generates through (``Engine.stream``) and writes
a fixed text in pieces that cut the tags, while everything else (validation, the chat template,
the worker, the parsers, the wire format, the client) is real. The template is checked against
transformers' rendering of the same messages."""

from __future__ import annotations

import dataclasses
import json

import pytest

httpx = pytest.importorskip("httpx")  # the server's stack: installed by the [test] extra, absent on the GPU machine
openai = pytest.importorskip("openai")

import tileinfer  # noqa: E402
from conftest import REFERENCE_CPU as BASE  # noqa: E402
from openai.lib.streaming.chat import ChatCompletionStreamState  # noqa: E402
from test_server import assert_error, running  # noqa: E402
from tileinfer.generation import Chunk  # noqa: E402
from tileinfer.tool_calls import call_schema  # noqa: E402

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"enum": ["Paris", "Oslo"]}}, "required": ["city"],
                   "additionalProperties": False}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}
USER = [{"role": "user", "content": "What is the weather in Paris?"}]
THOUGHT = "<think>\nThe user asks for the weather.\n</think>\n\n"
CALLS = ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
         '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>')


class Scripted:
    """The shipped engine, except that ``stream`` writes ``script`` (in pieces of ``cut``
    characters: every tag falls across two pieces) and records the prompts it was given."""

    def __init__(self, engine, cut: int = 3) -> None:
        self.engine, self.cut = engine, cut
        self.script = ""
        self.prompts: list[str] = []
        self.stats = dataclasses.replace(engine.generate("x", tileinfer.SamplingParams(max_tokens=1)).stats,
                                         finish_reason="eos")

    def __getattr__(self, name):
        return getattr(self.engine, name)

    def stream(self, ids, params):
        self.prompts.append(self.engine.tokenizer.decode(ids, skip_special_tokens=False))
        self.ids = list(ids)
        self.params = params
        pieces = [self.script[i:i + self.cut] for i in range(0, len(self.script), self.cut)]

        def chunks():
            for piece in pieces:
                yield Chunk([5], piece)
            yield Chunk([2], "", stats=self.stats)

        return chunks()


@pytest.fixture(scope="module")
def shipped():
    return tileinfer.Engine.from_config(overrides=BASE, progress=False)


@pytest.fixture(scope="module")
def scripted(shipped):
    return Scripted(shipped)


@pytest.fixture(scope="module")
def url(scripted):
    with running(scripted) as base:
        yield base


@pytest.fixture(scope="module")
def client(url):
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60)


def ask(client, scripted, script: str, **kw):
    scripted.script = script
    return client.chat.completions.create(model="target", messages=kw.pop("messages", USER), max_tokens=64, **kw)


def streamed(client, scripted, script: str, **kw):
    """The chunks of a streamed reply, and the completion the openai client assembles from them."""
    scripted.script = script
    state, chunks = ChatCompletionStreamState(), []
    for chunk in client.chat.completions.create(model="target", messages=kw.pop("messages", USER), max_tokens=64,
                                                stream=True, **kw):
        chunks.append(chunk)
        state.handle_chunk(chunk)
    return chunks, state.get_final_completion()


def test_the_shipped_template_renders_tools_and_thinking_as_transformers_does(shipped):
    from transformers import PreTrainedTokenizerFast

    hf = PreTrainedTokenizerFast.from_pretrained(tileinfer.shipped_model())
    messages = [{"role": "system", "content": "Be brief."}, *USER,
                {"role": "assistant", "content": "", "reasoning_content": "I need the tool.",
                 "tool_calls": [{"id": "call_1", "type": "function",
                                 "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "18 C, sunny"}]
    for kwargs in ({}, {"enable_thinking": False}):
        ours = shipped.tokenizer.apply_chat_template(messages, tools=[WEATHER, TIME], **kwargs)
        assert ours == hf.apply_chat_template(messages, tools=[WEATHER, TIME], tokenize=False,
                                              add_generation_prompt=True, **kwargs)
        assert json.dumps(WEATHER) in ours and "<tool_response>\n18 C, sunny\n</tool_response>" in ours
    plain = [*USER, {"role": "assistant", "content": "Sunny."}, {"role": "user", "content": "Thanks"}]
    assert shipped.tokenizer.apply_chat_template(plain) == "".join(  # as the model was trained (ChatML)
        f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in plain) + "<|im_start|>assistant\n"


def test_reasoning_content_apart_from_the_answer(client, scripted):
    reply = ask(client, scripted, THOUGHT + "It is sunny.")
    message = reply.choices[0].message
    assert (message.reasoning_content, message.content) == ("The user asks for the weather.", "It is sunny.")
    assert reply.choices[0].finish_reason == "stop" and message.tool_calls is None


def test_reasoning_content_streamed(client, scripted):
    chunks, final = streamed(client, scripted, THOUGHT + "It is sunny.")
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    reasoning = [d.model_extra.get("reasoning_content") for d in deltas if d.model_extra.get("reasoning_content")]
    content = [d.content for d in deltas if d.content]
    assert "".join(reasoning) == "The user asks for the weather." and len(reasoning) > 1  # streamed, not held
    assert "".join(content) == "It is sunny."
    assert not any("<" in piece or ">" in piece for piece in reasoning + content)  # no part of a tag shows
    assert final.choices[0].finish_reason == "stop"


def test_no_reasoning_content_when_thinking_is_off(client, scripted):
    reply = ask(client, scripted, THOUGHT + "Hi", extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert scripted.prompts[-1].endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    message = reply.choices[0].message
    assert "reasoning_content" not in message.model_extra and message.content == THOUGHT + "Hi"


def test_tool_calls_parsed_from_the_reply(client, scripted):
    reply = ask(client, scripted, THOUGHT + CALLS, tools=[WEATHER, TIME])
    prompt = scripted.prompts[-1]
    assert "<tools>\n" + json.dumps(WEATHER) + "\n" + json.dumps(TIME) + "\n</tools>" in prompt
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    assert choice.message.reasoning_content == "The user asks for the weather."
    calls = choice.message.tool_calls
    assert [(c.type, c.function.name, json.loads(c.function.arguments)) for c in calls] == [
        ("function", "get_weather", {"city": "Paris"}), ("function", "get_time", {})]
    assert len({c.id for c in calls}) == 2


def test_tool_calls_streamed_as_deltas(client, scripted):
    chunks, final = streamed(client, scripted, "Checking.\n" + CALLS, tools=[WEATHER, TIME])
    deltas = [d for c in chunks if c.choices for d in c.choices[0].delta.tool_calls or ()]
    assert [(d.index, d.id is not None, d.function.name) for d in deltas] == [
        (0, True, "get_weather"), (0, False, None), (1, True, "get_time"), (1, False, None)]
    assert [d.function.arguments for d in deltas] == ["", '{"city": "Paris"}', "", "{}"]
    choice = final.choices[0]  # as the openai client assembles the deltas
    assert choice.finish_reason == "tool_calls" and choice.message.content == "Checking."
    assert [(c.function.name, c.function.arguments) for c in choice.message.tool_calls] == [
        ("get_weather", '{"city": "Paris"}'), ("get_time", "{}")]


@pytest.mark.parametrize("parallel", [False, True, None])
def test_parallel_tool_calls_false_returns_the_first_call_only(client, scripted, parallel):
    """As vLLM does: the later calls are dropped, whole and streamed; true or absent returns all."""
    kw = {} if parallel is None else {"parallel_tool_calls": parallel}
    expected = ["get_weather"] if parallel is False else ["get_weather", "get_time"]
    choice = ask(client, scripted, THOUGHT + CALLS + "\nDone.", tools=[WEATHER, TIME], **kw).choices[0]
    assert [c.function.name for c in choice.message.tool_calls] == expected
    assert choice.finish_reason == "tool_calls" and choice.message.content == "Done."
    chunks, final = streamed(client, scripted, CALLS, tools=[WEATHER, TIME], **kw)
    indices = {d.index for c in chunks if c.choices for d in c.choices[0].delta.tool_calls or ()}
    assert indices == set(range(len(expected)))
    assert [c.function.name for c in final.choices[0].message.tool_calls] == expected


def test_a_forced_call_is_one_call_with_or_without_parallel_calls(client, scripted):
    body = '{"name": "get_time", "arguments": {}}'
    for parallel in (False, True):
        choice = ask(client, scripted, body, tools=[WEATHER, TIME], tool_choice="required",
                     parallel_tool_calls=parallel).choices[0]
        assert scripted.params.structured.json == call_schema([WEATHER, TIME])  # one call's body, not a list
        assert [c.function.name for c in choice.message.tool_calls] == ["get_time"]


@pytest.mark.parametrize("extra", [
    {"tools": [WEATHER, TIME]}, {"tools": [WEATHER], "tool_choice": "none"},
    {"tools": [WEATHER, TIME], "tool_choice": "required", "chat_template_kwargs": {"enable_thinking": False}},
    {"chat_template_kwargs": {"enable_thinking": False}}])
def test_tokenize_renders_the_prompt_chat_completions_generates_from(url, client, scripted, extra):
    """vLLM's /tokenize of messages takes tools and chat_template_kwargs (and tool_choice, whose
    "none" leaves the tools out, as chat does): the same ids as the chat request's prompt."""
    messages = [{"role": "system", "content": "Be brief."}, *USER]
    reply = ask(client, scripted, '{"name": "get_time", "arguments": {}}', messages=messages, extra_body=extra)
    tokens = httpx.post(f"{url}/tokenize", json={"messages": messages, **extra}, timeout=60).json()["tokens"]
    assert tokens == scripted.ids and len(tokens) == reply.usage.prompt_tokens
    assert ("<tools>" in scripted.prompts[-1]) == (extra.get("tool_choice") != "none" and "tools" in extra)
    history = httpx.post(f"{url}/tokenize", json={"messages": messages, "add_generation_prompt": False, **extra},
                         timeout=60).json()["tokens"]
    assert tokens[:len(history)] == history and len(history) < len(tokens)


@pytest.mark.parametrize("body, param", [
    ({"messages": USER, "tool_choice": {"type": "function", "function": {"name": "nope"}}, "tools": [WEATHER]},
     "tool_choice"),
    ({"messages": USER, "tools": [WEATHER], "chat_template_kwargs": {"tools": [WEATHER]}}, "chat_template_kwargs"),
    ({"messages": USER, "tools": [{"type": "function", "function": {"name": "a b"}}]}, "tools[0].function.name"),
    ({"prompt": "hi", "tools": [WEATHER]}, "tools"),
    ({"prompt": "hi", "chat_template_kwargs": {"enable_thinking": False}}, "chat_template_kwargs"),
    ({"prompt": "hi", "add_generation_prompt": False}, "add_generation_prompt"),
    ({"messages": [*USER, {"role": "assistant", "tool_calls": [
        {"type": "function", "function": {"name": "f", "arguments": "x"}}]}]},
     "messages[1].tool_calls[0].function.arguments"),
])
def test_bad_tokenize_fields_are_400s_naming_the_field(url, body, param):
    assert_error(httpx.post(f"{url}/tokenize", json=body, timeout=60), 400, param)


def test_a_call_written_inside_the_thinking_stays_reasoning(client, scripted):
    """As vLLM's qwen3 reasoning parser and hermes tool parser read it: the tool parser reads the
    content only (what follows </think>), so markup in the thinking is thinking, whole and
    streamed, and the calls after </think> are the reply's."""
    inner = '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'
    script = "<think>\nMaybe " + inner + " first.\n</think>\n\n" + CALLS.split("\n<tool_call>")[0]
    choice = ask(client, scripted, script, tools=[WEATHER, TIME]).choices[0]
    assert choice.message.reasoning_content == "Maybe " + inner + " first."
    assert [c.function.name for c in choice.message.tool_calls] == ["get_weather"]
    chunks, final = streamed(client, scripted, "<think>\nMaybe " + inner + "\n</think>\n\nSunny.", tools=[WEATHER])
    assert not any(c.choices and c.choices[0].delta.tool_calls for c in chunks)
    reasoning = "".join(c.choices[0].delta.model_extra.get("reasoning_content") or "" for c in chunks if c.choices)
    assert reasoning == "Maybe " + inner and final.choices[0].message.content == "Sunny."
    assert final.choices[0].finish_reason == "stop"


def test_bad_markup_stays_text(client, scripted):
    text = 'Hmm <tool_call>\n{"name": "get_weather", "arguments": {oops}\n</tool_call>'
    reply = ask(client, scripted, text, tools=[WEATHER])
    assert reply.choices[0].message.content == text and reply.choices[0].message.tool_calls is None
    assert reply.choices[0].finish_reason == "stop"


def test_tool_choice_none_offers_no_tools_and_reads_markup_as_text(client, scripted):
    reply = ask(client, scripted, CALLS, tools=[WEATHER], tool_choice="none")
    assert "<tools>" not in scripted.prompts[-1]
    assert reply.choices[0].message.content == CALLS and reply.choices[0].finish_reason == "stop"


def test_tool_messages_in_the_history(client, scripted):
    history = [*USER, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_9", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
               {"role": "tool", "tool_call_id": "call_9", "content": "18 C"}]
    reply = ask(client, scripted, "It is 18 C.", messages=history, tools=[WEATHER])
    prompt = scripted.prompts[-1]
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>' in prompt
    assert "<|im_start|>user\n<tool_response>\n18 C\n</tool_response><|im_end|>" in prompt
    assert reply.choices[0].message.content == "It is 18 C."


@pytest.mark.parametrize("change, param, words", [
    ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice", "'nope'"),
    ({"tool_choice": "required", "tools": None}, "tool_choice", "needs tools"),
    ({"tool_choice": "sometimes"}, "tool_choice", ""),
    ({"tools": [{"type": "function", "function": {"description": "no name"}}]}, "tools[0].function.name", ""),
    ({"tools": [{"type": "function", "function": {"name": "a b"}}]}, "tools[0].function.name", "pattern"),
    ({"tools": [{"type": "retrieval"}]}, "tools[0].type", ""),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "objekt"}}}]},
     "tools[0].function.parameters", "not a valid JSON schema"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}]},
     "tools[0].function.parameters", "must be \"object\""),
    ({"tools": [WEATHER, WEATHER]}, "tools[1].function.name", "given twice"),
    ({"tool_choice": "required", "tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"x": {"type": "string", "pattern": "(?<=a)b"}}}}}]},
     "tools", ""),  # a schema jsonschema takes but the grammar engine cannot compile (a lookbehind)
    ({"messages": [*USER, {"role": "assistant", "tool_calls": [{"id": "c", "type": "function"}]}]},
     "messages[1].tool_calls[0].function", ""),
    *[({"messages": [*USER, {"role": "assistant", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "get_weather", "arguments": arguments}}]}]},
       "messages[1].tool_calls[0].function.arguments", "JSON text of an object") for arguments in ("{oops", "[1]")],
])
def test_bad_tool_fields_are_400s_naming_the_field(url, change, param, words):
    body = {"messages": USER, "max_tokens": 2, "tools": [WEATHER], **change}
    body = {k: v for k, v in body.items() if v is not None}
    assert_error(httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60), 400, param, words)


def test_a_real_reply_that_does_not_think_is_all_answer(shipped):
    """The shipped model (no stand-in): it writes no <think>, so its reply is all content, as
    Engine.generate writes it from the same prompt, with tools offered."""
    with running(shipped) as base:
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=60)
        reply = client.chat.completions.create(model="target", messages=USER, max_tokens=12, tools=[WEATHER])
    text = shipped.tokenizer.apply_chat_template(USER, tools=[WEATHER])
    expected = shipped.generate(shipped.tokenizer.encode(text, add_special_tokens=False),
                                tileinfer.SamplingParams(max_tokens=12)).text
    assert not expected.lstrip().startswith("<think>") and "<tool_call>" not in expected
    message = reply.choices[0].message
    assert message.content == expected and "reasoning_content" not in message.model_extra
    assert reply.choices[0].finish_reason in ("stop", "length")


@pytest.mark.parametrize("thinking, after", [(None, None), (False, None), ("open", "</think>")])
def test_a_forced_call_is_a_grammar_on_the_answer(client, scripted, monkeypatch, thinking, after):
    """The grammar starts after </think> where the reply thinks first (here: a template that leaves
    <think> open); the shipped model's vocabulary has no <think> token, so with Qwen3's template and
    thinking on its reply cannot open a thinking block in one token and is held from the start."""
    kwargs = {"chat_template_kwargs": {"enable_thinking": thinking}} if thinking is False else {}
    if thinking == "open":
        monkeypatch.setattr(scripted.tokenizer, "chat_template",
                            scripted.tokenizer.chat_template + "{% if add_generation_prompt %}<think>\n{% endif %}")
    body = '{"name": "get_weather", "arguments": {"city": "Oslo"}}'
    reply = ask(client, scripted, ("The user asks.\n</think>\n\n" if thinking == "open" else "") + body,
                tools=[WEATHER, TIME],
                tool_choice="required", extra_body=kwargs)
    structured = scripted.params.structured
    assert (structured.json, structured.after) == (call_schema([WEATHER, TIME]), after)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    assert [(c.function.name, c.function.arguments) for c in choice.message.tool_calls] == [
        ("get_weather", '{"city": "Oslo"}')]
    ask(client, scripted, body, tools=[WEATHER, TIME], tool_choice={"type": "function", "function": {"name": "get_time"}})
    assert scripted.params.structured.json == call_schema([TIME])


def test_response_format_and_a_forced_call_do_not_mix(url):
    body = {"messages": USER, "tools": [WEATHER], "tool_choice": "required", "response_format": {"type": "json_object"}}
    r = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60)
    if r.json()["error"]["param"] == "response_format":
        pytest.skip("response_format is not served yet")
    assert_error(r, 400, "tool_choice", "give one")


@pytest.mark.parametrize("tool_choice, stream, thinking", [
    ("required", False, False), ("required", True, None),
    ({"type": "function", "function": {"name": "get_weather"}}, False, None),
    ({"type": "function", "function": {"name": "get_weather"}}, True, False)])
def test_the_grammar_makes_the_shipped_model_call(shipped, tool_choice, stream, thinking):
    """No stand-in: the shipped model writes Python, yet with tool_choice "required" or a named
    function its reply is a call whose arguments match the function's parameters (thinking on or
    off: its vocabulary cannot open a thinking block, so the grammar holds it from the start)."""
    pytest.importorskip("xgrammar")
    jsonschema = pytest.importorskip("jsonschema")
    with running(shipped) as base:
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=60)
        kw = dict(model="target", messages=USER, max_tokens=48, tools=[WEATHER, TIME], tool_choice=tool_choice,
                  extra_body={"chat_template_kwargs": {"enable_thinking": thinking}} if thinking is False else None)
        if stream:
            state = ChatCompletionStreamState()
            for chunk in client.chat.completions.create(stream=True, **kw):
                state.handle_chunk(chunk)
            reply = state.get_final_completion()
        else:
            reply = client.chat.completions.create(**kw)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls" and not choice.message.content
    (call,) = choice.message.tool_calls
    tool = {"get_weather": WEATHER, "get_time": TIME}[call.function.name]
    jsonschema.validate(json.loads(call.function.arguments), tool["function"]["parameters"])
    if isinstance(tool_choice, dict):
        assert call.function.name == "get_weather"
