"""Reference rotary position embedding (rotate-half convention, as Hugging Face Qwen3); twin of
backends/triton/rope.py."""

from __future__ import annotations

import torch


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` ``[T, heads, D]`` by the angles of its rows: ``cos``, ``sin`` ``[T, D // 2]``.

    Channel ``i`` pairs with ``i + D/2``: ``(a, b) -> (a cos - b sin, b cos + a sin)``, in float32,
    rounded to x's dtype.
    """
    xf = x.float()
    a, b = xf.chunk(2, dim=-1)
    c, s = cos[:, None, :], sin[:, None, :]
    return torch.cat((a * c - b * s, b * c + a * s), dim=-1).to(x.dtype)
