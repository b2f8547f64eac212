"""Reference paged KV-cache ops: write into pages, gather pages into dense tensors, INT8 per vector.

Pages are ``[num_pages, num_kv_heads, page_size, head_dim]``; a sequence's ``block_table``
(int32) lists its pages in order, so position ``p`` lives in page ``block_table[p // page_size]``
at slot ``p % page_size``.
"""

from __future__ import annotations

import torch


def write_pages(pages: torch.Tensor, block_table: torch.Tensor, positions: torch.Tensor, x: torch.Tensor) -> None:
    """Store ``x`` ``[T, Hkv, D]`` (or ``[T, Hkv]`` for scales into ``[P, Hkv, S]`` pages) at ``positions``."""
    page_size = pages.shape[2]
    page = block_table[positions // page_size].long()
    pages[page, :, positions % page_size] = x.to(pages.dtype)


def gather_pages(pages: torch.Tensor, block_table: torch.Tensor, length: int) -> torch.Tensor:
    """Positions ``[0, length)`` of a paged tensor, dense: ``[length, Hkv, D]`` (or ``[length, Hkv]``)."""
    page_size = pages.shape[2]
    n = -(-length // page_size)
    picked = pages[block_table[:n].long()]  # [n, Hkv, S, ...]
    picked = picked.transpose(1, 2)  # [n, S, Hkv, ...]
    return picked.reshape(n * page_size, *picked.shape[2:])[:length]


def quantize_per_vector(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric INT8 with one float32 scale per vector of the last dim: ``x ~= q * scale[..., None]``."""
    xf = x.float()
    scale = xf.abs().amax(dim=-1).clamp(min=1e-12) / 127.0
    q = torch.round(xf / scale[..., None]).clamp(-127, 127).to(torch.int8)
    return q, scale


def dequantize_per_vector(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return (q.float() * scale[..., None]).to(dtype)


def key_smoothing(k_norm_weight: torch.Tensor) -> torch.Tensor:
    """Per-channel divisor for keys before INT8 quantization, from the key RMSNorm's weight.

    A key's channel ``i`` is about ``|w_i|`` times a unit-scale value, so dividing by ``|w|`` evens
    the channels out and the one scale per vector wastes fewer levels. RoPE mixes channel ``i`` with
    ``i + D/2``, so both get the same divisor (the RMS of the pair) and the division commutes with
    the rotation: ``q.k = (q * s).(k / s)`` exactly in real arithmetic. Returns ``[D]`` float32.
    """
    w = k_norm_weight.float()
    a, b = w.chunk(2)
    pair = torch.sqrt((a * a + b * b) / 2).clamp(min=1e-6)
    return torch.cat((pair, pair))
