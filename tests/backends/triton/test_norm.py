"""Triton rms_norm and add (backends/triton/norm.py) against their reference twins.

On CPU the kernels run under the Triton interpreter (float16, float32, small shapes); the GPU
cases use bfloat16 at Qwen3 shapes. Outputs are poisoned with NaN before each launch, so an
element left unwritten fails. (The RMSNorm fused into the GEMV is tested in test_linear.py.)
"""

from __future__ import annotations

import zlib

import pytest
import torch

from tileinfer.backends.reference import norm as ref
from tileinfer.backends.triton import norm

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
EPS = 1e-6
# Two ulps of the dtype, relative: the kernel's float32 sum of squares is ordered differently from
# torch's mean, which can move the normalized value across a rounding boundary (one ulp), and the
# weight multiply can round that difference once more. Such a flip is rare, so nearly every element
# must still be bit-identical (half precision; float32 rounds too finely for that).
TOL = {torch.float32: (1e-5, 1e-5), torch.float16: (2e-3, 2.5e-3), torch.bfloat16: (1.6e-2, 1.6e-2)}
MIN_EXACT = 0.98


def gen(*key) -> torch.Generator:
    """A generator seeded from the test case, so every case draws fresh inputs."""
    return torch.Generator(device=DEVICE).manual_seed(zlib.crc32(repr(key).encode()))


def randn(shape, dtype, g, scale=1.0) -> torch.Tensor:
    return (torch.randn(shape, generator=g, device=DEVICE) * scale).to(dtype)


def norm_weight(n, dtype, g) -> torch.Tensor:
    return (torch.rand(n, generator=g, device=DEVICE) + 0.5).to(dtype)  # not ones: a missing weight fails


def poisoned(shape, dtype) -> torch.Tensor:
    return torch.full(shape, float("nan"), dtype=dtype, device=DEVICE)


def assert_close(actual, expected):
    atol, rtol = TOL[expected.dtype]
    assert not actual.isnan().any(), "unwritten (NaN) elements"
    torch.testing.assert_close(actual, expected, atol=atol, rtol=rtol)
    if expected.dtype != torch.float32:
        exact = (actual == expected).float().mean().item()
        assert exact >= MIN_EXACT, f"only {exact:.4f} of the elements are bit-identical to the reference"


CPU_DTYPES = [torch.float16, torch.float32]
TOKENS = [1, 2, 7, 16, 33]


@pytest.mark.parametrize("dtype", CPU_DTYPES, ids=str)
@pytest.mark.parametrize("hidden", [64, 96, 1024])
@pytest.mark.parametrize("t", TOKENS)
def test_rms_norm_rows(t, hidden, dtype):
    g = gen("rows", t, hidden, dtype)
    x = randn((t, hidden), dtype, g, scale=3.0)
    w = norm_weight(hidden, dtype, g)
    out = norm.rms_norm(x, w, EPS, out=poisoned((t, hidden), dtype))
    assert_close(out, ref.rms_norm(x, w, EPS))


@pytest.mark.parametrize("dtype", CPU_DTYPES, ids=str)
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("heads", [1, 2, 8, 12])
@pytest.mark.parametrize("t", [1, 7, 33])
def test_rms_norm_heads(t, heads, head_dim, dtype):
    g = gen("heads", t, heads, head_dim, dtype)
    x = randn((t, heads, head_dim), dtype, g)
    w = norm_weight(head_dim, dtype, g)
    out = norm.rms_norm(x, w, EPS, out=poisoned((t, heads, head_dim), dtype))
    assert_close(out, ref.rms_norm(x, w, EPS))


@pytest.mark.parametrize("dtype", CPU_DTYPES, ids=str)
def test_rms_norm_strided_views(dtype):
    """Head views of a fused projection row (row stride wider than the heads) and a row view."""
    g = gen("strided", dtype)
    t, heads, d = 5, 4, 64
    wide = randn((t, (heads + 3) * d), dtype, g)
    x = wide[:, d:(heads + 1) * d].view(t, heads, d)
    w = norm_weight(d, dtype, g)
    assert_close(norm.rms_norm(x, w, EPS), ref.rms_norm(x, w, EPS))
    rows = wide[:, : 2 * d]
    w2 = norm_weight(2 * d, dtype, g)
    assert_close(norm.rms_norm(rows, w2, EPS), ref.rms_norm(rows, w2, EPS))


@pytest.mark.parametrize("dtype", CPU_DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(1, 64), (7, 96), (33, 1024), (3, 1500)])
def test_add_is_rounded_sum(shape, dtype):
    g = gen("add", shape, dtype)
    x, r = randn(shape, dtype, g), randn(shape, dtype, g, scale=10.0)
    out = norm.add(x, r, out=poisoned(shape, dtype))
    assert torch.equal(out, x + r)


@pytest.mark.parametrize("warps", [None, 2, 4])
@pytest.mark.parametrize("t", TOKENS)
def test_rms_norm_rows_with_the_gemv_warps(t, warps):
    """``num_warps``: the row kernel launched with a GEMV's warps (linear_unfused's norm)."""
    dtype = torch.float16
    g = gen("rows_warps", t, warps)
    x = randn((t, 1024), dtype, g, scale=4.0)
    w = norm_weight(1024, dtype, g)
    out = norm.rms_norm(x, w, EPS, out=poisoned((t, 1024), dtype), num_warps=warps)
    assert_close(out, ref.rms_norm(x, w, EPS))


def test_rejects_bad_inputs():
    x = torch.zeros(2, 64, device=DEVICE)
    with pytest.raises(AssertionError):
        norm.rms_norm(x, torch.ones(64, dtype=torch.float16, device=DEVICE), EPS)  # weight dtype
    with pytest.raises(AssertionError):
        norm.rms_norm(x.t(), torch.ones(2, device=DEVICE), EPS)  # last dim not contiguous
    with pytest.raises(AssertionError):
        norm.rms_norm(torch.zeros(2, 63, device=DEVICE), torch.ones(63, device=DEVICE), EPS)  # odd
    with pytest.raises(AssertionError):
        norm.add(x, torch.zeros(2, 32, device=DEVICE))  # shapes differ
    with pytest.raises(AssertionError):
        norm.rms_norm(torch.zeros(2, 4, 64, device=DEVICE), torch.ones(64, device=DEVICE), EPS, num_warps=2)


# -- GPU: bfloat16 at real shapes, fused == unfused bit for bit ---------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("hidden", [1024, 2560, 4096])
@pytest.mark.parametrize("t", [1, 16, 1024])
def test_gpu_add_and_rms_norm_rows_bf16(t, hidden):
    dtype = torch.bfloat16
    g = gen("gpu_add_rms_norm", t, hidden)
    x, r = randn((t, hidden), dtype, g), randn((t, hidden), dtype, g, scale=8.0)
    w = norm_weight(hidden, dtype, g)
    s = norm.add(x, r, out=poisoned((t, hidden), dtype))
    assert torch.equal(s, x + r)
    for warps in (None, 2, 4):
        assert_close(norm.rms_norm(s, w, EPS, out=poisoned((t, hidden), dtype), num_warps=warps),
                     ref.rms_norm(s, w, EPS))


@pytest.mark.gpu
@pytest.mark.parametrize("heads", [8, 32])
@pytest.mark.parametrize("t", [1, 16, 1024])
def test_gpu_rms_norm_heads_bf16(t, heads):
    dtype = torch.bfloat16
    g = gen("gpu_heads", t, heads)
    x = randn((t, heads, 128), dtype, g)
    w = norm_weight(128, dtype, g)
    out = norm.rms_norm(x, w, EPS, out=poisoned((t, heads, 128), dtype))
    assert_close(out, ref.rms_norm(x, w, EPS))
