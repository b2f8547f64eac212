"""tileinfer serve and the engine's prefix cache, through the official openai client against a real
server on localhost: ``cache_salt`` keys the reuse (one client's prompt does not speed up another's),
and ``echo`` with ``n`` > 1 scores the prompt once, the later choices reusing its prefill."""

from __future__ import annotations

import math

import pytest

openai = pytest.importorskip("openai")  # the server's stack: installed by the [test] extra, absent on the GPU machine

import tileinfer  # noqa: E402
from tileinfer.errors import UsageError  # noqa: E402
from test_server import assert_error, model_id, post  # noqa: E402
from test_server import client, engine, reference, url  # noqa: E402, F401  (its fixtures: a server, engines)

PROMPT = "import os\nimport sys\nprint(os.path.join(sys.prefix, 'lib'))"


def complete(client, engine, salt: str | None = None, **kw):
    extra = {"cache_salt": salt} if salt is not None else None
    return client.completions.create(model=model_id(engine), prompt=PROMPT, max_tokens=3, temperature=0,
                                     extra_body=extra, **kw)


def test_cache_salt_keys_the_prefix_reuse(client, engine, reference):
    """The same prompt reuses the last request's keys and values only under the same salt (none
    counting as one); the replies are those of a cold prefill either way."""
    replies = [complete(client, engine, salt) for salt in ("alice", "alice", "bob", None, None, "alice", "bob")]
    n = replies[0].usage.prompt_tokens
    assert [r.usage.prompt_tokens_details.cached_tokens for r in replies[1:]] == [n - 1, 0, 0, n - 1, 0, 0]
    expected = reference.generate(PROMPT, tileinfer.SamplingParams(max_tokens=3, temperature=0)).text
    assert {r.choices[0].text for r in replies} == {expected}


def test_cache_salt_in_chat(client, engine):
    messages = [{"role": "user", "content": "hi there"}]
    ask = [client.chat.completions.create(model=model_id(engine), messages=messages, max_tokens=2, temperature=0,
                                          extra_body={"cache_salt": salt}) for salt in ("s1", "s1", "s2")]
    cached = [r.usage.prompt_tokens_details.cached_tokens for r in ask]
    assert cached[1] == ask[1].usage.prompt_tokens - 1 and cached[2] == 0


def test_the_python_api_takes_the_salt(reference):
    params = tileinfer.SamplingParams(max_tokens=2, cache_salt="k")
    reference.generate(PROMPT, params)
    assert reference.generate(PROMPT, params).stats.cached_tokens > 0
    assert reference.generate(PROMPT, tileinfer.SamplingParams(max_tokens=2)).stats.cached_tokens == 0
    with pytest.raises(UsageError, match="cache_salt=''"):
        tileinfer.SamplingParams(cache_salt="")


@pytest.mark.parametrize("salt, words", [("", "at least 1 character"), (5, "string")])
def test_a_bad_cache_salt_is_a_400_naming_it(url, salt, words):
    assert_error(post(url, "/v1/completions", {"prompt": "hi", "cache_salt": salt}), 400, "cache_salt", words)


def test_echo_with_n_scores_the_prompt_once(client, engine, reference):
    """Every choice echoes the same prompt logprobs (the engine's), computed by the first choice's
    prefill: the later choices reuse it from the prefix cache (all but the last prompt token)."""
    reply = client.completions.create(model=model_id(engine), prompt=PROMPT, max_tokens=2, n=3, temperature=1.0,
                                      seed=11, echo=True, logprobs=2)
    expected = reference.generate(PROMPT, tileinfer.SamplingParams(max_tokens=1, prompt_logprobs=2))
    k = len(expected.prompt_logprobs)
    first = reply.choices[0].logprobs
    for choice in reply.choices:
        lp = choice.logprobs
        assert (lp.tokens[:k], lp.token_logprobs[:k], lp.top_logprobs[:k]) == (
            first.tokens[:k], first.token_logprobs[:k], first.top_logprobs[:k])
        assert choice.text.startswith(PROMPT) and len(lp.tokens) == k + 2
    assert first.token_logprobs[0] is None
    assert all(math.isclose(v, e.logprob, abs_tol=1e-5) for v, e in zip(first.token_logprobs[1:k],
                                                                         expected.prompt_logprobs[1:]))
    assert reply.usage.prompt_tokens == k and reply.usage.prompt_tokens_details.cached_tokens == 2 * (k - 1)
    generated = [reference.generate(PROMPT, tileinfer.SamplingParams(max_tokens=2, temperature=1.0, seed=11 + c)).text
                 for c in range(3)]
    assert [c.text[len(PROMPT):] for c in reply.choices] == generated
