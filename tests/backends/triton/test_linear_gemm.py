"""The GEMM (backends/triton/linear_gemm.py) with its tile computed transposed (``swap_ab``: w x^T,
the int8 rule's form), reached through ``linear`` for both weight formats: against the twin on odd
shapes, and its fused forms against the per-op chain on the same tiles under kernel_checks.py's
policy (the residual epilogue bit for bit; the SwiGLU one on I = 100, which starts mid-tile, within
the policy's tolerance, and bit for bit on I = 64)."""

from __future__ import annotations

import pytest
import torch

from tileinfer.backends.reference.linear import linear as ref_linear
from tileinfer.backends.triton.linear import GemmConfig

from ..kernel_checks import DEVICE, INTERPRETER_DTYPES, assert_close, assert_fused, generator
from .per_op_chains import linear_per_op
from .test_linear import ALIGNED, FORMATS, ODD, run, weights

SWAPPED = GemmConfig(32, 64, 32, 2, 4, 2, swap_ab=True)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dtype", INTERPRETER_DTYPES, ids=str)
def test_swapped_gemm_tiles(dtype, fmt):
    T, (N, K) = 40, ODD
    x, w, scale = weights(fmt, T, N, K, dtype, "swap")
    assert_close(run(x, w, scale, config=SWAPPED), ref_linear(x, w, scale))
    fused = run(x, w, scale, swiglu=True, config=SWAPPED)
    assert_fused(fused, linear_per_op(x, w, scale, swiglu=True, config=SWAPPED), aligned=(N // 2) % SWAPPED.block_n == 0)
    r = torch.randn(T, N, generator=generator("swap-r", dtype), device=DEVICE).to(dtype)
    assert_fused(run(x, w, scale, config=SWAPPED, residual=r), linear_per_op(x, w, scale, residual=r, config=SWAPPED))
    x, w, scale = weights(fmt, T, *ALIGNED, dtype, "swap-aligned")
    fused = run(x, w, scale, swiglu=True, config=SWAPPED)
    assert_fused(fused, linear_per_op(x, w, scale, swiglu=True, config=SWAPPED))
