"""The reference linear (backends/reference/linear.py) against float64 arithmetic: its int8 weight
format (per-output-channel quantization, the scale after the matmul) and its epilogues."""

from __future__ import annotations

import torch

from tileinfer.backends.reference.linear import dequantize_int8, linear, quantize_int8


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_quantize_int8_round_trip():
    w = torch.randn(48, 96, generator=gen(9)) * torch.logspace(-3, 1, 48)[:, None]
    w[5] = 0.0
    q, scale = quantize_int8(w)
    assert q.dtype == torch.int8 and q.shape == w.shape and scale.shape == (48,) and scale.dtype == torch.float32
    assert q.abs().max() <= 127
    assert (q.abs().amax(1)[torch.arange(48) != 5] == 127).all()  # the largest |w| of a row maps to 127
    torch.testing.assert_close(scale, w.abs().amax(1).clamp(min=1e-12) / 127)
    err = (dequantize_int8(q, scale, torch.float32) - w).abs()
    assert (err <= scale[:, None] / 2 * (1 + 1e-5) + 1e-12).all()
    assert (dequantize_int8(q, scale, torch.float32)[5] == 0).all()
    x = torch.randn(5, 96, generator=gen(10))
    torch.testing.assert_close(linear(x, q, scale), x @ (q.double() * scale.double()[:, None]).float().T,
                               atol=1e-5, rtol=1e-5)


def test_int8_scale_after_the_matmul_and_epilogues():
    """``(x q^T) * scale`` with SwiGLU and the residual, against float64; -128 is a valid code."""
    g = gen(11)
    x = torch.randn(4, 64, generator=g) * 7
    q = torch.randint(-128, 128, (48, 64), generator=g, dtype=torch.int8)
    scale = torch.rand(48, generator=g) / 500 + 1e-3
    r = torch.randn(4, 24, generator=g)
    y = linear(x, q, scale, swiglu=True, residual=r)
    full = x.double() @ q.double().T * scale.double()
    gate, up = full[:, :24], full[:, 24:]
    expected = gate * torch.sigmoid(gate) * up + r.double()
    torch.testing.assert_close(y.double(), expected, atol=1e-4, rtol=1e-4)
    logits = linear(x.half(), q, scale, out_dtype=torch.float32)
    assert logits.dtype == torch.float32
    torch.testing.assert_close(logits.double(), x.half().double() @ q.double().T * scale.double(), atol=1e-4, rtol=1e-5)


def test_model_dtype_weight_and_epilogues():
    """``x W^T`` with SwiGLU and the residual in the model dtype, and float32 logits of half inputs."""
    g = gen(12)
    x, w, r = torch.randn(4, 64, generator=g), torch.randn(48, 64, generator=g) / 8, torch.randn(4, 24, generator=g)
    full = x.double() @ w.double().T
    gate, up = full[:, :24], full[:, 24:]
    expected = gate * torch.sigmoid(gate) * up + r.double()
    torch.testing.assert_close(linear(x, w, swiglu=True, residual=r).double(), expected, atol=1e-5, rtol=1e-5)
    logits = linear(x.half(), w.half(), out_dtype=torch.float32)
    assert logits.dtype == torch.float32
    torch.testing.assert_close(logits.double(), x.half().double() @ w.half().double().T, atol=1e-5, rtol=1e-5)
