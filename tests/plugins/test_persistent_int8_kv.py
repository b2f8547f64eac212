"""``forward=persistent`` over INT8 KV pages (``kv_store=paged_int8``) against its twin, the per-op
step, in the interpreter with one program taking every work item in order, float32.

The step writes the int8 pages and their scales itself (the key divided by the store's smoothing,
quantized per vector with the reference quantizer's arithmetic) and attends over them; nothing
falls back to the per-op step, so no notice is logged. Logits agree to the float32 bound of
test_persistent.py (2e-5: its GEMVs and attention reduce in other orders), the int8 pages are the
same bits and their scales agree to that bound. A token's row is the same bits alone or in a step
of several. Shapes as test_persistent.py's (hidden 96 and intermediate 160 off the 64-column
tiles, 140 cached positions over three chunks and two splits).
"""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
import torch

import tileinfer
from tileinfer.interfaces import Step
from tileinfer.model import stack_forward
from tileinfer.plugins.per_op import PerOpForward
from tileinfer.plugins.persistent_forward import PersistentForward

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter's tests (CPU tensors); on a GPU: "
                                "test_persistent_gpu.py")
CONTEXT, TOL = 140, dict(rtol=2e-5, atol=2e-5)
OPTIONS = {"num_splits": 2, "chunk": 64, "block_n": "64,64,64,64,64", "block_k": 64}


@pytest.fixture(scope="module")
def engine(checkpoint_factory) -> SimpleNamespace:
    """A float32 reference model with int8 pages (``model``, ``kv``), CONTEXT positions of ``ids``
    prefilled by the per-op step, and the pool after the prefill (``saved``)."""
    folder = checkpoint_factory(tokenizer=False, hidden=96, intermediate=160, layers=2, seed=3)
    built = tileinfer.Engine.from_config("reference", model=str(folder), device="cpu", dtype="float32",
                                         kv_page_size=16, kv_store="paged_int8", progress=False)
    e = SimpleNamespace(model=built.model, kv=built.kv,
                        ids=torch.randint(0, 320, (CONTEXT + 16,), generator=torch.Generator().manual_seed(7)))
    e.kv.reset()
    for pool in pool_of(e):  # slots no step writes compare equal (an allocation may hold NaN)
        pool.zero_()
    e.kv.reserve(CONTEXT)
    stack_forward(e.model, e.ids[:CONTEXT], Step.at(0, CONTEXT, e.model.device), e.kv)
    e.saved = [pool.clone() for pool in pool_of(e)]
    return e


def pool_of(e: SimpleNamespace) -> tuple[torch.Tensor, ...]:
    return e.kv.k, e.kv.v, e.kv.k_scale, e.kv.v_scale


def run(e: SimpleNamespace, forward, start: int, t: int, *, fresh: bool = True, **kw):
    """``t`` tokens after ``start`` positions, from the pool as after the prefill when ``fresh``."""
    if fresh:
        for pool, saved in zip(pool_of(e), e.saved):
            pool.copy_(saved)
    e.kv.truncate(start)
    e.kv.reserve(start + t)
    out, hidden = forward(e.ids[start:start + t], Step.at(start, t, e.model.device), e.kv, **kw)
    return None if out is None else out.clone(), hidden


def test_the_step_over_int8_pages_matches_the_per_op_step(engine, caplog):
    ref, ref_hidden = run(engine, PerOpForward(engine.model), CONTEXT, 3, capture=(1,))
    expected = [pool.clone() for pool in pool_of(engine)]
    persistent = PersistentForward(engine.model, options=OPTIONS)
    _, bufs = persistent._bind(engine.kv)
    bufs.poison()
    with caplog.at_level(logging.WARNING, logger="tileinfer"):
        out, hidden = run(engine, persistent, CONTEXT, 3, capture=(1,))
    assert not caplog.records, "no fallback to the per-op step"
    assert persistent.shape.kv_int8 and persistent.shape.k_smooth
    assert out.shape == (3, 320) and not out.isnan().any()
    torch.testing.assert_close(out, ref, **TOL)
    torch.testing.assert_close(hidden[1], ref_hidden[1], **TOL)
    k, v, k_scale, v_scale = pool_of(engine)
    assert torch.equal(k, expected[0]) and torch.equal(v, expected[1])
    torch.testing.assert_close(k_scale, expected[2], **TOL)
    torch.testing.assert_close(v_scale, expected[3], **TOL)
    assert not bufs.counters.any(), "the counters are zero again for the next launch"


def test_rows_over_int8_pages_are_the_same_bits_alone_or_together(engine):
    persistent = PersistentForward(engine.model, options=OPTIONS)
    together, _ = run(engine, persistent, CONTEXT, 2)
    pool = [p.clone() for p in pool_of(engine)]
    first, _ = run(engine, persistent, CONTEXT, 1)
    second, _ = run(engine, persistent, CONTEXT + 1, 1, fresh=False)
    assert torch.equal(together[0], first[0]) and torch.equal(together[1], second[0])
    assert all(torch.equal(a, b) for a, b in zip(pool_of(engine), pool))
