"""Reference weight-only INT8 linear: per-output-channel quantization, then dequantize + matmul."""

from __future__ import annotations

import torch

from tileinfer.backends.reference.linear import linear


def quantize_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric per-output-channel INT8: ``weight`` ``[N, K]`` -> (``q`` int8 ``[N, K]``,
    ``scale`` float32 ``[N]``) with ``weight ~= q * scale[:, None]`` and ``|q| <= 127``."""
    w = weight.float()
    scale = w.abs().amax(dim=1).clamp(min=1e-12) / 127.0
    q = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8)
    return q, scale


def dequantize_int8(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``q * scale[:, None]`` computed in float32, returned in ``dtype``."""
    return (q.float() * scale[:, None]).to(dtype)


def linear_int8(
    x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, out_dtype: torch.dtype | None = None
) -> torch.Tensor:
    """Weight-only INT8 linear: dequantize the whole weight to x's dtype, then ``linear``."""
    return linear(x, dequantize_int8(q, scale, x.dtype), out_dtype)
