"""Reference linear: one matmul (cuBLAS on a GPU); twin of backends/triton/linear.py."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def linear(x: torch.Tensor, weight: torch.Tensor, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """``x`` ``[T, K]`` @ ``weight`` ``[N, K]``^T -> ``[T, N]`` in ``out_dtype`` (default x's dtype).

    A float32 ``out_dtype`` on lower-precision inputs accumulates and writes float32 (lm_head logits).
    """
    out_dtype = out_dtype or x.dtype
    if out_dtype == x.dtype:
        return F.linear(x, weight)
    if out_dtype == torch.float32 and x.is_cuda:
        return torch.mm(x, weight.t(), out_dtype=torch.float32)
    return F.linear(x.to(out_dtype), weight.to(out_dtype))
