"""Reference attention inputs from the fused q/k/v projection: split, q/k RMSNorm, RoPE, paged K/V
write; twin of backends/triton/attention_inputs.py."""

from __future__ import annotations

import torch

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
) -> torch.Tensor:
    """``qkv`` ``[T, (H + 2 Hkv) * D]`` -> per-head RMSNorm of the q and k heads (weights ``[D]``)
    -> RoPE at ``positions`` ``[T]`` (``cos``, ``sin``: the ``[max_positions, D/2]`` float32 tables)
    -> k and v written into ``k_pages``/``v_pages`` ``[num_pages, Hkv, page_size, D]`` through
    ``block_table``; returns q ``[T, H, D]``."""
    t, d = qkv.shape[0], head_dim
    q, k, v = qkv.split([num_heads * d, num_kv_heads * d, num_kv_heads * d], dim=-1)
    q = rms_norm(q.reshape(t, num_heads, d), q_norm_weight, eps)
    k = rms_norm(k.reshape(t, num_kv_heads, d), k_norm_weight, eps)
    c, s = cos[positions], sin[positions]
    q, k = apply_rope(q, c, s), apply_rope(k, c, s)
    write_pages(k_pages, block_table, positions, k)
    write_pages(v_pages, block_table, positions, v.reshape(t, num_kv_heads, d))
    return q
