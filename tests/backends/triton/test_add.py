"""Triton add (backends/triton/add.py) against its twin (backends/reference/add.py): one rounding of
the float32 sum on both sides, so bit for bit. Outputs are poisoned with NaN before each launch."""

from __future__ import annotations

import pytest
import torch

from tileinfer.backends.reference import add as ref
from tileinfer.backends.triton.add import add

from ..kernel_checks import DEVICE, INTERPRETER_DTYPES, assert_same, generator, poisoned, randn


@pytest.mark.parametrize("dtype", INTERPRETER_DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(1, 64), (7, 96), (33, 1024), (3, 1500)])
def test_add_is_rounded_sum(shape, dtype):
    g = generator("add", shape, dtype)
    x, r = randn(shape, dtype, g), randn(shape, dtype, g, scale=10.0)
    assert_same(add(x, r, out=poisoned(shape, dtype)), ref.add(x, r))


@pytest.mark.parametrize("into", ["x", "residual"])
def test_add_in_place(into):
    g = generator("add_in_place", into)
    x, r = randn((3, 100), torch.float16, g), randn((3, 100), torch.float16, g)
    expected = ref.add(x, r)
    out = add(x, r, out=x if into == "x" else r)
    assert out is (x if into == "x" else r)
    assert_same(out, expected)


def test_rejects_bad_inputs():
    x = torch.zeros(2, 64, device=DEVICE)
    with pytest.raises(AssertionError):
        add(x, torch.zeros(2, 32, device=DEVICE))  # shapes differ
    with pytest.raises(AssertionError):
        add(x, x.half())  # dtypes differ
    with pytest.raises(AssertionError):
        add(x.t(), x.t())  # not contiguous


@pytest.mark.gpu
@pytest.mark.parametrize("hidden", [1024, 2560, 4096])
@pytest.mark.parametrize("t", [1, 16, 1024])
def test_gpu_add_bf16(t, hidden):
    dtype = torch.bfloat16
    g = generator("gpu_add", t, hidden)
    x, r = randn((t, hidden), dtype, g), randn((t, hidden), dtype, g, scale=8.0)
    assert_same(add(x, r, out=poisoned((t, hidden), dtype)), ref.add(x, r))
