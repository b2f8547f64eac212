"""An int8 weight's values written into a model-dtype buffer, no scale applied: the first half of the
dequantized prefill path of ``options.triton.int8_prefill_dequant`` (plugins/triton/linear.py), whose
second half is the model-dtype GEMM with the float32 row scales on the accumulator (``linear(x, out,
scale)``, backends/triton/linear.py); twin: backends/reference/int8_dequant.py.

Tiling and grid: one program per ``BLOCK_N x BLOCK_K`` tile of the ``[N, K]`` weight (32 x 256,
4 warps: each thread loads 16 contiguous bytes of a row and stores 32 bytes of bf16), grid ``(cdiv(N,
BLOCK_N), cdiv(K, BLOCK_K))``, masked at the edges. The conversion is :func:`int8_to` on the bit
patterns (no I2F instruction; exact, |q| <= 128); ``FRAG``: a weight in the ``fragments`` layout
(linear_layout.py) is put back in column order after its load (:func:`rows_of_fragments`; K a
multiple of 64, the tile's 256 columns whole groups), so that the output is always rows. Memory-bound:
``N K`` bytes read and ``N K x itemsize`` written (Qwen3-4B's layer, 101 M weights: 303 MB in bf16).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tileinfer.backends.triton import FLOAT_DTYPES
from tileinfer.backends.triton.device_functions import int8_to
from tileinfer.backends.triton.linear_layout import FRAGMENT_K, INT8_LAYOUTS, rows_of_fragments

BLOCK_N, BLOCK_K, NUM_WARPS = 32, 256, 4


@triton.jit
def _dequantize_int8_kernel(q_ptr, y_ptr, N, K, stride_qn, stride_yn,
                            BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, FRAG: tl.constexpr):
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
    mask = (offs_n < N)[:, None] & (offs_k < K)[None, :]
    rows = offs_n.to(tl.int64)[:, None]
    q = tl.load(q_ptr + rows * stride_qn + offs_k[None, :], mask=mask, other=0)
    if FRAG:
        q = rows_of_fragments(q, BLOCK_K)
    y = int8_to(q, y_ptr.dtype.element_ty, 1)
    tl.store(y_ptr + rows * stride_yn + offs_k[None, :], y, mask=mask)


def dequantize_int8(q: torch.Tensor, dtype: torch.dtype, *, out: torch.Tensor | None = None,
                    int8_layout: str = "rows") -> torch.Tensor:
    """The int8 weight ``q`` ``[N, K]`` (row-major contiguous; ``int8_layout`` ``rows``, or
    ``fragments`` with K a multiple of 64) as exact ``dtype`` values (float16 / bfloat16 / float32),
    always in rows: ``[N, K]``, written into ``out`` (``[N, K]`` of ``dtype`` on q's device, unit
    column stride; allocated when None) and returned."""
    assert q.dtype == torch.int8 and q.dim() == 2, f"q must be int8 [N, K], got {q.dtype} {tuple(q.shape)}"
    assert q.is_contiguous(), "q must be row-major contiguous [N, K]"
    assert dtype in FLOAT_DTYPES, f"unsupported dtype {dtype}"
    assert int8_layout in INT8_LAYOUTS, f"int8_layout is one of {', '.join(INT8_LAYOUTS)}, got {int8_layout!r}"
    N, K = q.shape
    frag = int8_layout == "fragments"
    assert not frag or K % FRAGMENT_K == 0, f"int8_layout='fragments' takes K a multiple of {FRAGMENT_K}, got {K}"
    if out is None:
        out = torch.empty((N, K), dtype=dtype, device=q.device)
    assert out.shape == (N, K) and out.dtype == dtype and out.device == q.device, (
        f"out must be [{N}, {K}] {dtype} on {q.device}, got {tuple(out.shape)} {out.dtype} on {out.device}")
    assert out.stride(1) == 1 or K == 1, "out must have unit column stride"
    if N == 0 or K == 0:
        return out
    grid = (triton.cdiv(N, BLOCK_N), triton.cdiv(K, BLOCK_K))
    _dequantize_int8_kernel[grid](q, out, N, K, q.stride(0), out.stride(0), BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K,
                                  FRAG=frag, num_warps=NUM_WARPS)
    return out


__all__ = ["dequantize_int8"]
