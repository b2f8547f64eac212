"""Reference causal grouped-query attention over the paged KV cache: the pages gathered into dense
K and V, scores materialized in float32; twin of backends/triton/paged_attention.py."""

from __future__ import annotations

import torch


def gather_pages(pages: torch.Tensor, block_table: torch.Tensor, length: int) -> torch.Tensor:
    """Positions ``[0, length)`` of a paged tensor (``[num_pages, Hkv, page_size, D]``, position
    ``p`` in page ``block_table[p // page_size]`` at slot ``p % page_size``), dense: ``[length, Hkv,
    D]`` (or ``[length, Hkv]`` for ``[P, Hkv, S]`` scales)."""
    page_size = pages.shape[2]
    n = -(-length // page_size)
    picked = pages[block_table[:n].long()]  # [n, Hkv, S, ...]
    picked = picked.transpose(1, 2)  # [n, S, Hkv, ...]
    return picked.reshape(n * page_size, *picked.shape[2:])[:length]


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


def paged_attention(q: torch.Tensor, k_pages: torch.Tensor, v_pages: torch.Tensor, block_table: torch.Tensor,
                    start: int | torch.Tensor, scale: float) -> torch.Tensor:
    """:func:`causal_attention` of ``q`` ``[T, H, D]`` over the positions the pages hold up to the
    last query's: ``start + T`` of them (``start`` an int), or ``positions[-1] + 1`` (``start`` the
    ``[T]`` positions tensor)."""
    length = int(start[-1]) + 1 if isinstance(start, torch.Tensor) else start + q.shape[0]
    k = gather_pages(k_pages, block_table, length)
    v = gather_pages(v_pages, block_table, length)
    return causal_attention(q, k, v, start, scale)
