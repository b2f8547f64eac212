"""RMSNorm over the last dim; twin: backends/reference/rms_norm.py.

Tiling and grid: a program holds whole vectors in registers, each loaded as its two halves
(channels ``0..N/2`` and ``N/2..N``, ``BLOCK_HALF = next_pow2(N / 2)`` wide, masked; the device
functions of device_functions.py). Rows of ``[T, H]`` (``_row_rms_norm_kernel``): one row a
program, ``[1, BLOCK_HALF]`` tiles, grid ``(T,)``, 8 warps for H = 2,560 or 4,096. Heads of ``[T,
heads, D]`` (``_rms_norm_kernel``): ``BLOCK_H`` heads of one token a program, ``[BLOCK_H,
BLOCK_HALF]`` tiles reduced along the channels, grid ``(T, cdiv(heads, BLOCK_H))``; ``BLOCK_H =
min(next_pow2(heads), 1024 / (2 BLOCK_HALF))`` (8 heads of 128, 2 warps). The fused q/k kernel of
attention_inputs.py uses the same tiles. :func:`norm_launch_config` gives ``(BLOCK_H, BLOCK_HALF,
num_warps)`` from ``(N, heads)`` alone for all of them.

Arithmetic (Hugging Face Qwen3, as the twin): ``x`` in float32, ``x * rsqrt(mean(x^2) + eps)``,
rounded to the model dtype, then multiplied by the weight in the model dtype (float32 product of
the two rounded values, rounded once more). The row kernel is compiled with floating-point
contraction on (its sum of squares may contract into FMAs); the head kernel turns it off
(``enable_fp_fusion=False``) as every other elementwise kernel does, so that no kernel fuses a
multiply-add that its twin does not.

Programmatic dependent launch (``pdl=True``, Hopper; pdl.py): the kernels let the next kernel
launch at their start, load the norm weight (immutable) before the grid dependency wait, and the
activations after it. Same bits with or without.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from tileinfer.backends.triton import FLOAT_DTYPES
from tileinfer.backends.triton.device_functions import load_row_halves, load_weight_halves, rms_norm_halves
from tileinfer.backends.triton.pdl import launch_options, use_pdl

TILE_ELEMENTS = 1024  # a head-vector program takes this many elements (8 heads of 128) at most


def norm_launch_config(n: int, vectors: int) -> tuple[int, int, int]:
    """``(BLOCK_H, BLOCK_HALF, num_warps)`` to normalize ``vectors`` vectors of length ``n`` per
    token. Every kernel that normalizes such vectors (the per-op norm and the fused ones) launches
    with exactly this, which keeps their ``tl.sum`` layouts, hence their roundings, identical."""
    block_half = triton.next_power_of_2(max(n // 2, 1))
    block_h = min(triton.next_power_of_2(vectors), max(1, TILE_ELEMENTS // (2 * block_half)))
    num_warps = max(1, min(16, (2 * block_half * block_h) // 512))  # [8, 2x64] -> 2, [1, 2x2048] -> 8
    return block_h, block_half, num_warps


@triton.jit
def _rms_norm_kernel(
    x_ptr, w_ptr, out_ptr,
    stride_x_t, stride_x_h, stride_o_t, stride_o_h,
    eps,
    HEADS: tl.constexpr, N: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr,
    PDL: tl.constexpr,
):
    if PDL:
        gdc_launch_dependents()
    t = tl.program_id(0).to(tl.int64)
    heads = (tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H))[:, None]
    offs = tl.arange(0, BLOCK_HALF)[None, :]
    mask = (heads < HEADS) & (offs < N // 2)
    wa, wb = load_weight_halves(w_ptr, offs, N)
    if PDL:
        gdc_wait()  # x may be the output of the kernel before
    x = x_ptr + t * stride_x_t + heads * stride_x_h + offs
    a = tl.load(x, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(x + N // 2, mask=mask, other=0.0).to(tl.float32)
    ya, yb = rms_norm_halves(a, b, wa, wb, N, eps, out_ptr.dtype.element_ty)
    o = out_ptr + t * stride_o_t + heads * stride_o_h + offs
    tl.store(o, ya, mask=mask)
    tl.store(o + N // 2, yb, mask=mask)


@triton.jit
def _row_rms_norm_kernel(
    x_ptr, w_ptr, out_ptr, stride_x_t, stride_o_t, eps,
    N: tl.constexpr, BLOCK_HALF: tl.constexpr, PDL: tl.constexpr,
):
    if PDL:
        gdc_launch_dependents()
    t = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK_HALF)[None, :]
    mask = offs < N // 2
    wa, wb = load_weight_halves(w_ptr, offs, N)
    if PDL:
        gdc_wait()  # x may be the output of the kernel before
    a, b = load_row_halves(x_ptr + t * stride_x_t, N, BLOCK_HALF)
    ya, yb = rms_norm_halves(a, b, wa, wb, N, eps, out_ptr.dtype.element_ty)
    o = out_ptr + t * stride_o_t + offs
    tl.store(o, ya, mask=mask)
    tl.store(o + N // 2, yb, mask=mask)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, *, out: torch.Tensor | None = None,
             pdl: bool = False) -> torch.Tensor:
    """RMSNorm over the last dim of ``x`` ``[T, H]`` or ``[T, heads, D]`` (float16, bfloat16 or
    float32; any strides but a contiguous last dim, of even length), ``weight`` ``[last]`` in x's
    dtype. Returns ``out`` (new and contiguous unless given; x's shape and dtype, contiguous last
    dim): ``weight * round(x * rsqrt(mean(x^2) + eps))``. ``pdl``: programmatic dependent launch
    where supported (the weight must be immutable: it is read before the wait for the kernel
    before); same bits."""
    assert x.dim() in (2, 3), f"x must be [T, H] or [T, heads, D], got {tuple(x.shape)}"
    assert x.dtype in FLOAT_DTYPES, f"x dtype {x.dtype}"
    n = x.shape[-1]
    assert n % 2 == 0, f"the normalized dim must be even (loaded as two halves), got {n}"
    assert x.stride(-1) == 1, "x must be contiguous in its last dim"
    assert weight.shape == (n,) and weight.dtype == x.dtype and weight.is_contiguous(), (
        f"weight {tuple(weight.shape)} {weight.dtype}, expected ({n},) {x.dtype} contiguous"
    )
    assert weight.device == x.device
    if out is None:
        out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    assert out.shape == x.shape and out.dtype == x.dtype and out.device == x.device, (
        f"out: {tuple(out.shape)} {out.dtype} {out.device}, expected {tuple(x.shape)} {x.dtype} {x.device}"
    )
    assert out.stride(-1) == 1, "out must be contiguous in its last dim"
    if x.numel() == 0:
        return out
    pdl = use_pdl(pdl, x.device)
    if x.dim() == 2:
        _, block_half, warps = norm_launch_config(n, 1)
        _row_rms_norm_kernel[(x.shape[0],)](
            x, weight, out, x.stride(0), out.stride(0), eps,
            N=n, BLOCK_HALF=block_half, PDL=pdl,
            num_warps=warps, enable_fp_fusion=True, **launch_options(pdl),
        )
        return out
    t, heads, _ = x.shape
    block_h, block_half, warps = norm_launch_config(n, heads)
    _rms_norm_kernel[(t, triton.cdiv(heads, block_h))](
        x, weight, out,
        x.stride(0), x.stride(1), out.stride(0), out.stride(1),
        eps,
        HEADS=heads, N=n, BLOCK_H=block_h, BLOCK_HALF=block_half, PDL=pdl,
        num_warps=warps, enable_fp_fusion=False, **launch_options(pdl),
    )
    return out


__all__ = ["norm_launch_config", "rms_norm"]
