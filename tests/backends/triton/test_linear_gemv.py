"""The GEMV's split-K (backends/triton/linear_gemv.py), reached through ``linear`` with explicit
tiles for both weight formats: the partials over all weight rows with the epilogues in the reduce
kernel, or added by the last split's program (``fused_reduce``) counting on the caller's counters,
which every launch leaves at zero. The SwiGLU epilogue runs elementwise on the plain kernel's
partials, so it is bit-identical to the per-op chain even where I = 24 is not a multiple of
BLOCK_N (kernel_checks.py's policy)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from tileinfer.backends.reference.linear import linear as ref_linear
from tileinfer.backends.triton.linear import GemvConfig, linear

from ..kernel_checks import DEVICE, assert_close, assert_fused, generator, poisoned
from .per_op_chains import linear_per_op
from .test_linear import FORMATS, run, weights

# K = 136 in 32-wide chunks (5 chunks, the last one partial) over 3 splits of 2, 2, 1 chunks
SPLIT = GemvConfig(block_n=16, block_k=32, split_k=3, num_warps=4, num_stages=1)
# N = 40: three 16-column blocks, the last one partial (each block has its own counter)
TAIL = (40, 136)
FUSED = dataclasses.replace(SPLIT, fused_reduce=True)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("swiglu", [False, True], ids=["plain", "swiglu"])
@pytest.mark.parametrize("T", [1, 2, 16])
def test_split_k(T, swiglu, fmt):
    """Split partials, the epilogues in the reduce: against the twin, float32 logits, the fused
    SwiGLU and residual against the per-op chain on the same tiles."""
    dtype = torch.float16
    N, K = 48, 136
    x, w, scale = weights(fmt, T, N, K, dtype, "split", swiglu)
    y = run(x, w, scale, swiglu=swiglu, config=SPLIT)
    assert_close(y, ref_linear(x, w, scale, swiglu=swiglu), "two_roundings" if swiglu else "one_rounding")
    logits = run(x, w, scale, torch.float32, swiglu, config=SPLIT)
    assert_close(logits, ref_linear(x, w, scale, out_dtype=torch.float32, swiglu=swiglu), dtype=dtype)
    r = torch.randn(T, N // 2 if swiglu else N, generator=generator("split-r", T), device=DEVICE).to(dtype)
    fused = run(x, w, scale, swiglu=swiglu, config=SPLIT, residual=r)
    assert_fused(fused, linear_per_op(x, w, scale, swiglu=swiglu, residual=r, config=SPLIT))


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("T", [1, 2, 16])
def test_fused_split_reduce_is_the_reduce_kernel_bit_for_bit(T, fmt):
    """Split-K with the partials added by the last split's program (fused_reduce): the bits of the
    reduce kernel, with the residual and a float32 output, over an N tail (N = 40 in 16-column
    blocks) and a partial last K chunk; the counters are left at 0 for the next launch."""
    dtype = torch.float16
    N, K = TAIL
    x, w, scale = weights(fmt, T, N, K, dtype, "fused-split")
    r = torch.randn(T, N, generator=generator("fused-split-r", T), device=DEVICE).to(dtype)
    counters = torch.zeros(-(-N // FUSED.block_n), dtype=torch.int32, device=DEVICE)
    for kw in (dict(residual=r), dict(out_dtype=torch.float32)):
        y = run(x, w, scale, config=FUSED, counters=counters, **kw)
        assert torch.equal(y, run(x, w, scale, config=SPLIT, **kw))
        assert not counters.any()
    assert_close(run(x, w, scale, config=FUSED), ref_linear(x, w, scale))  # counters made for the call


def test_fused_reduce_refuses_too_few_counters():
    x, w, _ = weights("none", 2, *TAIL, torch.float16, "few-counters")
    with pytest.raises(AssertionError, match="the fused reduce needs 3 int32 counters"):
        linear(x, w, config=FUSED, counters=torch.zeros(2, dtype=torch.int32, device=DEVICE))
    fused = linear(x, w, config=FUSED, out=poisoned((2, TAIL[0]), torch.float16))
    assert torch.equal(fused, linear(x, w, config=SPLIT))
