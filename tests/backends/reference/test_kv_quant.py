"""Per-vector INT8 of the KV cache (backends/reference/kv_quant.py) against its error bound."""

from __future__ import annotations

import torch

from tileinfer.backends.reference.kv_quant import dequantize_per_vector, quantize_per_vector


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_quantize_per_vector_round_trip():
    x = torch.randn(7, 3, 64, generator=gen(11)) * torch.logspace(-2, 2, 7)[:, None, None]
    q, scale = quantize_per_vector(x)
    assert q.dtype == torch.int8 and scale.shape == (7, 3)
    assert q.abs().max() <= 127 and (q.abs().amax(-1) == 127).all()
    err = (dequantize_per_vector(q, scale, torch.float32) - x).abs()
    assert (err <= scale[..., None] / 2 * (1 + 1e-5)).all()
    # a single scale per row would not satisfy the bound for the small vectors
    assert err[0].max() < x[0].abs().max() / 100
