"""The chains of per-op kernels that the fused kernels must equal bit for bit: the oracle of the
fused linear (RMSNorm prologue, SwiGLU and residual epilogues) and, from the Triton attention
plugin, of the fused attention inputs (``inputs_per_op``)."""

from __future__ import annotations

import torch

from tileinfer.backends.triton.add import add
from tileinfer.backends.triton.interpreter import sms_of
from tileinfer.backends.triton.linear import GemmConfig, GemvConfig, linear, norm_warps
from tileinfer.backends.triton.rms_norm import rms_norm
from tileinfer.backends.triton.silu_mul import silu_mul
from tileinfer.plugins.triton.attention import inputs_per_op  # the chain the ablation row runs


def linear_per_op(x: torch.Tensor, w: torch.Tensor, *, out_dtype: torch.dtype | None = None, swiglu: bool = False,
                  norm_weight: torch.Tensor | None = None, eps: float = 1e-6, residual: torch.Tensor | None = None,
                  config: GemvConfig | GemmConfig | None = None, pdl: bool = False) -> torch.Tensor:
    """``linear`` as one kernel per op: ``rms_norm`` (with the GEMV prologue's warps), ``linear``,
    ``silu_mul``, ``add``."""
    T, K = x.shape
    if norm_weight is not None:
        warps = norm_warps(T, w.shape[0], K, config, sms_of(x.device))
        x = rms_norm(x, norm_weight, eps, pdl=pdl, num_warps=warps)
    y = linear(x, w, out_dtype=out_dtype, config=config, pdl=pdl)
    if swiglu:
        y = silu_mul(y, pdl=pdl)
    if residual is not None:
        y = add(y, residual, pdl=pdl)
    return y


__all__ = ["inputs_per_op", "linear_per_op"]
