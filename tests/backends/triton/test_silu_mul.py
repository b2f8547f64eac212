"""Triton silu_mul (backends/triton/silu_mul.py) against its twin (backends/reference/silu_mul.py).

The kernel rounds once (float32 silu * up), the twin rounds silu to the model dtype first, and exp
implementations differ. Outputs are poisoned with NaN before each launch.
"""

from __future__ import annotations

import pytest
import torch

from tileinfer.backends.reference import silu_mul as ref
from tileinfer.backends.triton.silu_mul import silu_mul

from ..kernel_checks import DEVICE, INTERPRETER_DTYPES, assert_close, generator, poisoned, randn

DTYPES = INTERPRETER_DTYPES + ([torch.bfloat16] if DEVICE == "cuda" else [])
# (T, I): one decode token, odd widths, a row of exactly one block, widths past one 1024-block
SHAPES = [(1, 64), (2, 1024), (7, 100), (16, 1030), (17, 3), (40, 2049)]


def random_gate_up(T: int, I: int, dtype: torch.dtype, *key) -> torch.Tensor:
    return randn((T, 2 * I), dtype, generator("silu_mul", T, I, dtype, *key), scale=3.0)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("T,I", SHAPES, ids=[f"T{t}-I{i}" for t, i in SHAPES])
def test_silu_mul_matches_reference(T, I, dtype):
    gate_up = random_gate_up(T, I, dtype)
    assert_close(silu_mul(gate_up, out=poisoned((T, I), dtype)), ref.silu_mul(gate_up))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_silu_mul_row_slice_of_wider_buffer(dtype):
    """gate_up may be a column slice (row stride > 2I), e.g. part of a wider projection."""
    T, I = 5, 300
    gate_up = random_gate_up(T, I + 17, dtype, "wide")[:, : 2 * I]
    assert not gate_up.is_contiguous()
    assert_close(silu_mul(gate_up, out=poisoned((T, I), dtype)), ref.silu_mul(gate_up))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_silu_mul_allocates_output(dtype):
    gate_up = random_gate_up(3, 130, dtype)
    out = silu_mul(gate_up)
    assert out.shape == (3, 130) and out.dtype == dtype and out.is_contiguous()
    assert_close(out, ref.silu_mul(gate_up))


@pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning")  # the interpreter's numpy exp
def test_silu_mul_extreme_values():
    """Large |gate|: exp(-g) overflows to inf for very negative g, and silu must give -0, not NaN."""
    gate = torch.tensor([[-200.0, -90.0, -20.0, 0.0, 20.0, 90.0, 200.0, -1.0]], device=DEVICE)
    gate_up = torch.cat([gate, torch.full_like(gate, 2.0)], dim=1)
    assert_close(silu_mul(gate_up, out=poisoned((1, 8), torch.float32)), ref.silu_mul(gate_up))


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
    gate_up = random_gate_up(T, I, torch.bfloat16)
    assert_close(silu_mul(gate_up, out=poisoned((T, I), torch.bfloat16)), ref.silu_mul(gate_up))
