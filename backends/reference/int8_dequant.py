"""Reference of the int8 weight's values in the model dtype, no scale applied; twin of
backends/triton/int8_dequant.py.

The prefill path of ``options.triton.int8_prefill_dequant`` (plugins/triton/linear.py) writes an int8
weight's values into a model-dtype buffer once per call and runs the model-dtype GEMM on it with the
float32 row scales applied to the accumulator, as the W8A16 GEMM does. The values are exact in every
float dtype (|q| <= 128), so the kernel and this twin agree bit for bit. (Not
``backends.reference.linear.dequantize_int8``, which multiplies by the scale: ``q * scale`` rounded to
the model dtype is not the W8A16 GEMM's arithmetic.)
"""

from __future__ import annotations

import torch

from tileinfer.backends.reference.linear import INT8_LAYOUTS, unpack_fragments


def dequantize_int8(q: torch.Tensor, dtype: torch.dtype, *, out: torch.Tensor | None = None,
                    int8_layout: str = "rows") -> torch.Tensor:
    """The int8 weight ``q`` ``[N, K]`` (``int8_layout`` ``rows``, or ``fragments``: put back in rows)
    as ``dtype`` values ``[N, K]``, exactly; written into ``out`` (``[N, K]`` of ``dtype``) where given."""
    assert q.dtype == torch.int8 and q.dim() == 2, f"q must be int8 [N, K], got {q.dtype} {tuple(q.shape)}"
    assert int8_layout in INT8_LAYOUTS, f"int8_layout is one of {', '.join(INT8_LAYOUTS)}, got {int8_layout!r}"
    values = (unpack_fragments(q) if int8_layout == "fragments" else q).to(dtype)
    if out is None:
        return values
    out.copy_(values)
    return out


__all__ = ["dequantize_int8"]
