"""Triton rms_norm (backends/triton/rms_norm.py) against its twin (backends/reference/rms_norm.py).

Outputs are poisoned with NaN before each launch. The kernel's float32 sum of squares is ordered
differently from torch's mean, which can move the normalized value across a rounding boundary, so
half-precision results must be within one rounding and nearly all bit-identical. (The RMSNorm fused
into the attention inputs is tested in test_attention_inputs.py.)
"""

from __future__ import annotations

import pytest
import torch

from tileinfer.backends.reference import rms_norm as ref
from tileinfer.backends.triton.rms_norm import rms_norm

from ..kernel_checks import DEVICE, EPS, INTERPRETER_DTYPES, MIN_EXACT, assert_close, generator, norm_weight, poisoned, randn

TOKENS = [1, 2, 7, 16, 33]


def check(x, w, **kw):
    out = rms_norm(x, w, EPS, out=poisoned(x.shape, x.dtype), **kw)
    assert_close(out, ref.rms_norm(x, w, EPS), min_exact=MIN_EXACT)


@pytest.mark.parametrize("dtype", INTERPRETER_DTYPES, ids=str)
@pytest.mark.parametrize("hidden", [64, 96, 1024])
@pytest.mark.parametrize("t", TOKENS)
def test_rms_norm_rows(t, hidden, dtype):
    g = generator("rows", t, hidden, dtype)
    check(randn((t, hidden), dtype, g, scale=3.0), norm_weight(hidden, dtype, g))


@pytest.mark.parametrize("dtype", INTERPRETER_DTYPES, ids=str)
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("heads", [1, 2, 8, 12])
@pytest.mark.parametrize("t", [1, 7, 33])
def test_rms_norm_heads(t, heads, head_dim, dtype):
    g = generator("heads", t, heads, head_dim, dtype)
    check(randn((t, heads, head_dim), dtype, g), norm_weight(head_dim, dtype, g))


@pytest.mark.parametrize("dtype", INTERPRETER_DTYPES, ids=str)
def test_rms_norm_strided_views(dtype):
    """Head views of a fused projection row (row stride wider than the heads) and a row view."""
    g = generator("strided", dtype)
    t, heads, d = 5, 4, 64
    wide = randn((t, (heads + 3) * d), dtype, g)
    x = wide[:, d:(heads + 1) * d].view(t, heads, d)
    w = norm_weight(d, dtype, g)
    assert_close(rms_norm(x, w, EPS), ref.rms_norm(x, w, EPS), min_exact=MIN_EXACT)
    rows = wide[:, : 2 * d]
    w2 = norm_weight(2 * d, dtype, g)
    assert_close(rms_norm(rows, w2, EPS), ref.rms_norm(rows, w2, EPS), min_exact=MIN_EXACT)


def test_rejects_bad_inputs():
    x = torch.zeros(2, 64, device=DEVICE)
    with pytest.raises(AssertionError):
        rms_norm(x, torch.ones(64, dtype=torch.float16, device=DEVICE), EPS)  # weight dtype
    with pytest.raises(AssertionError):
        rms_norm(x.t(), torch.ones(2, device=DEVICE), EPS)  # last dim not contiguous
    with pytest.raises(AssertionError):
        rms_norm(torch.zeros(2, 63, device=DEVICE), torch.ones(63, device=DEVICE), EPS)  # odd


# -- GPU: bfloat16 at the Qwen3 shapes -----------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("hidden", [1024, 2560, 4096])
@pytest.mark.parametrize("t", [1, 16, 1024])
def test_gpu_rms_norm_rows_bf16(t, hidden):
    dtype = torch.bfloat16
    g = generator("gpu_rows", t, hidden)
    check(randn((t, hidden), dtype, g, scale=8.0), norm_weight(hidden, dtype, g))


@pytest.mark.gpu
@pytest.mark.parametrize("heads", [8, 32])
@pytest.mark.parametrize("t", [1, 16, 1024])
def test_gpu_rms_norm_heads_bf16(t, heads):
    dtype = torch.bfloat16
    g = generator("gpu_heads", t, heads)
    check(randn((t, heads, 128), dtype, g), norm_weight(128, dtype, g))
