"""Reference paged KV-cache write; twin of backends/triton/kv_write.py.

Pages are ``[num_pages, num_kv_heads, page_size, head_dim]``; a sequence's ``block_table``
(int32) lists its pages in order, so position ``p`` lives in page ``block_table[p // page_size]``
at slot ``p % page_size``.
"""

from __future__ import annotations

import torch


def write_pages(pages: torch.Tensor, block_table: torch.Tensor, positions: torch.Tensor, x: torch.Tensor) -> None:
    """Store ``x`` ``[T, Hkv, D]`` (or ``[T, Hkv]`` for scales into ``[P, Hkv, S]`` pages) at
    ``positions``, cast to the pages' dtype."""
    page_size = pages.shape[2]
    page = block_table[positions // page_size].long()
    pages[page, :, positions % page_size] = x.to(pages.dtype)
