"""``forward=persistent`` against its twin, the per-op step (``forward=per_op``).

On a CPU the kernel runs in the Triton interpreter with one program taking every work item in
order (each counter already at its target when checked), float32. Its GEMV tiles reduce through
``tl.dot`` over 16-row tiles and its attention over fixed chunks of positions, where the per-op
step reduces in other orders (float32 rounding: logits and pages agree to 2e-5 here, a few
ulps of their magnitude). Its rows are batch-invariant: a token's logits and keys are the same
bits in a 1-token step and in a step of several tokens. Non-causal steps (the DFlash drafter's
block, over the drafter's own stack) run in it too. What it does not cover runs the per-op step,
with one notice. The checkpoint's hidden size (96) and intermediate size (160) are not
multiples of the tiles (64); the context (140 positions) spans three 64-position chunks over two
splits, so a split takes two chunks.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

import tileinfer
from tileinfer.errors import ConfigError
from tileinfer.interfaces import Step
from tileinfer.model import stack_forward
from tileinfer.plugins.per_op import PerOpForward
from tileinfer.plugins.persistent_forward import PersistentForward

ROOT = Path(__file__).resolve().parents[2]
OPTIONS = {"num_splits": 2, "chunk": 64, "block_n": "64,64,64,64,64", "block_k": 64}
CKPT = dict(tokenizer=False, hidden=96, intermediate=160, layers=2, seed=3)
CONTEXT = 140
pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter's tests (CPU tensors); on a GPU: "
                                "test_persistent_gpu.py")
TOL = dict(rtol=2e-5, atol=2e-5)


def build(folder, **keys) -> tileinfer.Engine:
    return tileinfer.Engine.from_config("reference", model=str(folder), device="cpu", dtype="float32",
                                        kv_page_size=16, progress=False, **keys)


class Case:
    """An engine with CONTEXT positions prefilled by the per-op step, and the pages to restore."""

    def __init__(self, folder, **keys) -> None:
        self.engine = build(folder, **keys)
        self.model, self.kv = self.engine.model, self.engine.kv
        self.ids = torch.randint(0, 320, (CONTEXT + 16,), generator=torch.Generator().manual_seed(7))
        self.kv.reset()
        self.kv.k.zero_()  # pages no step writes compare equal (an allocation's garbage may hold NaN)
        self.kv.v.zero_()
        self.kv.reserve(CONTEXT)
        stack_forward(self.model, self.ids[:CONTEXT], Step.at(0, CONTEXT, self.model.device), self.kv)
        self.pages = (self.kv.k.clone(), self.kv.v.clone())
        self.per_op = PerOpForward(self.model)
        self.persistent = PersistentForward(self.model, options=OPTIONS)

    def step(self, forward, start: int, t: int, **kw):
        """One step of ``t`` tokens after ``start`` positions (pages as after the prefill before
        ``start``... the ones a previous call of this case wrote stay)."""
        self.kv.truncate(start)
        self.kv.reserve(start + t)
        return forward(self.ids[start:start + t], Step.at(start, t, self.model.device), self.kv, **kw)

    def restore(self) -> None:
        self.kv.k.copy_(self.pages[0])
        self.kv.v.copy_(self.pages[1])


@pytest.fixture(scope="module")
def case(checkpoint_factory):
    return Case(checkpoint_factory(**CKPT))


def test_step_matches_the_per_op_step_from_poisoned_buffers(case):
    t = 3
    ref, ref_hidden = case.step(case.per_op, CONTEXT, t, capture=(0,))
    ref_pages = case.kv.k.clone(), case.kv.v.clone()
    case.restore()
    _, bufs = case.persistent._bind(case.kv)
    bufs.poison()
    out, hidden = case.step(case.persistent, CONTEXT, t, capture=(0,))
    assert out.shape == ref.shape == (t, 320) and not out.isnan().any()
    torch.testing.assert_close(out, ref, **TOL)
    torch.testing.assert_close(hidden[0], ref_hidden[0], **TOL)
    for new, old in zip((case.kv.k, case.kv.v), ref_pages):
        torch.testing.assert_close(new, old, **TOL)
    assert torch.equal(case.kv.k[:, :, :, :CONTEXT % 16], case.pages[0][:, :, :, :CONTEXT % 16])  # nothing else moved
    assert not bufs.counters.any(), "the counters are zero again for the next launch"


def test_rows_are_the_same_bits_in_one_step_or_several(case):
    case.restore()
    together, _ = case.step(case.persistent, CONTEXT, 2)
    together, pages = together.clone(), case.kv.k.clone()
    case.restore()
    first, _ = case.step(case.persistent, CONTEXT, 1)
    first = first.clone()
    second, _ = case.step(case.persistent, CONTEXT + 1, 1)
    assert torch.equal(together[0], first[0]) and torch.equal(together[1], second[0])
    assert torch.equal(case.kv.k, pages)


@pytest.mark.parametrize("options", [{"stages": 1}, {"item_calls": True}])
def test_how_the_chunks_are_loaded_changes_no_bit(case, options):
    """Options that change when a chunk is loaded or how the kernel is compiled, not what it adds up
    (the counters zero again after)."""
    case.restore()
    plain, _ = case.step(case.persistent, CONTEXT, 3)
    plain = plain.clone()
    case.restore()
    fwd = PersistentForward(case.model, options={**OPTIONS, **options})
    out, _ = case.step(fwd, CONTEXT, 3)
    assert torch.equal(out, plain) and not fwd._bind(case.kv)[1].counters.any()


def test_split_k_runs_match_the_per_op_step_and_keep_rows_batch_invariant(case):
    """``split_k``: o_proj and down tiles in K runs, their partial sums added in run order by the
    tile's last: the per-op step's logits (float32: within TOL), and a token's row the same bits
    alone or in a step of several."""
    fwd = PersistentForward(case.model, options={**OPTIONS, "split_k": 2})
    case.restore()
    ref, _ = case.step(case.per_op, CONTEXT, 3)
    case.restore()
    _, bufs = fwd._bind(case.kv)
    bufs.poison()
    together, _ = case.step(fwd, CONTEXT, 3)
    torch.testing.assert_close(together, ref, **TOL)
    together = together.clone()
    case.restore()
    alone, _ = case.step(fwd, CONTEXT, 1)
    assert torch.equal(alone[0], together[0]) and not bufs.counters.any()


def test_last_only_and_no_logits(case):
    ref, _ = case.step(case.per_op, CONTEXT, 2, last_only=True)
    case.restore()
    last, _ = case.step(case.persistent, CONTEXT, 2, last_only=True)
    assert last.shape == (1, 320)
    torch.testing.assert_close(last, ref, **TOL)
    case.restore()
    none, hidden = case.step(case.persistent, CONTEXT, 2, logits=False, capture=(1,))
    assert none is None and hidden[1].shape == (2, 96)


def test_int8_weights_match_the_per_op_step(checkpoint_factory):
    c = Case(checkpoint_factory(**CKPT), quantize="int8")
    ref, _ = c.step(c.per_op, CONTEXT, 2)
    c.restore()
    out, _ = c.step(c.persistent, CONTEXT, 2)
    torch.testing.assert_close(out, ref, **TOL)


class OtherPages:
    """The case's KV store, claiming a page format the kernel does not read."""

    def __init__(self, kv) -> None:
        self.kv, self.storage = kv, "fp8"

    def __getattr__(self, name):
        return getattr(self.kv, name)


def test_what_it_does_not_cover_runs_the_per_op_step_with_one_notice(case, caplog):
    step = Step.at(CONTEXT, 2, case.model.device)
    ids = case.ids[CONTEXT:CONTEXT + 2]
    with caplog.at_level(logging.WARNING, logger="tileinfer"):
        for _ in range(2):
            case.restore()
            out, _ = case.persistent(ids, step, OtherPages(case.kv))
    assert [r.getMessage() for r in caplog.records] == [
        "forward=persistent: KV pages stored as fp8 are not covered yet; those steps run the per-op step"]
    case.restore()
    ref, _ = case.per_op(ids, step, case.kv)
    assert torch.equal(out, ref) and not out.isnan().any()


def test_the_shipped_family_runs_through_it(caplog):
    """models/target (its draft model and DFlash drafter alike) has 3 query heads a kv head:
    attention tiles of 48 rows padded to 64. The per-op step's last hidden states and pages, the rows
    batch-invariant, no notice. (Hidden states, not logits, and K unsplit: the interpreter's time.)"""
    with caplog.at_level(logging.WARNING, logger="tileinfer"):
        shipped = Case(ROOT / "models" / "target")
        fwd = PersistentForward(shipped.model, options={**OPTIONS, "block_k": 128, "split_k": 1})
    last = shipped.model.config.num_layers - 1
    assert shipped.model.config.num_heads // shipped.model.config.num_kv_heads == 3
    assert fwd.reason is None and not caplog.records
    _, ref = shipped.step(shipped.per_op, CONTEXT, 3, logits=False, capture=(last,))
    ref_pages = shipped.kv.k.clone(), shipped.kv.v.clone()
    shipped.restore()
    _, bufs = fwd._bind(shipped.kv)
    bufs.poison()
    _, out = shipped.step(fwd, CONTEXT, 3, logits=False, capture=(last,))
    torch.testing.assert_close(out[last], ref[last], **TOL)
    for new, old in zip((shipped.kv.k, shipped.kv.v), ref_pages):
        torch.testing.assert_close(new, old, **TOL)
    together = out[last].clone()
    shipped.restore()
    _, alone = shipped.step(fwd, CONTEXT, 1, logits=False, capture=(last,))
    assert torch.equal(alone[last][0], together[0]) and not bufs.counters.any() and not caplog.records


def test_a_weight_off_the_16_byte_grid_is_named(case, monkeypatch, caplog):
    """The kernel loads weights in 16-byte vectors: a weight at an address off that grid (a view
    into a larger buffer) runs the per-op step, with the reason."""
    weight = case.model.layers[1].o_proj.weight
    shifted = torch.zeros(weight.numel() + 1, dtype=weight.dtype)[1:].view_as(weight).copy_(weight)
    monkeypatch.setattr(case.model.layers[1].o_proj, "weight", shifted)
    with caplog.at_level(logging.WARNING, logger="tileinfer"):
        fwd = PersistentForward(case.model, options=OPTIONS)
    assert fwd.reason == "a weight it reads is not 16-byte aligned"
    assert "not 16-byte aligned; those steps run the per-op step" in caplog.text


def test_a_non_causal_step_matches_the_per_op_step(case):
    """Every query of a non-causal step (a block drafter's) sees every key of the step too."""
    step = Step.at(CONTEXT, 5, case.model.device, causal=False)
    ids = case.ids[CONTEXT:CONTEXT + 5]
    case.restore()
    case.kv.truncate(CONTEXT)
    case.kv.reserve(CONTEXT + 5)
    ref, _ = case.per_op(ids, step, case.kv)
    case.restore()
    out, _ = case.persistent(ids, step, case.kv)
    torch.testing.assert_close(out, ref, **TOL)


def test_the_dflash_drafters_block_runs_through_it(checkpoint_factory, tmp_path, caplog):
    """The DFlash drafter's stack (its own layers and KV store, the target's embedding and lm_head)
    runs its non-causal block step, after cached context, in the persistent step: the per-op
    step's logits of block rows 1..B-1, no notice."""
    from dflash_checkpoints import TARGET, make_dflash

    drafter = make_dflash(tmp_path / "d", heads=4, kv_heads=2, head_dim=16, block=8)
    e = build(checkpoint_factory(**TARGET), proposer="dflash", spec_k=7, options={"dflash": {"model": str(drafter)}})
    d, kv = e.proposer.model, e.proposer.kv
    context = torch.randn(37, d.config.model.hidden_size, generator=torch.Generator().manual_seed(5)) * 0.5
    block = torch.randint(0, 320, (8,), generator=torch.Generator().manual_seed(6))
    rows = torch.arange(1, 8)
    kv.reset()
    kv.reserve(37 + 8)
    d.write_context(context, Step.at(0, 37, d.device), kv)
    step = Step.at(37, 8, d.device, causal=False)
    ref, _ = PerOpForward(d)(block, step, kv, rows=rows)
    with caplog.at_level(logging.WARNING, logger="tileinfer"):
        fwd = PersistentForward(d, options=OPTIONS)
        out, _ = fwd(block, step, kv, rows=rows)
    assert fwd.reason is None and not caplog.records
    assert out.shape == ref.shape == (7, 320)
    torch.testing.assert_close(out, ref, **TOL)


def test_a_stack_that_is_not_qwen3_is_named(case, caplog):
    with caplog.at_level(logging.WARNING, logger="tileinfer"):
        fwd = PersistentForward(type("Block", (), {"device": torch.device("cpu")})(), options=OPTIONS)
    assert fwd.reason == "it runs Qwen3 decoder stacks, not Block"
    assert "not Block; those steps run the per-op step" in caplog.text


@pytest.mark.parametrize("bad, words", [({"block_n": "64,64"}, "five powers of two"),
                                        ({"block_n": "64,64,48,64,64"}, "five powers of two"),
                                        ({"block_n": "64,auto,64,64,64"}, "qkv's may be auto"),
                                        ({"block_k": 96}, "block_k=96"), ({"chunk": 96}, "chunk=96"),
                                        ({"num_warps": 6}, "num_warps=6: 4 or 8"),
                                        ({"block_n": "64,64,128,64,64", "block_k": 64},
                                         "gate_up's 128 columns exceed block_k=64")])
def test_bad_options_are_refused_at_load(checkpoint_factory, bad, words):
    overrides = ["forward=persistent", *(f"options.persistent.{k}={v}" for k, v in bad.items())]
    with pytest.raises(ConfigError, match=words):
        tileinfer.Engine.from_config("reference", overrides=overrides, model=str(checkpoint_factory(**CKPT)),
                                     device="cpu", progress=False)
