"""silu_mul (tileinfer.backends.triton.swiglu) against its reference twin.

Without a GPU the kernel runs under the Triton interpreter (tests/conftest.py sets TRITON_INTERPRET
before this module imports it), on float16 / float32 data; with one, on bfloat16 as well.
"""

from __future__ import annotations

import pytest
import torch

from tileinfer.backends.reference.linear import silu_mul as ref_silu_mul
from tileinfer.backends.triton.swiglu import silu_mul

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.float16, torch.float32] + ([torch.bfloat16] if DEVICE == "cuda" else [])
# (atol, rtol): the kernel rounds once (float32 silu * up), the twin rounds silu to the model dtype
# first, and exp implementations differ: up to ~2 ulps of the model dtype apart.
TOL = {torch.float32: (1e-5, 1e-5), torch.float16: (2e-3, 2e-3), torch.bfloat16: (1.6e-2, 1.6e-2)}
# (T, I): one decode token, odd widths, a row of exactly one block, widths past one 1024-block
SHAPES = [(1, 64), (2, 1024), (7, 100), (16, 1030), (17, 3), (40, 2049)]


def poisoned(shape, dtype) -> torch.Tensor:
    return torch.full(shape, float("nan"), dtype=dtype, device=DEVICE)


def random_gate_up(T: int, I: int, dtype: torch.dtype, seed: int, scale: float = 3.0) -> torch.Tensor:
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    return (torch.randn(T, 2 * I, generator=g, device=DEVICE) * scale).to(dtype)


def check(out: torch.Tensor, ref: torch.Tensor) -> None:
    assert out.dtype == ref.dtype and out.shape == ref.shape
    assert not out.isnan().any(), f"{int(out.isnan().sum())} elements unwritten (NaN poison left)"
    atol, rtol = TOL[out.dtype]
    torch.testing.assert_close(out.float(), ref.float(), atol=atol, rtol=rtol)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("T,I", SHAPES, ids=[f"T{t}-I{i}" for t, i in SHAPES])
def test_silu_mul_matches_reference(T, I, dtype):
    seed = 1000 + 97 * T + I + 7 * DTYPES.index(dtype)
    gate_up = random_gate_up(T, I, dtype, seed)
    out = silu_mul(gate_up, out=poisoned((T, I), dtype))
    check(out, ref_silu_mul(gate_up))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_silu_mul_row_slice_of_wider_buffer(dtype):
    """gate_up may be a column slice (row stride > 2I), e.g. part of a wider projection."""
    T, I = 5, 300
    wide = random_gate_up(T, I + 17, dtype, seed=2024)
    gate_up = wide[:, : 2 * I]
    assert not gate_up.is_contiguous()
    out = silu_mul(gate_up, out=poisoned((T, I), dtype))
    check(out, ref_silu_mul(gate_up))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_silu_mul_allocates_output(dtype):
    gate_up = random_gate_up(3, 130, dtype, seed=77)
    out = silu_mul(gate_up)
    assert out.shape == (3, 130) and out.dtype == dtype and out.is_contiguous()
    check(out, ref_silu_mul(gate_up))


@pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning")  # the interpreter's numpy exp
def test_silu_mul_extreme_values():
    """Large |gate|: exp(-g) overflows to inf for very negative g, and silu must give -0, not NaN."""
    gate = torch.tensor([[-200.0, -90.0, -20.0, 0.0, 20.0, 90.0, 200.0, -1.0]], device=DEVICE)
    up = torch.full_like(gate, 2.0)
    gate_up = torch.cat([gate, up], dim=1)
    out = silu_mul(gate_up, out=poisoned((1, 8), torch.float32))
    check(out, ref_silu_mul(gate_up))


def test_silu_mul_rejects_bad_input():
    with pytest.raises(AssertionError):
        silu_mul(torch.zeros(2, 7, device=DEVICE))  # odd width
    with pytest.raises(AssertionError):
        silu_mul(torch.zeros(8, 2, device=DEVICE).t())  # column stride != 1
    with pytest.raises(AssertionError):
        silu_mul(torch.zeros(2, 8, device=DEVICE), out=torch.zeros(2, 4, dtype=torch.float16, device=DEVICE))


QWEN3_INTERMEDIATE = {"Qwen3-0.6B": 3072, "Qwen3-4B": 9728}


@pytest.mark.gpu
@pytest.mark.parametrize("model", sorted(QWEN3_INTERMEDIATE))
@pytest.mark.parametrize("T", [1, 4, 16, 64, 1024])
def test_silu_mul_gpu_bf16_real_shapes(model, T):
    I = QWEN3_INTERMEDIATE[model]
    gate_up = random_gate_up(T, I, torch.bfloat16, seed=5000 + T + I)
    out = silu_mul(gate_up, out=poisoned((T, I), torch.bfloat16))
    check(out, ref_silu_mul(gate_up))
