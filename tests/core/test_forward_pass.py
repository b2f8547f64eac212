"""The ForwardPass seam (config key ``forward``): every step of every decoding strategy runs through
the implementation the config names, and nothing reaches the model's forward another way.

A third-party ``forward=counting`` (the per-op pass, counting its calls) is selected by config;
the first layer's qkv Linear, which every pass runs once, counts its calls too. Plain decoding (eager and one step
behind), host drafting (n-gram, and a draft model whose own steps take its own ForwardPass), the
device loop and the graphed prefill (stand-in capture) each give the per-op tokens, with every
model call made by the seam. On a CPU, float32, the reference implementations.
"""

from __future__ import annotations

import pytest

import tileinfer
from conftest import DEVICE, repetitive_prompt
from device_loop import rebuild, rerun_capture, rows_of_calls, with_loop
from tileinfer.decode_plan import DecodePlan
from tileinfer.hookspecs import Implementation
from tileinfer.plugins.per_op import PerOpForward
from tileinfer.registry import build_registry, plugin_manager

PROMPT = repetitive_prompt()
NEW = 12


class CountingForward(PerOpForward):
    """per_op, recording the token count of each call."""

    def __init__(self, model, *, options=None) -> None:
        super().__init__(model, options=options)
        self.calls: list[int] = []

    def __call__(self, token_ids, step, kv, **kw):
        self.calls.append(step.num_tokens)
        return super().__call__(token_ids, step, kv, **kw)


class _CountingPlugin:
    @tileinfer.hookimpl
    def tileinfer_implementations(self):
        return [Implementation("forward", "counting", CountingForward, "per_op, counted")]


def counting_registry():
    """The built-in plugins and ``forward=counting``."""
    pm = plugin_manager(entry_points=False)
    pm.register(_CountingPlugin(), name="counting_plugin")
    return build_registry(pm)


@pytest.fixture(scope="module")
def case(checkpoint_factory):
    folder = checkpoint_factory(tokenizer=False)
    plain = build(folder, build_registry()).generate(PROMPT, max_new_tokens=NEW).token_ids
    return folder, counting_registry(), plain


def build(folder, registry, **keys) -> tileinfer.Engine:
    return tileinfer.Engine.from_config("reference", model=str(folder), device=DEVICE, dtype="float32",
                                        kv_page_size=16, registry=registry, progress=False, **keys)


def counted(model) -> list[int]:
    """The rows of each call of ``model``'s first qkv Linear from now on (one per forward pass)."""
    return rows_of_calls(model.layers[0].qkv)


MODES = {
    "sequential": ({}, None),
    "pipelined": ({}, "pipelined"),
    "speculative-sequential": ({"proposer": "ngram", "spec_k": 3}, None),
    "speculative-device": ({"proposer": "ngram", "spec_k": 3}, "device"),
    "draft-model": ({"proposer": "draft", "spec_k": 3}, None),
    "graphed-prefill": ({"prefill_chunk": 20}, "graphs"),
}


@pytest.mark.parametrize("mode", MODES)
def test_every_step_runs_through_the_configured_forward_pass(case, mode):
    folder, registry, plain = case
    keys, how = MODES[mode]
    if mode == "draft-model":
        keys = dict(keys, options={"draft": {"model": str(folder)}})  # the target as its own draft
    engine = build(folder, registry, forward="counting", **keys)
    if how == "pipelined":
        rebuild(engine, DecodePlan("plain", ahead=True))
    elif how == "device":
        with_loop(engine)
    elif how == "graphs":
        rebuild(engine, engine.decoder.plan, step_capture=rerun_capture)
    seam = engine.decoder.steps.forward_pass
    assert isinstance(seam, CountingForward) and (engine.decoder.loop is None or engine.decoder.loop.forward is seam)
    model_calls = counted(engine.model)
    result = engine.generate(PROMPT, max_new_tokens=NEW)
    assert result.token_ids == plain
    assert result.stats.decode_loop == {"draft-model": "speculative-sequential",
                                        "graphed-prefill": "sequential"}.get(mode, mode)
    assert model_calls == seam.calls and len(seam.calls) >= result.stats.steps + 1
    if mode.startswith("speculative") or mode == "draft-model":
        assert max(seam.calls[1:]) == 4 and result.stats.drafted_tokens > 0  # verify steps of 1 + spec_k tokens
    if mode == "graphed-prefill":  # chunks 20, 20 and 7: buckets 20 and 7, each captured, then replayed
        assert sorted(engine.decoder.steps.prefill_graphs.graphs) == [7, 20]
    if mode == "draft-model":
        draft = engine.proposer
        assert isinstance(draft.forward, CountingForward) and draft.steps.forward_pass is draft.forward
        draft_calls = counted(draft.model)
        draft.forward.calls.clear()
        assert engine.generate(PROMPT, max_new_tokens=NEW).token_ids == plain
        assert draft_calls == draft.forward.calls and draft.forward.calls
