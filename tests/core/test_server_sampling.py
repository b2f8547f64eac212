"""tileinfer serve's penalties and logprobs, through the official openai client and raw HTTP; the
engine's logprobs against transformers' logits of the same sequence."""

from __future__ import annotations

import math

import pytest
import torch

openai = pytest.importorskip("openai")  # the server's stack: installed by the [test] extra, absent on the GPU machine

import tileinfer  # noqa: E402
from conftest import REFERENCE_CPU as BASE  # noqa: E402
from test_server import assert_error, model_id, post  # noqa: E402
from test_server import client, engine, reference, url  # noqa: E402, F401  (its fixtures: a server with its key, engines)
from tileinfer.interfaces import SamplingParams  # noqa: E402

PENALTIES = dict(presence_penalty=0.6, frequency_penalty=0.4, repetition_penalty=1.3)


def test_penalties_per_request_match_the_engine(client, engine, reference):
    expected = reference.generate("import os", max_new_tokens=16, sampling=SamplingParams(**PENALTIES)).text
    assert expected != reference.generate("import os", max_new_tokens=16).text
    reply = client.completions.create(model=model_id(engine), prompt="import os", max_tokens=16, temperature=0,
                                      presence_penalty=0.6, frequency_penalty=0.4,
                                      extra_body={"repetition_penalty": 1.3})
    assert reply.choices[0].text == expected
    stream = client.completions.create(model=model_id(engine), prompt="import os", max_tokens=16, stream=True,
                                       presence_penalty=0.6, frequency_penalty=0.4,
                                       extra_body={"repetition_penalty": 1.3})
    assert "".join(c.choices[0].text for c in stream) == expected


@pytest.mark.parametrize("field,value,words", [("presence_penalty", 2.5, "[-2, 2]"),
                                               ("frequency_penalty", -3, "[-2, 2]"),
                                               ("repetition_penalty", 0, "> 0"),
                                               ("repetition_penalty", "1.2", "number")])
def test_a_penalty_out_of_range_is_a_400_naming_it(url, field, value, words):
    assert_error(post(url, "/v1/completions", {"prompt": "hi", field: value}), 400, field, words)


def hf_logprobs(folder, ids: list[int], new: list[int]) -> torch.Tensor:
    """log_softmax of transformers' logits at the positions that predicted ``new``: [len(new), V]."""
    from transformers import Qwen3ForCausalLM

    model = Qwen3ForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(torch.tensor([ids + new])).logits[0, len(ids) - 1:len(ids) + len(new) - 1]
    return torch.log_softmax(logits.double(), -1)


@pytest.mark.parametrize("sampling", [{}, PENALTIES, dict(temperature=1.2, top_k=40, seed=3)],
                         ids=["greedy", "penalties", "sampled"])
@pytest.mark.parametrize("proposer", ["none", "ngram"])
def test_engine_logprobs_are_the_models_log_softmax(tiny_checkpoint, sampling, proposer):
    """The raw distribution (before penalties and temperature), chosen token and top 5, on every
    path (the first token from the prefill, plain steps, verify steps' rows)."""
    engine = tileinfer.Engine.from_config(model=str(tiny_checkpoint), overrides=[*BASE, f"proposer={proposer}"],
                                          progress=False)
    ids = list(range(10, 30)) * 2
    result = engine.generate(ids, max_new_tokens=12, logprobs=5, sampling=SamplingParams(**sampling),
                             ignore_eos=True)
    plain = engine.generate(ids, max_new_tokens=12, sampling=SamplingParams(**sampling), ignore_eos=True)
    assert result.token_ids == plain.token_ids  # asking for logprobs changes nothing else
    expected = hf_logprobs(tiny_checkpoint, ids, result.token_ids)
    assert [lp.token_id for lp in result.logprobs] == result.token_ids
    for i, lp in enumerate(result.logprobs):
        assert math.isclose(lp.logprob, expected[i, lp.token_id].item(), abs_tol=1e-4)
        values, top = expected[i].topk(5)
        assert [t for t, _ in lp.top] == top.tolist()
        assert all(math.isclose(v, e, abs_tol=1e-4) for (_, v), e in zip(lp.top, values.tolist()))


def test_chat_logprobs_shapes_streamed_and_not(client, engine, reference):
    messages = [{"role": "user", "content": "hi there"}]
    reply = client.chat.completions.create(model=model_id(engine), messages=messages, max_tokens=8, logprobs=True,
                                           top_logprobs=3)
    content = reply.choices[0].logprobs.content
    assert len(content) == reply.usage.completion_tokens == 8
    ids = engine.tokenizer.encode(engine.tokenizer.apply_chat_template(messages), add_special_tokens=False)
    expected = reference.generate(ids, max_new_tokens=8, logprobs=3)
    for entry, lp in zip(content, expected.logprobs):
        assert entry.token == engine.tokenizer.decode([lp.token_id], skip_special_tokens=False)
        assert entry.bytes == list(entry.token.encode()) and math.isclose(entry.logprob, lp.logprob, rel_tol=1e-6)
        assert [t.logprob for t in entry.top_logprobs] == pytest.approx([v for _, v in lp.top])
        assert len(entry.top_logprobs) == 3
    chunks = list(client.chat.completions.create(model=model_id(engine), messages=messages, max_tokens=8,
                                                 logprobs=True, top_logprobs=3, stream=True))
    streamed = [e for c in chunks if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    # the same prompt again reuses the cached prefix (prefix_cache): its last token's step has
    # another shape than the first request's prefill, so the logprobs agree to rounding
    assert [e.token for e in streamed] == [e.token for e in content]
    assert [e.logprob for e in streamed] == pytest.approx([e.logprob for e in content], rel=1e-6)
    plain = client.chat.completions.create(model=model_id(engine), messages=messages, max_tokens=8)
    assert plain.choices[0].logprobs is None and plain.choices[0].message.content == reply.choices[0].message.content


def test_completion_logprobs_shape(client, engine):
    reply = client.completions.create(model=model_id(engine), prompt="def add(a, b):", max_tokens=6, logprobs=2)
    lp = reply.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 6
    assert all(len(top) <= 2 and max(top.values()) >= value for top, value in zip(lp.top_logprobs, lp.token_logprobs))
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(6)]
    assert "".join(lp.tokens) == reply.choices[0].text
    streamed = list(client.completions.create(model=model_id(engine), prompt="def add(a, b):", max_tokens=6,
                                              logprobs=2, stream=True))
    tokens = [t for c in streamed if c.choices[0].logprobs for t in c.choices[0].logprobs.tokens]
    offsets = [o for c in streamed if c.choices[0].logprobs for o in c.choices[0].logprobs.text_offset]
    assert tokens == lp.tokens and offsets == lp.text_offset


@pytest.mark.parametrize("path,body,param", [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "top_logprobs": 2}, "top_logprobs"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "logprobs": True,
                              "top_logprobs": 21}, "top_logprobs"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "logprobs": 1}, "logprobs"),
    ("/v1/completions", {"prompt": "hi", "logprobs": 21}, "logprobs"),
    ("/v1/completions", {"prompt": "hi", "logprobs": True}, "logprobs"),
])
def test_bad_logprobs_are_a_400(url, path, body, param):
    assert_error(post(url, path, body), 400, param)


def vllm_cases(reference) -> list[dict]:
    """vLLM's fields, each with values that change the reply of the tiny model's greedy run."""
    ids = reference.generate("def add(a, b):", tileinfer.SamplingParams(max_tokens=12)).token_ids
    text = reference.generate("def add(a, b):", tileinfer.SamplingParams(max_tokens=12)).text
    stop = text[3:5]
    return [{"stop_token_ids": [ids[2]]},
            {"stop_token_ids": [ids[0]], "min_tokens": 4},
            {"stop": [stop], "include_stop_str_in_output": True},
            {"stop": [stop]},
            {"ignore_eos": True, "max_tokens": 20},
            {"skip_special_tokens": False}]


def test_vllm_fields_reach_the_engine(url, reference):
    for fields in vllm_cases(reference):
        params = {"max_tokens": 12, **fields}
        expected = reference.generate("def add(a, b):", tileinfer.SamplingParams(**params))
        reply = post(url, "/v1/completions", {"prompt": "def add(a, b):", **params}).json()
        choice = reply["choices"][0]
        finish = {"eos": "stop"}.get(expected.stats.finish_reason, expected.stats.finish_reason)
        assert (choice["text"], choice["finish_reason"], choice["stop_reason"]) \
            == (expected.text, finish, expected.stats.stop_reason), fields
        assert reply["usage"]["completion_tokens"] == len(expected.token_ids), fields


@pytest.mark.parametrize("body,param", [({"min_tokens": -1}, "min_tokens"), ({"stop_token_ids": [-1]},
                                                                             "stop_token_ids[0]"),
                                        ({"stop_token_ids": [1 << 20]}, "stop_token_ids"),
                                        ({"min_tokens": 9, "max_tokens": 2}, "min_tokens"),
                                        ({"ignore_eos": 1}, "ignore_eos"), ({"skip_special_tokens": "no"},
                                                                            "skip_special_tokens")])
def test_bad_vllm_fields_are_a_400_naming_them(url, body, param):
    assert_error(post(url, "/v1/completions", {"prompt": "hi", **body}), 400, param)


def test_every_vllm_field_is_passed_to_the_engine(url, engine, monkeypatch):
    seen = []
    stream = engine.stream
    monkeypatch.setattr(engine, "stream", lambda ids, params: seen.append(params) or stream(ids, params))
    fields = {"stop": ["\x00a", "\x00b"], "stop_token_ids": [7, 9], "ignore_eos": True, "min_tokens": 2,
              "include_stop_str_in_output": True, "skip_special_tokens": False, "top_k": 5, "min_p": 0.1,
              "repetition_penalty": 1.1, "seed": 4, "max_tokens": 3}
    assert post(url, "/v1/completions", {"prompt": "hi", "logprobs": 2, **fields}).status_code == 200
    params = seen[0]
    assert {k: getattr(params, k) for k in fields} == {**fields, "stop": ("\x00a", "\x00b"), "stop_token_ids": (7, 9)}
    assert params.logprobs == 2 and params.temperature is None  # unset: the engine's default
