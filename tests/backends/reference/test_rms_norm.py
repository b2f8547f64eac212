"""rms_norm (backends/reference/rms_norm.py) against its definition in float64."""

from __future__ import annotations

import torch

from tileinfer.backends.reference.rms_norm import rms_norm


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_rms_norm_matches_definition():
    x = torch.randn(5, 32, generator=gen(13)) * 3
    w = torch.rand(32, generator=gen(14)) + 0.5
    xd = x.double()
    expected = w.double() * xd / torch.sqrt(xd.pow(2).mean(-1, keepdim=True) + 1e-6)
    torch.testing.assert_close(rms_norm(x, w, 1e-6).double(), expected, atol=1e-5, rtol=1e-5)
