"""Reference linear ops: matmul (cuBLAS on GPU), SwiGLU, and weight-only INT8 by dequantize + matmul."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def linear(x: torch.Tensor, weight: torch.Tensor, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """``x`` ``[T, K]`` @ ``weight`` ``[N, K]``^T -> ``[T, N]`` in ``out_dtype`` (default x's dtype).

    A float32 ``out_dtype`` on lower-precision inputs accumulates and writes float32 (lm_head logits).
    """
    out_dtype = out_dtype or x.dtype
    if out_dtype == x.dtype:
        return F.linear(x, weight)
    if out_dtype == torch.float32 and x.is_cuda:
        return torch.mm(x, weight.t(), out_dtype=torch.float32)
    return F.linear(x.to(out_dtype), weight.to(out_dtype))


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """SwiGLU of a fused projection: ``gate_up`` ``[T, 2I]`` (gate then up) -> ``silu(gate) * up``, ``[T, I]``."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


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
