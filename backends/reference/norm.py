"""Reference embedding and RMSNorm (Hugging Face Qwen3's arithmetic)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def embedding(token_ids: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``token_ids`` ``[T]`` -> rows of ``weight`` ``[V, H]``: ``[T, H]``."""
    return F.embedding(token_ids, weight)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dim: normalize in float32, round to x's dtype, then scale by ``weight``."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)
