"""Which loop decodes: the device-resident speculative loop for greedy generations without
history-using penalties or logprobs, within its room; the sequential loop for everything else, with
the same tokens; the engine's choice (``pipelined``, CUDA, a proposer that drafts on the device) and
the stats naming the loop that ran. The GPU tests (the lead runs them) check the CUDA-graph loop
against the sequential one and that a step never syncs."""

from __future__ import annotations

import contextlib

import pytest
import torch

import tileinfer
from conftest import DEVICE, reference_engine, repetitive_prompt
from device_loop import device_engine, guard_steps, no_sync_in
from tileinfer.backends.reference.ngram import ngram_lookup
from tileinfer.device_speculation import drafts_on_device
from tileinfer.hookspecs import Implementation
from tileinfer.interfaces import Draft, Proposer, SamplingParams
from tileinfer.plugins.ngram import NgramProposer
from tileinfer.registry import build_registry, plugin_manager

PROMPT = repetitive_prompt()
NEW = 40


@pytest.fixture(scope="module")
def folder(checkpoint_factory):
    return checkpoint_factory(tokenizer=False)


# A generation's own arguments, config keys of both engines, and the word of the fallback's reason.
SETTINGS = {
    "sampled": (dict(sampling=SamplingParams(temperature=0.8, seed=3)), {}, "sampled"),
    "repetition-penalty": (dict(sampling=SamplingParams(repetition_penalty=1.3)), {}, "history"),
    "no-repeat-ngram": ({}, {"options": {"reference": {"no_repeat_ngram": 3}}}, "history"),
    "logprobs": (dict(logprobs=2), {}, "logprobs"),
}


@pytest.mark.parametrize("setting", SETTINGS)
def test_other_generations_fall_back_to_the_sequential_loop(folder, setting):
    """One engine: greedy runs on the device, the setting's generation sequentially with the
    tokens of a sequential engine, and greedy on the device again after it."""
    call, keys, reason = SETTINGS[setting]
    engine = device_engine(folder, proposer="ngram", spec_k=3, **keys)
    steps = guard_steps(engine.decoder.loop)
    sequential = reference_engine(folder, proposer="ngram", spec_k=3, **keys).generate(PROMPT, max_new_tokens=NEW,
                                                                                     **call)
    if setting != "no-repeat-ngram":
        greedy = engine.generate(PROMPT, max_new_tokens=NEW)
        assert greedy.stats.decode_loop == "speculative-device" and steps
    steps.clear()
    fallback = engine.generate(PROMPT, max_new_tokens=NEW, **call)
    assert fallback.stats.decode_loop == "speculative-sequential" and not steps
    assert reason in engine.decoder.choice.reason
    assert fallback.token_ids == sequential.token_ids
    assert fallback.stats.drafted_tokens == sequential.stats.drafted_tokens
    if setting != "no-repeat-ngram":
        assert engine.generate(PROMPT, max_new_tokens=NEW).token_ids == greedy.token_ids
        assert engine.decoder.counters.loop == "speculative-device"


def test_a_generation_past_the_loops_room_decodes_sequentially(checkpoint_factory, folder):
    """The loop reserves prompt + max_new + 2 (k + 1) positions up front, within the KV store and
    the draft model's context."""
    engine = device_engine(folder, proposer="ngram", spec_k=3, kv_capacity=128)
    assert engine.generate(PROMPT, max_new_tokens=128 - 47 - 8).stats.decode_loop == "speculative-device"
    assert engine.generate(PROMPT, max_new_tokens=128 - 47 - 7).stats.decode_loop == "speculative-sequential"
    short = checkpoint_factory(tokenizer=False, std=0.06, max_positions=112)  # the draft's context: 112
    engine = device_engine(folder, proposer="draft", spec_k=3, options={"draft": {"model": str(short)}})
    plain = reference_engine(folder).generate(PROMPT, max_new_tokens=60).token_ids
    within = engine.generate(PROMPT, max_new_tokens=112 - 47 - 8)
    assert within.stats.decode_loop == "speculative-device" and within.token_ids == plain[:57]
    past = engine.generate(PROMPT, max_new_tokens=60)
    assert past.stats.decode_loop == "speculative-sequential" and past.token_ids == plain


def test_the_stats_name_the_loop(folder):
    assert reference_engine(folder).generate(PROMPT, max_new_tokens=4).stats.decode_loop == "sequential"
    stats = reference_engine(folder, proposer="ngram").generate(PROMPT, max_new_tokens=4).stats
    assert stats.decode_loop == "speculative-sequential"


class HostOnlyProposer(Proposer):
    """Drafts as ngram does, on the host only (no device drafting)."""

    def propose(self, tokens, k):
        return Draft(ngram_lookup(tokens, 1, 4, k))


class _HostOnlyPlugin:
    @tileinfer.hookimpl
    def tileinfer_implementations(self):
        return [Implementation("proposer", "host_only", HostOnlyProposer, "n-gram on the host only")]


def notices(caplog) -> list[str]:
    found = [r.getMessage() for r in caplog.records if r.name == "tileinfer"]
    caplog.clear()
    return found


def test_the_engine_builds_the_loop_for_a_device_proposer_on_cuda_only(folder, caplog):
    assert drafts_on_device(NgramProposer.__new__(NgramProposer))
    assert not drafts_on_device(HostOnlyProposer.__new__(HostOnlyProposer)) and not drafts_on_device(None)
    pm = plugin_manager(entry_points=False)
    pm.register(_HostOnlyPlugin(), name="host_only_plugin")
    registry = build_registry(pm)
    for proposer, spec_k, why in (("ngram", 3, None), ("host_only", 3, "proposer=host_only"),
                                  ("ngram", 16, "spec_k=16")):  # a step of 17 tokens: more than the loop takes
        caplog.clear()
        engine = tileinfer.Engine.from_config("eager", model=str(folder), device=DEVICE, dtype="float32",
                                              kv_page_size=16, proposer=proposer, spec_k=spec_k, pipelined=True,
                                              registry=registry, progress=False)
        found = notices(caplog)
        if DEVICE == "cpu":
            assert engine.decoder.loop is None and len(found) == 1 and "no effect on device cpu" in found[0]
        elif why is None:
            assert engine.decoder.loop is not None and not found
        else:
            assert engine.decoder.loop is None and len(found) == 1
            assert why in found[0] and "decoding sequentially" in found[0]
        loop = "speculative-device" if engine.decoder.loop else "speculative-sequential"
        assert engine.generate(PROMPT, max_new_tokens=8).stats.decode_loop == loop


# -- GPU ---------------------------------------------------------------------------------------


GPU_VARIANTS = {"reference": ["reference"], "triton": ["eager"]}


def gpu_engine(folder, variant, **keys):
    return tileinfer.Engine.from_config(*GPU_VARIANTS[variant], model=str(folder), device="cuda", dtype="float32",
                                        kv_page_size=16, progress=False, **keys)


@pytest.mark.gpu
@pytest.mark.parametrize("spec_k", [1, 7, 15])
@pytest.mark.parametrize("proposer", ["ngram", "draft"])
@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "graphs"])
@pytest.mark.parametrize("variant", GPU_VARIANTS)
def test_the_device_loop_gives_the_sequential_tokens_on_the_gpu(folder, variant, graphs, proposer, spec_k):
    keys = dict(proposer=proposer, spec_k=spec_k, cuda_graphs=graphs)
    if proposer == "draft":
        keys["options"] = {"draft": {"model": str(folder)}}  # the target as its own draft
    sequential = gpu_engine(folder, variant, pipelined=False, **keys).generate(PROMPT, max_new_tokens=NEW)
    engine = gpu_engine(folder, variant, pipelined=True, **keys)
    loop = engine.decoder.loop
    assert loop is not None and sorted(loop.graphs) == ([spec_k] if graphs else [])
    for max_new in (NEW, 20, 1):  # across pages; a stop inside a step; the prefill's token only
        with no_sync_in(engine.decoder, engine.decoder.loop) if variant == "triton" else contextlib.nullcontext():
            device = engine.generate(PROMPT, max_new_tokens=max_new)
        assert device.stats.decode_loop == "speculative-device"
        assert device.token_ids == sequential.token_ids[:max_new]
    if proposer == "ngram":  # the same drafts (a draft model's may differ on a near tie of its own)
        s, d = sequential.stats, engine.generate(PROMPT, max_new_tokens=NEW).stats
        assert (d.steps, d.drafted_tokens, d.accepted_tokens) == (s.steps, s.drafted_tokens, s.accepted_tokens)


@pytest.mark.gpu
def test_the_default_config_takes_the_device_loop_with_adaptive_k(folder):
    keys = dict(model=str(folder), dtype="float32", proposer="ngram", spec_k=5, spec_adaptive=True, progress=False)
    engine = tileinfer.Engine.from_config(**keys)  # the default config (Triton, CUDA graphs, pipelined)
    assert engine.decoder.loop is not None and sorted(engine.decoder.loop.graphs) == [1, 2, 3, 4, 5]
    with no_sync_in(engine.decoder, engine.decoder.loop):
        result = engine.generate(PROMPT, max_new_tokens=NEW)
    assert result.stats.decode_loop == "speculative-device" and len(result.token_ids) == NEW
    sequential = tileinfer.Engine.from_config(**keys, pipelined=False)
    assert sequential.generate(PROMPT, max_new_tokens=NEW).token_ids == result.token_ids
