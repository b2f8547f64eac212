"""The device-resident speculative loop gives the sequential loop's tokens and counts.

On a CPU the engine decodes sequentially (``pipelined`` needs CUDA), so these tests put the loop in
place by hand (tests/core/device_loop.py), eager or with a stand-in capture, in float32 with the
reference implementations (and the Triton ones under the interpreter), pages of 16 positions: the
47-token prompt and 80 new tokens cross the page boundaries 48 to 112. The steps run with every
host read of a device value refused, and with the positions a step must not read poisoned.
"""

from __future__ import annotations

import pytest
import torch

from conftest import reference_engine, repetitive_prompt
from device_loop import (device_engine, first_new_token, guard_steps, poison_unread_positions, rerun_capture,
                         with_eos)
from tileinfer.errors import NumericsError
from tileinfer.plugins.ngram import ngram_lookup_on_device
from tileinfer.backends.reference.ngram import ngram_lookup

PROMPT = repetitive_prompt()
NEW = 80


@pytest.fixture(scope="module")
def case(checkpoint_factory):
    """The target, its plain greedy tokens and the draft checkpoints of tests/plugins/test_draft.py:
    ``near`` (about half the drafts accepted) and ``self`` (the target: every draft accepted)."""
    target = checkpoint_factory(tokenizer=False)
    plain = reference_engine(target).generate(PROMPT, max_new_tokens=NEW).token_ids
    return target, plain, {"near": checkpoint_factory(tokenizer=False, std=0.06), "self": target}


def proposer_keys(proposer: str, drafts: dict, spec_k: int) -> dict:
    if proposer == "ngram":
        return {"proposer": "ngram", "spec_k": spec_k}
    name, which = proposer.split("-")
    return {"proposer": name, "spec_k": spec_k, "options": {"draft": {"model": str(drafts[which])}}}


# Stops: the EOS ("none", or the first token, or a token first seen at index 9 or later) and
# max_new_tokens (20: inside a step that would accept more drafts, with k = 15).
STOPS = {"length": ("none", NEW), "length-mid-step": ("none", 20), "one-token": ("none", 1),
         "eos": ("later", NEW), "eos-first-token": ("first", NEW)}


def run_both(case, proposer, spec_k, stop, **loop_keys):
    target, plain, drafts = case
    eos_kind, max_new = STOPS[stop]
    eos = {"none": None, "first": plain[0], "later": first_new_token(plain, 9)[0]}[eos_kind]
    keys = proposer_keys(proposer, drafts, spec_k)
    sequential = with_eos(reference_engine(target, **keys), eos).generate(PROMPT, max_new_tokens=max_new)
    engine = with_eos(device_engine(target, **keys, **loop_keys), eos)
    ks = guard_steps(engine.decoder.loop)
    return sequential, engine, engine.generate(PROMPT, max_new_tokens=max_new), ks


def assert_same_run(sequential, device, engine, *, counts: bool = True):
    assert device.token_ids == sequential.token_ids
    assert device.stats.finish_reason == sequential.stats.finish_reason
    assert device.stats.decode_loop == "speculative-device"
    assert sequential.stats.decode_loop == "speculative-sequential"
    if counts:
        s, d = sequential.stats, device.stats
        assert (d.steps, d.drafted_tokens, d.accepted_tokens) == (s.steps, s.drafted_tokens, s.accepted_tokens)
    n = len(device.token_ids)
    # The store holds the prompt and the emitted tokens, the last one if a step fed it.
    assert engine.kv.length in (len(PROMPT) + n - 1, len(PROMPT) + n)


@pytest.mark.parametrize("stop", STOPS)
@pytest.mark.parametrize("spec_k", [1, 3, 15])
def test_ngram_device_loop_gives_the_sequential_tokens_and_counts(case, spec_k, stop):
    sequential, engine, device, ks = run_both(case, "ngram", spec_k, stop)
    assert_same_run(sequential, device, engine)
    assert set(ks) <= {spec_k} and len(ks) >= device.stats.steps  # the step after a stop is enqueued too
    if stop == "length":
        assert device.stats.accepted_tokens > 0
    again = engine.generate(PROMPT, max_new_tokens=STOPS[stop][1])  # a second generation starts afresh
    assert again.token_ids == device.token_ids and again.stats.steps == device.stats.steps


@pytest.mark.parametrize("stop", ["length", "length-mid-step", "eos", "one-token"])
@pytest.mark.parametrize("spec_k", [1, 15])
@pytest.mark.parametrize("draft", ["draft-near", "draft-self"])
def test_draft_model_device_loop_gives_the_sequential_tokens(case, draft, spec_k, stop):
    sequential, engine, device, _ = run_both(case, draft, spec_k, stop)
    # The draft's catch-up recomputes one committed position: its drafts may differ on a near tie,
    # never the target's tokens. Here (float32) they do not.
    assert_same_run(sequential, device, engine)
    if draft == "draft-self" and device.stats.drafted_tokens:
        assert device.stats.accepted_tokens == device.stats.drafted_tokens  # its own drafts, all accepted


@pytest.mark.parametrize("proposer", ["ngram", "draft-self"])
def test_replayed_steps_give_the_eager_tokens(case, proposer):
    """Steps captured once per k on a dummy sequence at build (stand-in capture), replayed."""
    sequential, engine, device, _ = run_both(case, proposer, 7, "eos", capture=rerun_capture)
    assert sorted(engine.decoder.loop.graphs) == [7]
    assert_same_run(sequential, device, engine)


@pytest.mark.parametrize("proposer", ["ngram", "draft-self"])
def test_adaptive_k_uses_each_captured_length_and_keeps_the_tokens(case, proposer):
    sequential, engine, device, ks = run_both(case, proposer, 6, "length", spec_adaptive=True,
                                              capture=rerun_capture)
    assert sorted(engine.decoder.loop.graphs) == [1, 2, 3, 4, 5, 6]
    assert_same_run(sequential, device, engine, counts=False)  # k follows the acceptance one step later
    assert device.stats.drafted_tokens > 0 and ks[0] == 6
    if proposer == "ngram":
        assert len(set(ks)) > 1  # most n-gram drafts are rejected by the random model: k shrinks


@pytest.mark.parametrize("store", ["paged", "paged_int8"])
@pytest.mark.parametrize("attention", ["reference", "triton"])
def test_a_step_reads_no_position_it_did_not_write(case, attention, store):
    """The garbage rows a step leaves past its committed tokens are never read: NaN from the step's
    first position on (and in every free page) changes no token, with either attention and store.
    The Triton attention runs under the interpreter on a CPU."""
    target, plain, drafts = case
    keys = dict(proposer_keys("draft-self", drafts, 3), attention=attention, kv_store=store)
    prompt, new = PROMPT, 40
    if attention == "triton":  # the interpreter is slow: a 13-token prompt (its steps cross the page at 16),
        keys, prompt, new = dict(keys, kv_capacity=128), PROMPT[:13], 9  # a smaller pool (a step's splits cover it)
    clean = device_engine(target, **keys).generate(prompt, max_new_tokens=new)
    engine = device_engine(target, **keys)
    poison_unread_positions(engine.decoder.loop, [(engine.kv, 1), (engine.proposer.kv, 2)])
    poisoned = engine.generate(prompt, max_new_tokens=new)
    assert poisoned.token_ids == clean.token_ids
    assert poisoned.stats.accepted_tokens == clean.stats.accepted_tokens  # the draft read no NaN either
    if attention == "reference" and store == "paged":
        assert clean.token_ids == plain[:new]


def test_cached_keys_after_the_loop_are_those_of_the_sequence(case):
    """Every position the store keeps after a device-loop generation holds the key of the
    committed token there (the garbage of rejected rows was overwritten)."""
    target, plain, drafts = case
    engine = device_engine(target, **proposer_keys("ngram", drafts, 7))
    out = engine.generate(PROMPT, max_new_tokens=NEW).token_ids
    kept = engine.kv.length
    fresh = reference_engine(target)
    fresh.generate(PROMPT + out[:kept - len(PROMPT)], max_new_tokens=1)  # its prefill caches them all
    for layer in range(engine.model_config.num_layers):
        mine, theirs = engine.kv.gather(layer, kept), fresh.kv.gather(layer, kept)
        torch.testing.assert_close(mine, theirs, rtol=1e-4, atol=1e-5)


def test_non_finite_logits_mid_generation_raise_at_the_host_known_position(case):
    target, plain, drafts = case
    engine = device_engine(target, **proposer_keys("ngram", drafts, 3))
    step, calls = engine.decoder.loop.step, []

    def breaks_at_step_4(k):
        calls.append(k)
        if len(calls) == 4:  # the weights overflow from step 4 on: its row 0 is not finite
            engine.model.lm_head.weight[7] = float("nan")
        return step(k)

    clean = engine.generate(PROMPT, max_new_tokens=NEW)
    committed = []
    engine.decoder.loop.step = breaks_at_step_4
    with pytest.raises(NumericsError, match="not finite") as error:
        for chunk in engine.stream(PROMPT, max_new_tokens=NEW):
            committed += chunk.token_ids
    assert committed == clean.token_ids[:len(committed)] and len(calls) >= 4
    assert f"position {len(PROMPT) + len(committed)} " in str(error.value)


def test_the_device_ngram_matcher_proposes_the_host_matchers_tokens():
    generator = torch.Generator().manual_seed(0)
    for trial in range(400):
        capacity = int(torch.randint(2, 50, (1,), generator=generator))
        length = int(torch.randint(2, capacity + 1, (1,), generator=generator))
        vocab = (2, 3, 7, 50)[trial % 4]
        tokens = torch.randint(0, vocab, (capacity,), generator=generator)  # rows past length: garbage
        n_min = 1 + trial % 3
        n_max, k = n_min + trial % 4, 1 + trial % 9
        host = ngram_lookup(tokens[:length].tolist(), n_min, n_max, k)
        device = ngram_lookup_on_device(tokens, torch.tensor([length]), n_min, n_max, k).tolist()
        assert device == host + [-1] * (k - len(host)), (tokens[:length].tolist(), n_min, n_max, k)
