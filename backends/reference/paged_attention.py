"""Reference causal grouped-query attention over the paged KV cache: the pages gathered into dense
K and V, scores materialized in float32 (``causal_attention``, ``paged_attention``: the twin of
backends/triton/paged_attention.py and the oracle of its tests); and the same attention through
torch's fused ``scaled_dot_product_attention`` (``sdpa_attention``, the reference attention's own
path: no score matrix, no repeated KV heads)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def gather_pages(pages: torch.Tensor, block_table: torch.Tensor, length: int) -> torch.Tensor:
    """Positions ``[0, length)`` of a paged tensor (``[num_pages, Hkv, page_size, D]``, position
    ``p`` in page ``block_table[p // page_size]`` at slot ``p % page_size``), dense: ``[length, Hkv,
    D]`` (or ``[length, Hkv]`` for ``[P, Hkv, S]`` scales)."""
    page_size = pages.shape[2]
    n = -(-length // page_size)
    picked = pages[block_table[:n].long()]  # [n, Hkv, S, ...]
    picked = picked.transpose(1, 2)  # [n, S, Hkv, ...]
    return picked.reshape(n * page_size, *picked.shape[2:])[:length]


def gather_heads(pages: torch.Tensor, block_table: torch.Tensor, length: int,
                 out: torch.Tensor | None = None) -> torch.Tensor:
    """Positions ``[0, length)`` of contiguous ``[num_pages, Hkv, page_size, D]`` pages,
    head-major: ``[Hkv, length, D]``, the layout SDPA reads. One copy: each (page, head) block is
    ``page_size * D`` contiguous values, picked in head-major order (5x faster on a CPU than
    gathering the pages and then putting the heads first). ``out``, a contiguous buffer of at
    least ``num_pages * Hkv * page_size * D`` elements of the pages' dtype, receives the copy (a
    fresh megabyte-sized tensor per layer and step costs page faults on a CPU)."""
    num_pages, hkv, page_size, d = pages.shape
    n = -(-length // page_size)
    blocks = block_table[:n].long()[None, :] * hkv + torch.arange(hkv, device=pages.device)[:, None]  # [Hkv, n]
    rows = pages.view(num_pages * hkv, page_size * d)
    if out is None:
        picked = rows.index_select(0, blocks.flatten())
    else:
        into = out.view(-1)[: hkv * n * page_size * d].view(hkv * n, page_size * d)
        picked = torch.index_select(rows, 0, blocks.flatten(), out=into)
    return picked.view(hkv, n * page_size, d)[:, :length]


def causal_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int | torch.Tensor, scale: float,
    causal: bool = True,
) -> torch.Tensor:
    """Attention of ``T`` new queries over ``L = start + T`` cached positions.

    ``q`` ``[T, H, D]`` at positions ``start .. start + T - 1``; ``k``, ``v`` ``[L, Hkv, D]``
    (``H`` a multiple of ``Hkv``: query head ``h`` reads kv head ``h // (H / Hkv)``). Query ``i``
    sees keys ``0 .. start + i``; with ``causal=False`` every query sees all ``start + T`` keys
    (``Step.causal``). ``start`` may instead be the ``[T]`` positions tensor of the queries; then
    ``k`` and ``v`` may hold more rows than ``start + T`` (rows no query sees are ignored, whatever
    they hold). Computed in float32; returns ``[T, H, D]`` in q's dtype.
    """
    t, h, _ = q.shape
    length, hkv, _ = k.shape
    group = h // hkv
    if isinstance(start, torch.Tensor):
        query_pos = start[:, None]
    else:
        query_pos = torch.arange(start, start + t, device=q.device)[:, None]
    if not causal:  # every query sees what the last one sees
        query_pos = query_pos[-1:].expand(t, 1)
    key_pos = torch.arange(length, device=q.device)[None, :]
    seen = key_pos <= query_pos[-1:]  # rows any query sees: the others may hold garbage, even NaN
    kf = torch.where(seen[0, :, None, None], k.float(), 0.0).repeat_interleave(group, dim=1)  # [L, H, D]
    vf = torch.where(seen[0, :, None, None], v.float(), 0.0).repeat_interleave(group, dim=1)
    scores = torch.einsum("thd,lhd->htl", q.float(), kf) * scale  # [H, T, L]
    scores = scores.masked_fill(key_pos > query_pos, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    return torch.einsum("htl,lhd->thd", probs, vf).to(q.dtype)


def paged_attention(q: torch.Tensor, k_pages: torch.Tensor, v_pages: torch.Tensor, block_table: torch.Tensor,
                    start: int | torch.Tensor, scale: float, causal: bool = True, *,
                    k_scale: torch.Tensor | None = None, v_scale: torch.Tensor | None = None,
                    k_smooth: torch.Tensor | None = None) -> torch.Tensor:
    """:func:`causal_attention` of ``q`` ``[T, H, D]`` over the positions the pages hold up to the
    last query's: ``start + T`` of them (``start`` an int), or ``positions[-1] + 1`` (``start`` the
    ``[T]`` positions tensor); ``causal=False``: every query sees all of them.

    INT8 pages (the layout of ``LayerKV``): ``k_pages``/``v_pages`` int8 with ``k_scale``/``v_scale``
    ``[num_pages, Hkv, page_size]`` float32, dequantized in float32 (``int8 * scale``); with
    ``k_smooth`` (``[D]`` float32, the keys were divided by it) q is first multiplied by it and
    rounded to its dtype, as the reference attention does."""
    length = int(start[-1]) + 1 if isinstance(start, torch.Tensor) else start + q.shape[0]
    k = gather_pages(k_pages, block_table, length)
    v = gather_pages(v_pages, block_table, length)
    if k_scale is not None:
        k = k.float() * gather_pages(k_scale, block_table, length)[..., None]
        v = v.float() * gather_pages(v_scale, block_table, length)[..., None]
    if k_smooth is not None:
        q = (q.float() * k_smooth).to(q.dtype)
    return causal_attention(q, k, v, start, scale, causal)


def sdpa_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int | torch.Tensor, scale: float,
    causal: bool = True,
) -> torch.Tensor:
    """:func:`causal_attention` (same arguments and meaning) through ``scaled_dot_product_attention``
    with ``enable_gqa``: torch's fused kernel (on a CPU, flash attention with float32 accumulation in
    every dtype) instead of materialized scores. ``k`` and ``v`` may be strided views, e.g. the
    transpose of :func:`gather_heads`' ``[Hkv, L, D]``, which SDPA then reads in place.

    With an int ``start``, ``k`` and ``v`` hold ``L >= start + T`` rows (the first ``start + T``
    are read). A decode step (``T = 1``) needs no mask; a prompt from position 0 is SDPA's own
    causal mask; other steps (``start > 0``, ``T > 1``: verify steps) get a ``[T, L]`` boolean mask;
    a non-causal step (``causal=False``) none: every query sees all ``start + T`` keys.
    With the positions tensor, the rows no query sees are zeroed first (masked rows still meet the
    values in the product, and they may hold NaN), and the mask comes from the positions on the
    device: nothing is read on the host. Returns ``[T, H, D]`` in q's dtype.
    """
    t = q.shape[0]
    k, v = k.to(q.dtype), v.to(q.dtype)
    mask, is_causal = None, False
    if isinstance(start, torch.Tensor):
        key_pos = torch.arange(k.shape[0], device=q.device)
        seen = (key_pos <= start[-1])[:, None, None]
        k, v = torch.where(seen, k, 0.0), torch.where(seen, v, 0.0)
        mask = key_pos[None, :] <= (start[:, None] if causal else start[-1:, None])  # [T, L]
    else:
        k, v = k[: start + t], v[: start + t]
        if t > 1 and causal and start == 0:
            is_causal = True
        elif t > 1 and causal:
            key_pos = torch.arange(start + t, device=q.device)
            mask = key_pos[None, :] <= torch.arange(start, start + t, device=q.device)[:, None]
    out = F.scaled_dot_product_attention(  # [1, H, T, D]
        q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
        attn_mask=mask, is_causal=is_causal, scale=scale, enable_gqa=True)
    return out[0].transpose(0, 1)
