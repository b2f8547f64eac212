"""Structured outputs in tileinfer serve, over real HTTP on localhost with the official openai client,
on the shipped model (whose text is noise, whose JSON must not be): response_format json_schema and
json_object, vLLM's guided_choice, guided_regex, guided_json and guided_grammar, the finish reason
"grammar" of a dead end, and a 400 naming the field for each bad constraint."""

from __future__ import annotations

import json
import re

import pytest

httpx = pytest.importorskip("httpx")  # the server's stack: installed by the [test] extra
openai = pytest.importorskip("openai")
jsonschema = pytest.importorskip("jsonschema")
pytest.importorskip("xgrammar")

import tileinfer  # noqa: E402
from conftest import REFERENCE_CPU as BASE  # noqa: E402
from test_server import assert_error, post, running  # noqa: E402

KEY = "sk-structured"
SCHEMA = {"type": "object", "properties": {"city": {"enum": ["Paris", "Oslo"]},
                                           "days": {"type": "integer", "minimum": 1, "maximum": 7}},
          "required": ["city", "days"], "additionalProperties": False}
USER = [{"role": "user", "content": "Plan a trip."}]


@pytest.fixture(scope="module")
def engine():
    return tileinfer.Engine.from_config(overrides=BASE, progress=False)


@pytest.fixture(scope="module")
def url(engine):
    with running(engine, api_key=KEY) as base:
        yield base


@pytest.fixture(scope="module")
def client(url):
    return openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0, timeout=60)


def test_response_format_json_schema_through_the_openai_client(client):
    finished = 0
    for seed in range(3):
        reply = client.chat.completions.create(
            model="target", messages=USER, max_tokens=48, temperature=1.0, seed=seed,
            response_format={"type": "json_schema", "json_schema": {"name": "trip", "schema": SCHEMA, "strict": True}})
        choice = reply.choices[0]
        assert choice.finish_reason in ("stop", "length")
        if choice.finish_reason == "stop":
            finished += 1
            jsonschema.validate(json.loads(choice.message.content), SCHEMA)
    assert finished


def test_the_openai_clients_parse_helper_reads_the_reply(client):
    """``client.chat.completions.parse`` sends a pydantic model's schema and parses the reply."""
    pydantic = pytest.importorskip("pydantic")

    class Trip(pydantic.BaseModel):
        city: str
        days: int

    parsed = []
    for seed in range(4):
        try:
            reply = client.chat.completions.parse(model="target", messages=USER, max_tokens=64, temperature=1.0,
                                                  seed=seed, response_format=Trip)
        except openai.LengthFinishReasonError:  # max_tokens came first: nothing to parse
            continue
        parsed.append(reply.choices[0].message.parsed)
    assert parsed and all(isinstance(trip, Trip) for trip in parsed)


def test_response_format_json_object_streamed(client):
    stream = client.chat.completions.create(model="target", messages=USER, max_tokens=48, stream=True,
                                            response_format={"type": "json_object"})
    pieces, finish = [], None
    for event in stream:
        if event.choices:
            pieces.append(event.choices[0].delta.content or "")
            finish = event.choices[0].finish_reason or finish
    if finish == "stop":
        assert isinstance(json.loads("".join(pieces)), dict)


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_guided_choice_and_regex_through_extra_body(client, path):
    choices = ["north", "south", "east west"]
    for temperature in (0.0, 1.0):
        if path == "/v1/completions":
            text = client.completions.create(model="target", prompt="def go(", max_tokens=16, temperature=temperature,
                                             extra_body={"guided_choice": choices}).choices[0].text
            regex = client.completions.create(model="target", prompt="x = ", max_tokens=16, temperature=temperature,
                                              extra_body={"guided_regex": r"[0-9]{2}\.[0-9]"}).choices[0]
        else:
            text = client.chat.completions.create(model="target", messages=USER, max_tokens=16,
                                                  temperature=temperature,
                                                  extra_body={"guided_choice": choices}).choices[0].message.content
            regex = client.chat.completions.create(model="target", messages=USER, max_tokens=16,
                                                   temperature=temperature,
                                                   extra_body={"guided_regex": r"[0-9]{2}\.[0-9]"}).choices[0]
            regex.text = regex.message.content
        assert text in choices
        assert regex.finish_reason == "stop" and re.fullmatch(r"[0-9]{2}\.[0-9]", regex.text)


def test_guided_json_as_text_and_guided_grammar(url):
    body = {"prompt": "def f(", "max_tokens": 48, "guided_json": json.dumps(SCHEMA), "temperature": 1.0, "seed": 4}
    choice = post(url, "/v1/completions", body, key=KEY).json()["choices"][0]
    if choice["finish_reason"] == "stop":
        jsonschema.validate(json.loads(choice["text"]), SCHEMA)
    body = {"prompt": "def f(", "max_tokens": 16, "guided_grammar": 'root ::= "[" ("a" | "b")+ "]"'}
    choice = post(url, "/v1/completions", body, key=KEY).json()["choices"][0]
    assert choice["finish_reason"] == "length" or re.fullmatch(r"\[[ab]+\]", choice["text"])


def test_a_grammar_with_no_token_left_finishes_with_reason_grammar(url):
    body = {"prompt": "def f(", "max_tokens": 16, "ignore_eos": True, "guided_choice": ["yes", "no"]}
    choice = post(url, "/v1/completions", body, key=KEY).json()["choices"][0]
    assert choice["finish_reason"] == "grammar" and choice["text"] in ("yes", "no")


def test_response_format_text_is_unconstrained(url):
    body = {"messages": USER, "max_tokens": 4, "response_format": {"type": "text"}}
    assert post(url, "/v1/chat/completions", body, key=KEY).status_code == 200


SCHEMA_PARAM = "response_format.json_schema.schema"
BAD = {
    "schema-type": ({"response_format": {"type": "json_schema", "json_schema": {"name": "t", "schema": {"type": "x"}}}},
                    SCHEMA_PARAM, "Unsupported type"),
    "schema-not-object": ({"response_format": {"type": "json_schema", "json_schema": {"name": "t", "schema": [1]}}},
                          SCHEMA_PARAM, "valid dictionary"),
    "no-json-schema": ({"response_format": {"type": "json_schema"}}, "response_format.json_schema", "required"),
    "format-type": ({"response_format": {"type": "yaml"}}, "response_format.type", ""),
    "no-name": ({"response_format": {"type": "json_schema", "json_schema": {"schema": SCHEMA}}},
                "response_format.json_schema.name", "required"),
    "regex": ({"guided_regex": "a("}, "guided_regex", "not a valid regular expression"),
    "regex-engine": ({"guided_regex": "a(?=b)"}, "guided_regex", "Lookahead"),
    "grammar": ({"guided_grammar": "root ::= missing"}, "guided_grammar", "missing"),
    "json-text": ({"guided_json": "{not json"}, "guided_json", "not valid JSON text"),
    "choice": ({"guided_choice": []}, "guided_choice", "non-empty"),
    "two": ({"guided_regex": "a", "guided_choice": ["a"]}, "guided_choice", "give one"),
    "format-and-guided": ({"response_format": {"type": "json_object"}, "guided_regex": "a"}, "guided_regex",
                          "give one"),
}


@pytest.mark.parametrize("case", BAD)
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_a_bad_constraint_is_a_400_naming_the_field(url, case, path):
    fields, param, words = BAD[case]
    body = {"messages": USER} if path == "/v1/chat/completions" else {"prompt": "hi"}
    assert_error(post(url, path, {**body, "max_tokens": 4, **fields}, key=KEY), 400, param, words)


def test_the_openai_client_raises_a_bad_request_naming_the_param(client):
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="target", messages=USER, max_tokens=4,
                                       extra_body={"guided_regex": "a(?=b)"})
    assert caught.value.body["param"] == "guided_regex"


def test_with_thinking_on_the_constraint_starts_after_the_think_block(engine):
    """The shipped template opens no <think> and its vocabulary has no such token: replies are
    constrained from the first token. A template that leaves <think> open is constrained after it."""
    from tileinfer.reasoning import ANSWER, START, THINKING
    from tileinfer.server_structured import thinks_first

    assert not thinks_first(START, engine.tokenizer)
    assert thinks_first(THINKING, engine.tokenizer) and not thinks_first(ANSWER, engine.tokenizer)
