"""The Python API: tileinfer.SamplingParams (checked fields, the checkpoint's defaults under the
fields a caller sets), generate over one prompt or a list, chat, stream_async, and Engine misused."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import shutil
import threading

import pytest

import tileinfer
from conftest import reference_engine
from tileinfer import SamplingParams
from tileinfer.errors import UsageError

PROMPT = "def add(a, b):\n"


@pytest.fixture(scope="module")
def engine(tiny_checkpoint):
    return reference_engine(tiny_checkpoint)


@pytest.mark.parametrize("fields, words", [
    ({"temperature": -1}, "temperature=-1 is not valid"),
    ({"top_p": 0}, "top_p=0 is not valid"),
    ({"top_k": -2}, "top_k=-2 is not valid"),
    ({"repetition_penalty": 0.0}, "repetition_penalty=0.0 is not valid"),
    ({"presence_penalty": 3}, "presence_penalty=3 is not valid"),
    ({"seed": -1}, "seed=-1 is not valid"),
    ({"max_tokens": 0}, "max_tokens=0 is not valid"),
    ({"min_tokens": 5, "max_tokens": 2}, "min_tokens=5 is not valid: more than max_tokens=2"),
    ({"stop": 3}, "stop=3 is not valid"),
    ({"stop": [""]}, "a stop string must not be empty"),
    ({"stop_token_ids": [1, -1]}, "stop_token_ids=\\[1, -1\\] is not valid"),
    ({"ignore_eos": "yes"}, "ignore_eos='yes' is not valid"),
    ({"logprobs": 21}, "logprobs=21 is not valid"),
])
def test_a_bad_value_is_one_line_naming_the_field(fields, words):
    with pytest.raises(UsageError, match=words) as caught:
        SamplingParams(**fields)
    assert "\n" not in str(caught.value)


def test_values_are_normalized():
    params = SamplingParams(temperature=1, stop="x", stop_token_ids=(3, 4))
    assert params.temperature == 1.0 and isinstance(params.temperature, float)
    assert params.stop == ("x",) and params.stop_token_ids == (3, 4)


def test_the_checkpoints_defaults_stay_under_the_fields_set(tiny_checkpoint, tmp_path):
    """A repetition penalty from generation_config.json stays when the caller sets only other
    fields; a field the caller sets wins."""
    folder = tmp_path / "model"
    shutil.copytree(tiny_checkpoint, folder)
    (folder / "generation_config.json").write_text(json.dumps({"repetition_penalty": 1.8, "eos_token_id": 2}))
    engine = reference_engine(folder)
    assert engine.default_sampling.repetition_penalty == 1.8
    penalized = engine.generate(PROMPT, SamplingParams(max_tokens=12, ignore_eos=True, seed=3)).token_ids
    plain = engine.generate(PROMPT, SamplingParams(max_tokens=12, ignore_eos=True, repetition_penalty=1.0)).token_ids
    assert penalized != plain  # the penalty changes this generation, so the check below can fail
    assert engine.generate(PROMPT, max_new_tokens=12, ignore_eos=True).token_ids == penalized
    assert SamplingParams(temperature=0.5).resolved(engine.default_sampling).repetition_penalty == 1.8


def test_one_type_for_the_python_api_the_server_and_the_sampler(engine):
    """tileinfer.interfaces.SamplingParams is tileinfer.SamplingParams; a sampler always holds every
    sampling field (NEUTRAL's where its params leave one None); the sampling shorthand's unset fields
    are off, not the engine's defaults."""
    from tileinfer.interfaces import SamplingParams as SamplerParams
    from tileinfer.plugins.reference.sampler import ReferenceSampler
    from tileinfer.sampling_params import NEUTRAL

    assert SamplerParams is SamplingParams and NEUTRAL.greedy and not NEUTRAL.penalized
    sampler = ReferenceSampler(SamplingParams(temperature=0.7, max_tokens=3), "cpu")
    assert sampler.params == SamplingParams(temperature=0.7, max_tokens=3).resolved(NEUTRAL)
    assert (sampler.params.top_k, sampler.params.repetition_penalty, sampler.params.seed) == (0, 1.0, 0)
    with pytest.raises(TypeError, match="tileinfer.SamplingParams, got dict"):
        sampler.params = {"temperature": 1.0}
    hot = SamplingParams(temperature=1.0, seed=5)
    assert engine.generate(PROMPT, max_new_tokens=6, sampling=hot).token_ids == engine.generate(
        PROMPT, dataclasses.replace(hot.resolved(NEUTRAL), max_tokens=6)).token_ids


def test_a_batch_is_answered_one_result_per_prompt_in_order(engine):
    params = SamplingParams(max_tokens=5, ignore_eos=True)
    prompts = ["def f(x):", PROMPT, "import os\n"]
    singles = [engine.generate(p, params) for p in prompts]
    batch = engine.generate(prompts, params)
    assert [g.token_ids for g in batch] == [g.token_ids for g in singles]
    assert [g.text for g in batch] == [g.text for g in singles]
    ids = [engine.encode_prompt(p) for p in prompts]
    assert [g.token_ids for g in engine.generate(ids, params)] == [g.token_ids for g in singles]
    one = engine.generate(ids[0], params)  # a flat list of ints is one prompt
    assert isinstance(one, tileinfer.Generation) and one.token_ids == singles[0].token_ids


def test_chat_renders_the_template(engine):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "add two numbers"}]
    params = SamplingParams(max_tokens=6, ignore_eos=True)
    text = engine.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    expected = engine.generate(engine.tokenizer.encode(text, add_special_tokens=False), params)
    assert engine.chat(messages, params).token_ids == expected.token_ids
    assert [g.token_ids for g in engine.chat([messages, messages[1:]], params)][0] == expected.token_ids
    with pytest.raises(UsageError, match="messages\\[1\\]: role must be one of system, user, assistant, tool, "
                                         "got 'hacker'"):
        engine.chat([messages[0], {"role": "hacker", "content": "x"}])


def test_stream_async_runs_the_generation_off_the_event_loop(engine, monkeypatch):
    params = SamplingParams(max_tokens=6, ignore_eos=True)
    expected = [(c.token_ids, c.text) for c in engine.stream(PROMPT, params)]
    threads = []
    run = engine.decoder.run

    def spy(*args, **kwargs):
        threads.append(threading.get_ident())
        return run(*args, **kwargs)

    monkeypatch.setattr(engine.decoder, "run", spy)

    async def read():
        return threading.get_ident(), [(c.token_ids, c.text) async for c in engine.stream_async(PROMPT, params)]

    loop_thread, chunks = asyncio.run(read())
    assert chunks == expected
    assert threads and threads[0] != loop_thread


def test_stream_async_closed_early_frees_the_engine(engine):
    async def first_then_close():
        async with contextlib.aclosing(engine.stream_async(PROMPT, SamplingParams(max_tokens=30))) as chunks:
            async for _ in chunks:
                break
        return engine.generate([5, 6], max_new_tokens=2)  # the engine is free again

    assert len(asyncio.run(first_then_close()).token_ids) == 2
    with pytest.raises(UsageError, match="the prompt is empty"):
        engine.stream_async("")  # checked when called


@pytest.mark.parametrize("call, words", [
    (lambda e: e.generate(PROMPT, {"max_tokens": 3}), "params must be a tileinfer.SamplingParams, got dict"),
    (lambda e: e.generate(PROMPT, SamplingParams(), max_new_tokens=3), "not beside it"),
    (lambda e: e.generate(PROMPT, sampling=SamplingParams(max_tokens=3)), "sampling takes the sampling fields only"),
    (lambda e: e.generate(PROMPT, sampling={"temperature": 1.0}), "sampling must be a tileinfer.SamplingParams"),
    (lambda e: e.generate(PROMPT, SamplingParams(stop_token_ids=[10**6])), "stop_token_ids: 1000000 is outside"),
])
def test_misused_params_are_usage_errors(engine, call, words):
    with pytest.raises(UsageError, match=words):
        call(engine)


@pytest.mark.parametrize("config", ["models/target", {"model": "x"}, None])
def test_an_engine_of_something_else_than_a_config_is_one_usage_error(config):
    with pytest.raises(UsageError, match="Engine takes a tileinfer.Config .* use Engine.from_config\\(model=...\\)"):
        tileinfer.Engine(config)
