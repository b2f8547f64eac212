"""The chains of per-op kernels that the fused kernels must equal bit for bit: the oracle of the
fused linear (RMSNorm prologue, SwiGLU and residual epilogues) and of the fused attention inputs."""

from __future__ import annotations

import torch

from tileinfer.backends.triton.add import add
from tileinfer.backends.triton.interpreter import sms_of
from tileinfer.backends.triton.kv_write import write_kv
from tileinfer.backends.triton.linear import GemmConfig, GemvConfig, linear, norm_warps
from tileinfer.backends.triton.rms_norm import rms_norm
from tileinfer.backends.triton.rope import apply_rope
from tileinfer.backends.triton.silu_mul import silu_mul


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


def inputs_per_op(qkv: torch.Tensor, q_norm_weight: torch.Tensor, k_norm_weight: torch.Tensor, cos: torch.Tensor,
                  sin: torch.Tensor, positions: torch.Tensor, k_pages: torch.Tensor, v_pages: torch.Tensor,
                  block_table: torch.Tensor, num_heads: int, num_kv_heads: int, head_dim: int, eps: float, *,
                  pdl: bool = False) -> torch.Tensor:
    """``attention_inputs`` as one kernel per op (8 launches): copies of the q, k, v slices of
    ``qkv``, ``rms_norm`` of the q and k heads, ``apply_rope`` to both, ``write_kv``; returns q."""
    t, d = qkv.shape[0], head_dim
    q, k, v = qkv.split([num_heads * d, num_kv_heads * d, num_kv_heads * d], dim=-1)
    q = q.contiguous().view(t, num_heads, d)
    k = k.contiguous().view(t, num_kv_heads, d)
    v = v.contiguous().view(t, num_kv_heads, d)
    q = apply_rope(rms_norm(q, q_norm_weight, eps, pdl=pdl), cos, sin, positions, pdl=pdl)
    k = apply_rope(rms_norm(k, k_norm_weight, eps, pdl=pdl), cos, sin, positions, pdl=pdl)
    write_kv(k_pages, v_pages, block_table, positions, k, v, pdl=pdl)
    return q
