"""add (backends/reference/add.py): the sum rounded once, as float64 arithmetic rounds it."""

from __future__ import annotations

import pytest
import torch

from tileinfer.backends.reference.add import add


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
def test_add_rounds_the_exact_sum_once(dtype):
    g = torch.Generator().manual_seed(40)
    x, r = torch.randn(5, 300, generator=g).to(dtype), (torch.randn(5, 300, generator=g) * 10).to(dtype)
    y = add(x, r)
    assert y.dtype == dtype
    assert torch.equal(y, (x.double() + r.double()).to(dtype))
