"""The chains of per-op kernels that the fused kernels must equal bit for bit: the oracle of the
fused linear (SwiGLU and residual epilogues) and, from the Triton attention plugin, of the fused
attention inputs (``inputs_per_op``). ``linear_fused`` / ``linear_per_op`` run a linear as the
Triton Linear does, the RMSNorm before it as a kernel of its own."""

from __future__ import annotations

import torch

from tileinfer.backends.triton.add import add
from tileinfer.backends.triton.linear import GemmConfig, GemvConfig, linear, rule_config
from tileinfer.backends.triton.rms_norm import rms_norm
from tileinfer.backends.triton.silu_mul import silu_mul
from tileinfer.plugins.triton.attention import inputs_per_op  # the chain the ablation row runs


def linear_per_op(x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor | None = None, *,
                  out_dtype: torch.dtype | None = None, swiglu: bool = False, norm_weight: torch.Tensor | None = None,
                  eps: float = 1e-6, residual: torch.Tensor | None = None, config: GemvConfig | GemmConfig | None = None,
                  pdl: bool = False) -> torch.Tensor:
    """``linear`` as one kernel per op: ``rms_norm`` (with ``norm_weight``), ``linear`` on the fused
    call's tiles (``config``, else the rule's for the fused call), ``silu_mul``, ``add``."""
    if norm_weight is not None:
        x = rms_norm(x, norm_weight, eps, pdl=pdl)
    config = config or rule_config(x, w, scale, swiglu=swiglu, out_dtype=out_dtype)
    y = linear(x, w, scale, out_dtype=out_dtype, config=config, pdl=pdl)
    if swiglu:
        y = silu_mul(y, pdl=pdl)
    if residual is not None:
        y = add(y, residual, pdl=pdl)
    return y


def linear_fused(x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor | None = None, *,
                 norm_weight: torch.Tensor | None = None, eps: float = 1e-6, pdl: bool = False, **kw) -> torch.Tensor:
    """``linear`` with its epilogues fused (``kw``: swiglu, residual, out_dtype, config, out), after
    ``rms_norm`` (with ``norm_weight``)."""
    if norm_weight is not None:
        x = rms_norm(x, norm_weight, eps, pdl=pdl)
    return linear(x, w, scale, pdl=pdl, **kw)


__all__ = ["inputs_per_op", "linear_fused", "linear_per_op"]
