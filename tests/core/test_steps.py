"""Steps replayed as a CUDA graph replays them: on a CPU, a stand-in capture re-runs the step
with the capture's host ``start`` and only the static buffers changed, so an implementation
that reads a step's position from the host instead of the device gives wrong tokens here."""

from __future__ import annotations

import pytest

import tileinfer
from conftest import DEVICE
from device_loop import rebuild, rerun_capture


def replayed_steps(engine: tileinfer.Engine, *, prefill: bool = True) -> tileinfer.Engine:
    """The engine's plan (sequential, as on a CPU) with its steps replayed from the stand-in capture."""
    return rebuild(engine, engine.decoder.plan, step_capture=rerun_capture, prefill=prefill)


PROMPT = [(7 * i) % 23 + 40 for i in range(18)] * 2  # repetitive: n-gram drafts, verify steps of several tokens
NEW = 14  # positions 36 to 49: cross a page boundary (48)
# The tests that run on a CPU too, where the Triton kernels run in the interpreter (seconds a step,
# growing with the weight rows and the prompt's tokens): a small model (GQA 2 / 1 heads of 16) and a
# repetitive 15-token prompt with 8 new tokens, positions 15 to 22: across a page boundary (16) as well.
SMALL = dict(hidden=32, heads=2, kv_heads=1, head_dim=16, intermediate=48, vocab=96, layers=2, tokenizer=False)
SHORT_PROMPT, SHORT_NEW = ([(7 * i) % 23 + 40 for i in range(12)] * 3)[:15], 8


@pytest.fixture(scope="module")
def folder(checkpoint_factory):
    return checkpoint_factory(heads=4, kv_heads=2, head_dim=32, hidden=64, layers=2)


@pytest.fixture(scope="module")
def small(checkpoint_factory):
    return checkpoint_factory(**SMALL)


PER_OP = {"options": {"triton": {"fuse_epilogue": False, "fuse_inputs": False}}}
TORCH_MATMUL = {"options": {"triton": {"fuse_epilogue": False, "matmul": "torch"}}}
# Shipped configs and option overrides; "triton" configs name the implementation (auto would take
# the reference on a CPU), so that the Triton kernels run under the interpreter there.
VARIANTS = {"reference": ["reference"], "triton": ["eager", {"linear": "triton", "attention": "triton"}],
            "triton-per-op": ["eager", {"linear": "triton", "attention": "triton"}, PER_OP],
            "triton-torch-matmul": ["eager", {"linear": "triton", "attention": "triton"}, TORCH_MATMUL]}


def generate(folder, variant, replayed, prompt=PROMPT, new=NEW, **keys):
    engine = tileinfer.Engine.from_config(*VARIANTS[variant], model=str(folder), device=DEVICE, dtype="float32",
                                          kv_page_size=16, progress=False, **keys)
    if replayed:
        # decode and verify steps replayed; the prefill's graphs have tests of their own (test_prefill_graphs)
        replayed_steps(engine, prefill=False)
    result = engine.generate(prompt, max_new_tokens=new)
    return result, engine.decoder.steps


def generate_small(folder, variant, replayed, **keys):
    """:func:`generate` with the small prompt (``folder``: the small model)."""
    return generate(folder, variant, replayed, SHORT_PROMPT, SHORT_NEW, **keys)


@pytest.mark.parametrize("variant, proposer", [("reference", "none"), ("reference", "ngram"),
                                               ("triton", "ngram")])
def test_replayed_steps_give_the_eager_tokens(small, variant, proposer):
    eager, _ = generate_small(small, variant, replayed=False, proposer=proposer, spec_k=3)
    replayed, steps = generate_small(small, variant, replayed=True, proposer=proposer, spec_k=3)
    assert replayed.token_ids == eager.token_ids
    assert 1 in steps.graphs  # plain decode steps were replayed
    if proposer == "ngram":
        assert replayed.stats.drafted_tokens > 0 and len(steps.graphs) > 1  # so were verify steps


def test_a_position_read_from_the_host_is_caught(small, monkeypatch):
    """The stand-in is strict enough: break the device-side start and the tokens change."""
    eager, _ = generate_small(small, "reference", replayed=False)
    from tileinfer.plugins.reference import attention

    def stale(q, step, kv, layer, scale, fused=None):  # reads the host start, as eager code may
        keys, values = kv.gather(layer, step.start + step.num_tokens)
        return attention.causal_attention(q, keys, values, step.start, scale)

    monkeypatch.setattr(attention, "dense_attention", stale)
    replayed, _ = generate_small(small, "reference", replayed=True)
    assert replayed.token_ids != eager.token_ids


def test_cuda_graphs_key_is_accepted_on_a_cpu_with_a_notice(small, caplog):
    if DEVICE != "cpu":
        pytest.skip("checks the CPU notice")
    caplog.clear()
    result, steps = generate_small(small, "reference", replayed=False, cuda_graphs=True)
    assert any(r.name == "tileinfer" and "cuda_graphs has no effect" in r.getMessage() for r in caplog.records)
    assert not steps.graphed and len(result.token_ids) == SHORT_NEW


@pytest.mark.gpu
@pytest.mark.parametrize("variant", VARIANTS)
def test_cuda_graphs_give_the_eager_tokens_on_the_gpu(folder, variant):
    eager, _ = generate(folder, variant, replayed=False, proposer="ngram", spec_k=3)
    graphed, steps = generate(folder, variant, replayed=False, proposer="ngram", spec_k=3, cuda_graphs=True)
    assert steps.graphed and steps.graphs
    assert graphed.token_ids == eager.token_ids
    again, _ = generate(folder, variant, replayed=False, cuda_graphs=True)  # a fresh engine in the same process
    assert again.token_ids == generate(folder, variant, replayed=False)[0].token_ids


def test_graphs_captured_up_front_leave_no_sequence_and_the_same_tokens(small):
    """StepRunner.capture (what the engine does when it is built) takes every token count a
    verify step can have, drops the positions it wrote, and generation gives the eager tokens."""
    eager, _ = generate_small(small, "reference", replayed=False, proposer="ngram", spec_k=3)
    engine = tileinfer.Engine.from_config("reference", model=str(small), device=DEVICE, dtype="float32",
                                          kv_page_size=16, proposer="ngram", spec_k=3, progress=False)
    steps = replayed_steps(engine).decoder.steps
    steps.capture(range(1, 5))
    assert sorted(steps.graphs) == [1, 2, 3, 4] and engine.kv.length == 0
    result = engine.generate(SHORT_PROMPT, max_new_tokens=SHORT_NEW)
    assert result.token_ids == eager.token_ids and sorted(steps.graphs) == [1, 2, 3, 4]
