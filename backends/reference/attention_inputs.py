"""Reference attention inputs from the fused q/k/v projection: split, q/k RMSNorm, RoPE, paged K/V
write; twin of backends/triton/attention_inputs.py."""

from __future__ import annotations

import torch

from tileinfer.backends.reference.kv_quant import write_quantized
from tileinfer.backends.reference.kv_write import write_pages
from tileinfer.backends.reference.rms_norm import rms_norm
from tileinfer.backends.reference.rope import apply_rope


def attention_inputs(
    qkv: torch.Tensor,
    q_norm_weight: torch.Tensor,
    k_norm_weight: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    positions: torch.Tensor,
    k_pages: torch.Tensor,
    v_pages: torch.Tensor,
    block_table: torch.Tensor,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    eps: float,
    *,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    k_smooth: torch.Tensor | None = None,
) -> torch.Tensor:
    """``qkv`` ``[T, (H + 2 Hkv) * D]`` -> per-head RMSNorm of the q and k heads (weights ``[D]``)
    -> RoPE at ``positions`` ``[T]`` (``cos``, ``sin``: the ``[max_positions, D/2]`` float32 tables)
    -> k and v written into ``k_pages``/``v_pages`` ``[num_pages, Hkv, page_size, D]`` through
    ``block_table``; returns q ``[T, H, D]``. INT8 pages (``k_scale``, ``v_scale`` ``[num_pages,
    Hkv, page_size]`` float32 given): k (divided by ``k_smooth``, ``[D]`` float32, when given) and
    v quantized per vector into them (``write_quantized`` of kv_quant.py)."""
    t, d = qkv.shape[0], head_dim
    q, k, v = qkv.split([num_heads * d, num_kv_heads * d, num_kv_heads * d], dim=-1)
    q = rms_norm(q.reshape(t, num_heads, d), q_norm_weight, eps)
    k = rms_norm(k.reshape(t, num_kv_heads, d), k_norm_weight, eps)
    c, s = cos[positions], sin[positions]
    q, k = apply_rope(q, c, s), apply_rope(k, c, s)
    v = v.reshape(t, num_kv_heads, d)
    if k_scale is None:
        write_pages(k_pages, block_table, positions, k)
        write_pages(v_pages, block_table, positions, v)
    else:
        write_quantized(k_pages, v_pages, k_scale, v_scale, block_table, positions, k, v, k_smooth)
    return q
