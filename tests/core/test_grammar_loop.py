"""A grammar's plain steps split (decode loop ``pipelined-grammar``): the forward pass of step n + 1
is enqueued before the host reads token n, its mask and sampling after the grammar has taken token
n. On a CPU the engine decodes sequentially, so the split Decoder is built by hand (as the engine
builds it on a GPU): it gives the sequential loop's tokens and finish reasons for every kind of
constraint, greedy and sampled, with eager steps and the stand-in graph replay, leaves the tokens it
fed in the KV store (the next prompt's cached prefix then gives the cold tokens), and ends on a dead
end as the sequential loop does."""

from __future__ import annotations

import pytest
import torch

import tileinfer
from tileinfer import SamplingParams, StructuredOutput
from tileinfer.decode_plan import DecodePlan

from conftest import gpu_available
from device_loop import rebuild, rerun_capture

pytest.importorskip("xgrammar")
from test_structured_generation import KINDS, PROMPT  # noqa: E402

SAMPLINGS = [(0.0, 0), (1.0, 7)]


@pytest.fixture(scope="module")
def engines():
    """(sequential, split eager, split replayed) over the shipped model."""
    sequential = tileinfer.Engine.from_config(progress=False)
    split = rebuild(tileinfer.Engine.from_config(progress=False), DecodePlan("plain", ahead=True), prefix_cache=True)
    replayed = rebuild(tileinfer.Engine.from_config(progress=False), DecodePlan("plain", ahead=True),
                       step_capture=rerun_capture, prefill=False)
    return sequential, split, replayed


def test_the_plan_splits_a_grammars_plain_steps_and_nothing_else():
    plan = DecodePlan("plain", ahead=True)
    sampler = tileinfer.Engine.from_config(progress=False).decoder.sampler
    assert plan.choose(sampler, 8, 8, None, 64, grammar=True).loop == "pipelined-grammar"
    assert plan.choose(sampler, 8, 8, None, 64).loop == "pipelined"
    assert plan.choose(sampler, 8, 8, 2, 64, grammar=True).loop == "sequential"  # logprobs read each step
    assert DecodePlan("plain").choose(sampler, 8, 8, None, 64, grammar=True).loop == "sequential"


@pytest.mark.parametrize("kind", ["json", "regex", "choice", "grammar"])
@pytest.mark.parametrize("temperature,seed", SAMPLINGS)
def test_split_steps_give_the_sequential_tokens(engines, kind, temperature, seed):
    sequential, *splits = engines
    params = SamplingParams(max_tokens=40, temperature=temperature, seed=seed, structured=KINDS[kind])
    expected = sequential.generate(PROMPT, params)
    assert expected.stats.decode_loop == "sequential"
    for engine in splits:
        reply = engine.generate(PROMPT, params)
        assert reply.stats.decode_loop == "pipelined-grammar"
        assert reply.token_ids == expected.token_ids, kind
        assert reply.stats.finish_reason == expected.stats.finish_reason


@pytest.mark.parametrize("kind,max_tokens,finish", [("json", 1, "length"), ("json", 3, "length"),
                                                    ("regex", 40, "eos"), ("choice", 40, "eos")])
def test_the_store_keeps_the_tokens_fed(engines, kind, max_tokens, finish):
    """At the length the last token was never fed (the store holds the prompt and the tokens before
    it, as after the sequential loop); at an EOS the step after it was fed and not sampled from, so
    the store holds the EOS too. A follow-up prompt that extends the reply reuses all of it and gives
    the cold tokens."""
    sequential, split, _ = engines
    params = SamplingParams(max_tokens=max_tokens, structured=KINDS[kind])
    first, mine = sequential.generate(PROMPT, params), split.generate(PROMPT, params)
    assert mine.token_ids == first.token_ids and mine.stats.finish_reason == finish
    kept = split.kv.length
    assert kept == mine.stats.prompt_tokens + len(mine.token_ids) - (finish == "length")
    follow = split.tokenizer.encode(PROMPT) + mine.token_ids + split.tokenizer.encode("\n")
    again = SamplingParams(max_tokens=12, structured=KINDS["regex"])
    warm = split.generate(follow, again)
    assert warm.stats.cached_tokens == kept
    cold = tileinfer.Engine.from_config(progress=False, prefix_cache=False).generate(follow, again)
    assert warm.token_ids == cold.token_ids


def test_a_dead_end_ends_the_split_loop_as_the_sequential_one(engines):
    sequential, split, _ = engines
    params = SamplingParams(max_tokens=20, ignore_eos=True, structured=StructuredOutput(choice=["yes", "no"]))
    expected, reply = sequential.generate(PROMPT, params), split.generate(PROMPT, params)
    assert reply.stats.finish_reason == expected.stats.finish_reason == "grammar"
    assert reply.token_ids == expected.token_ids


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_available(), reason="needs a CUDA GPU")
def test_on_the_gpu_the_split_forward_pass_is_enqueued_without_a_sync():
    """The forward pass goes ahead of the host's read only if enqueueing it never waits for the GPU."""
    engine = tileinfer.Engine.from_config(device="cuda", progress=False)
    plain = engine.decoder.strategies["plain"]
    feed, fed = plain.feed, []

    def strict() -> None:
        torch.cuda.set_sync_debug_mode("error")
        try:
            feed()
        finally:
            torch.cuda.set_sync_debug_mode("default")
        fed.append(1)

    plain.feed = strict
    reply = engine.generate(PROMPT, SamplingParams(max_tokens=32, structured=KINDS["json"]))
    assert reply.stats.decode_loop == "pipelined-grammar" and len(fed) >= reply.stats.new_tokens - 1 > 0
