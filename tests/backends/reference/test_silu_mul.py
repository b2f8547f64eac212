"""silu_mul (backends/reference/silu_mul.py) against torch's silu."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from tileinfer.backends.reference.silu_mul import silu_mul


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_silu_mul():
    x = torch.randn(4, 20, generator=gen(12))
    torch.testing.assert_close(silu_mul(x), F.silu(x[:, :10]) * x[:, 10:])
