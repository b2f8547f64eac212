"""Reference weight-only INT8 linear (W8A16): per-output-channel quantization, and ``y = (x q^T) *
scale`` with the RMSNorm before it and the SwiGLU / residual-add epilogues after it, one torch op
after the other; twin of backends/triton/linear_int8.py.

Arithmetic (the kernels'): int8 -> the activation dtype is exact (|q| <= 128), so ``x q^T`` is a
float32-accumulated matmul of exact operands; the float32 per-channel scale multiplies the float32
accumulator, and the product is rounded once to the output dtype.
"""

from __future__ import annotations

import torch

from tileinfer.backends.reference.add import add
from tileinfer.backends.reference.linear import linear
from tileinfer.backends.reference.rms_norm import rms_norm
from tileinfer.backends.reference.silu_mul import silu_mul


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
    x: torch.Tensor,
    q: torch.Tensor,
    scale: torch.Tensor,
    out_dtype: torch.dtype | None = None,
    *,
    swiglu: bool = False,
    norm_weight: torch.Tensor | None = None,
    eps: float = 1e-6,
    residual: torch.Tensor | None = None,
) -> torch.Tensor:
    """Weight-only INT8 linear: ``round((norm(x) q^T) * scale)`` (+ SwiGLU, + residual).

    - ``x`` ``[T, K]`` (float16 / bfloat16 / float32); ``q`` int8 ``[N, K]`` (values in [-128,
      127]); ``scale`` float32 ``[N]``. Returns ``[T, N]`` (``[T, N / 2]`` with ``swiglu``) in
      ``out_dtype`` (default x's dtype; float32 for the lm_head logits: the scaled float32
      accumulator, never rounded through x's dtype).
    - ``norm_weight`` ``[K]``: x is RMS-normalized first (rms_norm.py's arithmetic).
    - ``swiglu``: ``q``/``scale`` hold the fused ``[gate; up]`` rows; ``silu(gate) * up`` of the two
      halves, each rounded to ``out_dtype`` first (silu_mul.py).
    - ``residual`` ``[T, N or N / 2]``: ``round(y + residual)`` (add.py).
    """
    if norm_weight is not None:
        x = rms_norm(x, norm_weight, eps)
    out_dtype = out_dtype or x.dtype
    acc = linear(x, q.to(x.dtype), torch.float32)  # exact operands, float32 accumulation
    y = (acc * scale.float()).to(out_dtype)
    if swiglu:
        y = silu_mul(y)
    return y if residual is None else add(y, residual)
