"""Reference causal grouped-query attention over dense K and V, scores materialized in float32."""

from __future__ import annotations

import torch


def causal_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int | torch.Tensor, scale: float
) -> torch.Tensor:
    """Attention of ``T`` new queries over ``L = start + T`` cached positions.

    ``q`` ``[T, H, D]`` at positions ``start .. start + T - 1``; ``k``, ``v`` ``[L, Hkv, D]``
    (``H`` a multiple of ``Hkv``: query head ``h`` reads kv head ``h // (H / Hkv)``). Query ``i``
    sees keys ``0 .. start + i``. ``start`` may instead be the ``[T]`` positions tensor of the
    queries; then ``k`` and ``v`` may hold more rows than ``start + T`` (rows no query sees are
    ignored, whatever they hold). Computed in float32; returns ``[T, H, D]`` in q's dtype.
    """
    t, h, _ = q.shape
    length, hkv, _ = k.shape
    group = h // hkv
    if isinstance(start, torch.Tensor):
        query_pos = start[:, None]
    else:
        query_pos = torch.arange(start, start + t, device=q.device)[:, None]
    key_pos = torch.arange(length, device=q.device)[None, :]
    seen = key_pos <= query_pos[-1:]  # rows any query sees: the others may hold garbage, even NaN
    kf = torch.where(seen[0, :, None, None], k.float(), 0.0).repeat_interleave(group, dim=1)  # [L, H, D]
    vf = torch.where(seen[0, :, None, None], v.float(), 0.0).repeat_interleave(group, dim=1)
    scores = torch.einsum("thd,lhd->htl", q.float(), kf) * scale  # [H, T, L]
    scores = scores.masked_fill(key_pos > query_pos, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    return torch.einsum("htl,lhd->thd", probs, vf).to(q.dtype)
