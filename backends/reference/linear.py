"""Reference linear: one matmul (cuBLAS on a GPU), for weights in the model dtype or int8 with one
float32 scale per output row (W8A16, per-output-channel quantization: :func:`quantize_int8`), and
the SwiGLU / residual-add epilogues after it, one torch op after the other; twin of
backends/triton/linear.py.

Arithmetic of the int8 form (the kernels'): int8 -> the activation dtype is exact (|q| <= 128), so
``x q^T`` is a float32-accumulated matmul of exact operands; the float32 per-channel scale
multiplies the float32 accumulator, and the product is rounded once to the output dtype.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from tileinfer.backends.reference.add import add
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


def matmul(x: torch.Tensor, weight: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    """``x`` ``[T, K]`` @ ``weight`` ``[N, K]``^T in ``out_dtype``: a float32 ``out_dtype`` on
    lower-precision inputs accumulates and writes float32 (lm_head logits)."""
    if out_dtype == x.dtype:
        return F.linear(x, weight)
    if out_dtype == torch.float32 and x.is_cuda:
        return torch.mm(x, weight.t(), out_dtype=torch.float32)
    return F.linear(x.to(out_dtype), weight.to(out_dtype))


def linear(x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor | None = None, *, out_dtype: torch.dtype | None = None,
           swiglu: bool = False, residual: torch.Tensor | None = None) -> torch.Tensor:
    """``y = x W^T`` (+ SwiGLU, + residual) in ``out_dtype`` (default x's dtype; float32 for the
    lm_head logits: accumulated and written in float32, never rounded through x's dtype).

    - ``x`` ``[T, K]`` (float16 / bfloat16 / float32); ``w`` ``[N, K]`` in x's dtype, or int8 (values
      in [-128, 127]) with ``scale`` float32 ``[N]``: ``round((x w^T) * scale)``.
    - ``swiglu``: ``w`` (and ``scale``) hold the fused ``[gate; up]`` rows; returns ``[T, N / 2]`` =
      ``silu(gate) * up`` of the two halves, each rounded to ``out_dtype`` first (silu_mul.py).
    - ``residual`` ``[T, N or N / 2]``: ``round(y + residual)`` (add.py).
    """
    out_dtype = out_dtype or x.dtype
    if scale is None:
        y = matmul(x, w, out_dtype)
    else:
        acc = matmul(x, w.to(x.dtype), torch.float32)  # exact operands, float32 accumulation
        y = (acc * scale.float()).to(out_dtype)
    if swiglu:
        y = silu_mul(y)
    return y if residual is None else add(y, residual)


__all__ = ["dequantize_int8", "linear", "matmul", "quantize_int8"]
