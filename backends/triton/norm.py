"""RMSNorm and the residual add; twin: backends/reference/norm.py.

Tiling and grid: a program holds whole vectors in registers, each loaded as its two halves
(channels ``0..N/2`` and ``N/2..N``, ``BLOCK_HALF = next_pow2(N / 2)`` wide, masked): the q/k
kernels of attention_inputs.py rotate those halves for RoPE without a shuffle. Rows of ``[T, H]``
(``_row_rms_norm_kernel``): one row a program, ``[1, BLOCK_HALF]`` tiles, grid ``(T,)``, 8 warps for
H = 2,560 or 4,096 unless the caller passes its own ``num_warps``. Heads of ``[T, heads, D]``
(``_rms_norm_kernel``): ``BLOCK_H`` heads of one token a program, ``[BLOCK_H, BLOCK_HALF]`` tiles
reduced along the channels, grid ``(T, cdiv(heads, BLOCK_H))``; ``BLOCK_H = min(next_pow2(heads),
1024 / (2 BLOCK_HALF))`` (8 heads of 128, 2 warps). The fused q/k kernel uses the same tiles.
:func:`norm_launch_config` gives ``(BLOCK_H, BLOCK_HALF, num_warps)`` from ``(N, heads)`` alone for
all of them. ``add`` is a flat elementwise kernel, 1,024 elements a program.

Arithmetic (Hugging Face Qwen3, as the twin): ``x`` in float32, ``x * rsqrt(mean(x^2) + eps)``,
rounded to the model dtype, then multiplied by the weight in the model dtype (float32 product of
the two rounded values, rounded once more). The residual sum is ``round(x + r)``. The GEMV of
linear.py normalizes its input in its prologue with the helpers here (:func:`_load_row_halves`,
:func:`_rstd_halves`, :func:`_scale_normalized`) on the same ``[1, BLOCK_HALF]`` row tiles; given
the same ``num_warps`` the sums have the same ``tl.sum`` layout, hence the same roundings. The
row kernel is compiled with floating-point contraction on, as the GEMV is (its multiply-adds are
FMAs: turning contraction off there cost 5-8 % of GEMV speed on the H200), so the sum of squares
contracts alike in both; every other kernel here turns it off (``enable_fp_fusion=False``) so
that no kernel fuses a multiply-add that its twin (e.g. RoPE's torch twin) does not.

Programmatic dependent launch (``pdl=True``, Hopper; backends/triton/pdl.py): the kernels let the
next kernel launch at their start, load the norm weight (immutable) before the grid dependency
wait, and everything else (activations, residual) after it. Same bits with or without.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from tileinfer.backends.triton.pdl import launch_options, use_pdl

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
ADD_BLOCK = 1024  # elements per program of `add`
TILE_ELEMENTS = 1024  # a head-vector program takes this many elements (8 heads of 128) at most


def norm_launch_config(n: int, vectors: int) -> tuple[int, int, int]:
    """``(BLOCK_H, BLOCK_HALF, num_warps)`` to normalize ``vectors`` vectors of length ``n`` per
    token. Every kernel that normalizes such vectors (the per-op norm and the fused ones) launches
    with exactly this, which keeps their ``tl.sum`` layouts, hence their roundings, identical."""
    block_half = triton.next_power_of_2(max(n // 2, 1))
    block_h = min(triton.next_power_of_2(vectors), max(1, TILE_ELEMENTS // (2 * block_half)))
    num_warps = max(1, min(16, (2 * block_half * block_h) // 512))  # [8, 2x64] -> 2, [1, 2x2048] -> 8
    return block_h, block_half, num_warps


# -- shared device helpers (attention_inputs.py uses them too) ---------------------------------------


@triton.jit
def _add_round(x, r, DTYPE: tl.constexpr):
    """``round(x + r)`` to the model dtype, from float32 operands (the residual add)."""
    return (x + r).to(DTYPE)


@triton.jit
def _rstd_halves(a, b, N: tl.constexpr, eps):
    """``rsqrt(mean(x^2) + eps)`` of the rows of ``(a, b)`` (float32 ``[BLOCK_H, BLOCK_HALF]`` halves
    of vectors of length ``N``, 0 where masked): ``[BLOCK_H, 1]``. The order of the sum depends on
    the tiles and ``num_warps`` only: every caller that must round alike uses the same ones."""
    ss = tl.sum(a * a, axis=1, keep_dims=True) + tl.sum(b * b, axis=1, keep_dims=True)
    return tl.math.rsqrt(ss / N + eps)


@triton.jit
def _scale_normalized(x, rstd, w, DTYPE: tl.constexpr):
    """``round(w * round(x * rstd))`` in DTYPE, from float32 ``x`` and ``w`` (the model-dtype
    weight's values); elementwise, so any tile of ``x`` gives the same bits."""
    return (w * (x * rstd).to(DTYPE).to(tl.float32)).to(DTYPE)


@triton.jit
def _rms_norm_halves(a, b, wa, wb, N: tl.constexpr, eps, DTYPE: tl.constexpr):
    """RMSNorm of the rows of ``(a, b)``: float32 ``[BLOCK_H, BLOCK_HALF]`` tiles holding the two
    halves of ``BLOCK_H`` vectors of length ``N`` (0 where masked), with weight halves ``wa``,
    ``wb`` (``[1, BLOCK_HALF]``, float32 values of the model-dtype weight). Returns both halves in
    ``DTYPE``: ``round(w * round(x * rsqrt(mean(x^2) + eps)))``."""
    rstd = _rstd_halves(a, b, N, eps)
    return _scale_normalized(a, rstd, wa, DTYPE), _scale_normalized(b, rstd, wb, DTYPE)


@triton.jit
def _load_row_halves(row_ptr, N: tl.constexpr, BLOCK_HALF: tl.constexpr):
    """The two halves of the ``[N]`` vector at ``row_ptr`` as float32 ``[1, BLOCK_HALF]`` tiles (0
    where masked): how every row RMSNorm (the row kernel here, the GEMV prologue of linear.py)
    loads the row it reduces, so that their sums run on the same layout."""
    offs = tl.arange(0, BLOCK_HALF)[None, :]
    mask = offs < N // 2
    a = tl.load(row_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(row_ptr + N // 2 + offs, mask=mask, other=0.0).to(tl.float32)
    return a, b


@triton.jit
def _load_weight_halves(w_ptr, offs, D: tl.constexpr):
    """The two halves of a ``[D]`` norm weight as float32 ``[1, BLOCK_HALF]`` tiles."""
    wa = tl.load(w_ptr + offs, mask=offs < D // 2, other=0.0).to(tl.float32)
    wb = tl.load(w_ptr + D // 2 + offs, mask=offs < D // 2, other=0.0).to(tl.float32)
    return wa, wb


# -- kernels --------------------------------------------------------------------------------------


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
    wa, wb = _load_weight_halves(w_ptr, offs, N)
    if PDL:
        gdc_wait()  # x may be the output of the kernel before
    x = x_ptr + t * stride_x_t + heads * stride_x_h + offs
    a = tl.load(x, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(x + N // 2, mask=mask, other=0.0).to(tl.float32)
    ya, yb = _rms_norm_halves(a, b, wa, wb, N, eps, out_ptr.dtype.element_ty)
    o = out_ptr + t * stride_o_t + heads * stride_o_h + offs
    tl.store(o, ya, mask=mask)
    tl.store(o + N // 2, yb, mask=mask)


@triton.jit
def _add_kernel(x_ptr, r_ptr, out_ptr, n_elements, BLOCK: tl.constexpr, PDL: tl.constexpr):
    if PDL:
        gdc_launch_dependents()
        gdc_wait()
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n_elements
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    r = tl.load(r_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + offs, _add_round(x, r, out_ptr.dtype.element_ty), mask=mask)


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
    wa, wb = _load_weight_halves(w_ptr, offs, N)
    if PDL:
        gdc_wait()  # x may be the output of the kernel before
    a, b = _load_row_halves(x_ptr + t * stride_x_t, N, BLOCK_HALF)
    ya, yb = _rms_norm_halves(a, b, wa, wb, N, eps, out_ptr.dtype.element_ty)
    o = out_ptr + t * stride_o_t + offs
    tl.store(o, ya, mask=mask)
    tl.store(o + N // 2, yb, mask=mask)


# -- launchers ------------------------------------------------------------------------------------


def _check_out(out: torch.Tensor | None, like: torch.Tensor, name: str) -> torch.Tensor:
    if out is None:
        return torch.empty(like.shape, dtype=like.dtype, device=like.device)
    assert out.shape == like.shape and out.dtype == like.dtype and out.device == like.device, (
        f"{name}: {tuple(out.shape)} {out.dtype} {out.device}, expected {tuple(like.shape)} {like.dtype} {like.device}"
    )
    assert out.stride(-1) == 1, f"{name} must be contiguous in its last dim"
    return out


def _check_vector_op(x: torch.Tensor, weight: torch.Tensor) -> int:
    assert x.dtype in FLOAT_DTYPES, f"x dtype {x.dtype}"
    n = x.shape[-1]
    assert n % 2 == 0, f"the normalized dim must be even (loaded as two halves), got {n}"
    assert x.stride(-1) == 1, "x must be contiguous in its last dim"
    assert weight.shape == (n,) and weight.dtype == x.dtype and weight.is_contiguous(), (
        f"weight {tuple(weight.shape)} {weight.dtype}, expected ({n},) {x.dtype} contiguous"
    )
    assert weight.device == x.device
    return n


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, *, out: torch.Tensor | None = None,
             pdl: bool = False, num_warps: int | None = None) -> torch.Tensor:
    """RMSNorm over the last dim of ``x`` ``[T, H]`` or ``[T, heads, D]`` (any strides but a
    contiguous last dim), ``weight`` ``[last]`` in x's dtype. Returns ``out`` (new and contiguous
    unless given), x's shape and dtype: ``weight * round(x * rsqrt(mean(x^2) + eps))``.
    ``pdl``: programmatic dependent launch where supported (the weight must be immutable: it is
    read before the wait for the kernel before); same bits. ``num_warps`` (``[T, H]`` only):
    launch the row kernel with these warps instead of ``norm_launch_config``'s; the order of the
    sum of squares depends on them, and the unfused chain of linear.py passes the GEMV's so that
    its norm rounds like the GEMV's norm prologue."""
    assert x.dim() in (2, 3), f"x must be [T, H] or [T, heads, D], got {tuple(x.shape)}"
    n = _check_vector_op(x, weight)
    out = _check_out(out, x, "out")
    if x.numel() == 0:
        return out
    pdl = use_pdl(pdl, x.device)
    if x.dim() == 2:
        _, block_half, warps = norm_launch_config(n, 1)
        _row_rms_norm_kernel[(x.shape[0],)](
            x, weight, out, x.stride(0), out.stride(0), eps,
            N=n, BLOCK_HALF=block_half, PDL=pdl,
            num_warps=num_warps or warps, enable_fp_fusion=True, **launch_options(pdl),  # as the GEMV
        )
        return out
    assert num_warps is None, "num_warps is for [T, H] rows"
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


def add(x: torch.Tensor, residual: torch.Tensor, *, out: torch.Tensor | None = None,
        pdl: bool = False) -> torch.Tensor:
    """``round(x + residual)`` in the model dtype (contiguous tensors of one shape and dtype).
    ``out`` may be ``residual`` or ``x`` (each element is read before it is written). ``pdl``:
    programmatic dependent launch where supported; same bits."""
    assert x.dtype in FLOAT_DTYPES and residual.dtype == x.dtype, f"{x.dtype} + {residual.dtype}"
    assert x.shape == residual.shape and x.device == residual.device
    assert x.is_contiguous() and residual.is_contiguous(), "add takes contiguous tensors"
    out = _check_out(out, x, "out")
    assert out.is_contiguous()
    n = x.numel()
    if n:
        pdl = use_pdl(pdl, x.device)
        _add_kernel[(triton.cdiv(n, ADD_BLOCK),)](x, residual, out, n, BLOCK=ADD_BLOCK, PDL=pdl, num_warps=4,
                                                 enable_fp_fusion=False, **launch_options(pdl))
    return out
