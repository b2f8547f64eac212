"""Reference INT8 KV-cache ops: symmetric INT8 with one float32 scale per vector, and the key
smoothing that evens the channels out before quantization (the ``paged_int8`` KV store's ops)."""

from __future__ import annotations

import torch


def quantize_per_vector(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric INT8 with one float32 scale per vector of the last dim: ``x ~= q * scale[..., None]``."""
    xf = x.float()
    scale = xf.abs().amax(dim=-1).clamp(min=1e-12) / 127.0
    q = torch.round(xf / scale[..., None]).clamp(-127, 127).to(torch.int8)
    return q, scale


def dequantize_per_vector(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``q * scale[..., None]`` computed in float32, returned in ``dtype``."""
    return (q.float() * scale[..., None]).to(dtype)


def key_smoothing(k_norm_weight: torch.Tensor) -> torch.Tensor:
    """Per-channel divisor for keys before INT8 quantization, from the key RMSNorm's weight.

    A key's channel ``i`` is about ``|w_i|`` times a unit-scale value, so dividing by ``|w|`` evens
    the channels out and the one scale per vector wastes fewer levels. RoPE mixes channel ``i`` with
    ``i + D/2``, so both get the same divisor (the RMS of the pair) and the division commutes with
    the rotation: ``q.k = (q * s).(k / s)`` exactly in real arithmetic. Returns ``[D]`` float32.
    """
    w = k_norm_weight.float()
    a, b = w.chunk(2)
    pair = torch.sqrt((a * a + b * b) / 2).clamp(min=1e-6)
    return torch.cat((pair, pair))
