"""tileinfer serve's prompt scoring (``echo``), ``n`` choices and ``logit_bias``, through the
official openai client against a real server on localhost (uvicorn in a thread) and raw HTTP for the
errors; every reply compared with the engine's own (a second engine)."""

from __future__ import annotations

import math

import pytest

openai = pytest.importorskip("openai")  # the server's stack: installed by the [test] extra, absent on the GPU machine

import tileinfer  # noqa: E402
from test_server import assert_error, model_id, post  # noqa: E402
from test_server import client, engine, reference, url  # noqa: E402, F401  (its fixtures: a server with its key, engines)

PROMPT = "def add(a, b):\n    return a + b\nclass Point:"


def prompt_tokens(reference, prompt: str) -> list[str]:
    ids = reference.encode_prompt(prompt)
    return [reference.tokenizer.decode([t], skip_special_tokens=False) for t in ids]


def assert_close(values: list, expected: list) -> None:
    assert len(values) == len(expected)
    for v, e in zip(values, expected):
        assert (v is None and e is None) or math.isclose(v, e, abs_tol=1e-5), (values, expected)


def test_echo_returns_the_prompt_and_its_logprobs_then_the_reply(client, engine, reference):
    expected = reference.generate(PROMPT, tileinfer.SamplingParams(max_tokens=4, logprobs=2, prompt_logprobs=2,
                                                                   temperature=0))
    reply = client.completions.create(model=model_id(engine), prompt=PROMPT, max_tokens=4, temperature=0, echo=True,
                                      logprobs=2)
    choice, tokens = reply.choices[0], prompt_tokens(reference, PROMPT)
    assert choice.text == PROMPT + expected.text
    lp = choice.logprobs
    assert lp.tokens[:len(tokens)] == tokens and len(lp.tokens) == len(tokens) + 4
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert_close(lp.token_logprobs, [None] + [p.logprob for p in expected.prompt_logprobs[1:]]
                 + [p.logprob for p in expected.logprobs])
    assert all(len(top) <= 2 for top in lp.top_logprobs[1:])
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(len(lp.tokens))]
    assert reply.usage.prompt_tokens == len(tokens) and reply.usage.completion_tokens == 4


def test_echo_with_max_tokens_0_scores_the_prompt_only(client, engine, reference):
    expected = reference.generate(PROMPT, tileinfer.SamplingParams(max_tokens=1, prompt_logprobs=1))
    reply = client.completions.create(model=model_id(engine), prompt=PROMPT, max_tokens=0, echo=True, logprobs=1)
    choice = reply.choices[0]
    assert choice.text == PROMPT and choice.finish_reason == "length"
    assert_close(choice.logprobs.token_logprobs, [None] + [p.logprob for p in expected.prompt_logprobs[1:]])
    assert reply.usage.completion_tokens == 0 and reply.usage.prompt_tokens == len(expected.prompt_logprobs)


def test_echo_streamed_sends_the_prompt_first(client, engine, reference):
    expected = reference.generate(PROMPT, tileinfer.SamplingParams(max_tokens=5, logprobs=0, prompt_logprobs=0))
    chunks = [c for c in client.completions.create(model=model_id(engine), prompt=PROMPT, max_tokens=5, echo=True,
                                                   logprobs=0, stream=True) if c.choices]
    assert chunks[0].choices[0].text == PROMPT
    assert "".join(c.choices[0].text for c in chunks) == PROMPT + expected.text
    scores = [v for c in chunks if c.choices[0].logprobs for v in c.choices[0].logprobs.token_logprobs]
    assert_close(scores, [None] + [p.logprob for p in expected.prompt_logprobs[1:]]
                 + [p.logprob for p in expected.logprobs])


def test_echo_of_token_ids_and_without_logprobs(client, engine, reference):
    ids = reference.encode_prompt(PROMPT)
    reply = client.completions.create(model=model_id(engine), prompt=ids, max_tokens=3, echo=True)
    expected = reference.generate(ids, tileinfer.SamplingParams(max_tokens=3))
    assert reply.choices[0].text == reference.tokenizer.decode(ids, skip_special_tokens=False) + expected.text
    assert reply.choices[0].logprobs is None


def test_n_choices_take_seeds_seed_plus_index_and_reproduce(client, engine, reference):
    """Two prompts, n=3 sampled choices each: choice c of prompt p is index 3p + c, seed 7 + c; the
    prompt counted once in usage."""
    prompts = ["def add(a, b):", "class Point:"]
    reply = client.completions.create(model=model_id(engine), prompt=prompts, max_tokens=6, n=3, temperature=1.0,
                                      seed=7)
    assert [c.index for c in reply.choices] == list(range(6))
    expected = [reference.generate(p, tileinfer.SamplingParams(max_tokens=6, temperature=1.0, seed=7 + c))
                for p in prompts for c in range(3)]
    assert [c.text for c in reply.choices] == [e.text for e in expected]
    assert len({c.text for c in reply.choices[:3]}) > 1  # the seeds differ
    assert reply.usage.prompt_tokens == sum(len(reference.encode_prompt(p)) for p in prompts)
    assert reply.usage.completion_tokens == sum(len(e.token_ids) for e in expected)
    again = client.completions.create(model=model_id(engine), prompt=prompts, max_tokens=6, n=3, temperature=1.0,
                                      seed=7)
    assert [c.text for c in again.choices] == [c.text for c in reply.choices]


def test_n_chat_choices_streamed_carry_their_index(client, engine, reference):
    messages = [{"role": "user", "content": "hi there"}]
    whole = client.chat.completions.create(model=model_id(engine), messages=messages, max_tokens=6, n=2,
                                           temperature=1.0, seed=3)
    assert [c.index for c in whole.choices] == [0, 1]
    streamed = list(client.chat.completions.create(model=model_id(engine), messages=messages, max_tokens=6, n=2,
                                                   temperature=1.0, seed=3, stream=True))
    roles = [c.choices[0].index for c in streamed if c.choices and c.choices[0].delta.role]
    assert sorted(roles) == [0, 1]
    for i in range(2):
        text = "".join(c.choices[0].delta.content or "" for c in streamed if c.choices and c.choices[0].index == i)
        assert text == whole.choices[i].message.content


def test_logit_bias_forces_and_bans_tokens(client, engine, reference):
    forced = reference.encode_prompt(" return")[0]
    reply = client.completions.create(model=model_id(engine), prompt="x = 1", max_tokens=5, logit_bias={
        str(forced): 100})
    assert reply.choices[0].text == reference.tokenizer.decode([forced] * 5)
    plain = reference.generate("x = 1", tileinfer.SamplingParams(max_tokens=5, temperature=0))
    bias = {t: -100 for t in plain.token_ids}
    banned = reference.generate("x = 1", tileinfer.SamplingParams(max_tokens=5, temperature=0, logit_bias=bias))
    reply = client.completions.create(model=model_id(engine), prompt="x = 1", max_tokens=5, temperature=0,
                                      logit_bias={str(t): -100 for t in plain.token_ids})
    assert reply.choices[0].text == banned.text != plain.text


@pytest.mark.parametrize("path,body,param,words", [
    ("/v1/completions", {"prompt": "hi", "logit_bias": {"x1": 3}}, "logit_bias", "not a token id"),
    ("/v1/completions", {"prompt": "hi", "logit_bias": {"5": 101}}, "logit_bias", "[-100, 100]"),
    ("/v1/completions", {"prompt": "hi", "logit_bias": {"5": "1"}}, "logit_bias.5", "number"),
    ("/v1/completions", {"prompt": "hi", "logit_bias": {"99999": 1}}, "logit_bias", "outside the vocabulary"),
    ("/v1/completions", {"prompt": "hi", "n": 0}, "n", "greater than or equal to 1"),
    ("/v1/completions", {"prompt": "hi", "n": 17}, "n", "less than or equal to 16"),
    ("/v1/completions", {"prompt": ["hi"] * 8, "n": 9}, "n", "more than 64"),
    ("/v1/completions", {"prompt": "hi", "echo": 1}, "echo", "boolean"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": -1, "echo": True}, "max_tokens", "greater than or equal to 0"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "echo": True}, "echo",
     "/v1/completions"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "logit_bias": {"5": -200}},
     "logit_bias", "[-100, 100]"),
])
def test_bad_scoring_fields_are_a_400_naming_them(url, path, body, param, words):
    assert_error(post(url, path, body), 400, param, words)
