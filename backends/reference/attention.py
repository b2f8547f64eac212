"""Reference causal grouped-query attention over dense K and V, scores materialized in float32."""

from __future__ import annotations

import torch


def causal_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int, scale: float
) -> torch.Tensor:
    """Attention of ``T`` new queries over ``L = start + T`` cached positions.

    ``q`` ``[T, H, D]`` at positions ``start .. start + T - 1``; ``k``, ``v`` ``[L, Hkv, D]``
    (``H`` a multiple of ``Hkv``: query head ``h`` reads kv head ``h // (H / Hkv)``). Query ``i``
    sees keys ``0 .. start + i``. Computed in float32; returns ``[T, H, D]`` in q's dtype.
    """
    t, h, _ = q.shape
    length, hkv, _ = k.shape
    group = h // hkv
    kf = k.float().repeat_interleave(group, dim=1)  # [L, H, D]
    vf = v.float().repeat_interleave(group, dim=1)
    scores = torch.einsum("thd,lhd->htl", q.float(), kf) * scale  # [H, T, L]
    query_pos = torch.arange(start, start + t, device=q.device)[:, None]
    key_pos = torch.arange(length, device=q.device)[None, :]
    scores = scores.masked_fill(key_pos > query_pos, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    return torch.einsum("htl,lhd->thd", probs, vf).to(q.dtype)
