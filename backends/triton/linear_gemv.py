"""The GEMV of :func:`linear.linear` (T <= 16 tokens: decode, speculative verify) and its split-K
reduce; linear.py checks the arguments and picks this path or the GEMM (linear_gemm.py).

Tiling and grid. ``_gemv_kernel``: a program owns BLOCK_N weight rows and streams a range of K in
BLOCK_K chunks (``gemv_config`` of linear_gemv_tiles.py gives the tiles); every thread loads 16 contiguous bytes of a row
per access (weights ``evict_first``: they are read once per step; activations ``evict_last``). Grid ``(cdiv(N,
BLOCK_N), SPLIT_K)``. For T = 1 the multiply runs on CUDA cores into a ``[BLOCK_N, BLOCK_K]``
float32 register tile (FMAs), summed over K once after the loop. For T = 2..16 it is ``tl.dot`` with
the token rows padded to BLOCK_T = 16 (``acc[16, BLOCK_N] += x[16, BK] @ w[BN, BK]^T``): at T = 16
CUDA cores would need ~69 TFLOP/s of fp32 FMAs to keep up with 4.25 TB/s of bf16 weights, more than
the H200's ~67 TFLOP/s peak, while the tensor cores make the math free for any T <= 16, and one
compiled kernel (T a run-time argument, masked rows) serves every T in 2..16. Layers whose grid
would leave SMs idle (at T >= 2: o_proj and down, N = hidden) split K across SPLIT_K programs
writing float32 partials ``[SPLIT_K, T, N]``; ``_splitk_reduce_kernel`` (grid ``(T, cdiv(N_out,
1024))``) adds them in a fixed order (deterministic, no atomics) and applies the epilogues; or
(a config's ``fused_reduce``, not with SwiGLU) the last split's program of each column block,
found by a counter, adds them in the same order and applies them (:func:`reduce_if_last`: one
launch fewer, the same bits).

Fusions. SwiGLU: a program owns gate rows j..j+BN and up rows I+j..I+j+BN of the fused [gate; up]
weight, computes both accumulators with the same code and tiles as the plain kernel (the same
per-row accumulation order), rounds each to the output dtype as the plain store would, and applies
:func:`silu_mul_f32`; with split-K the partial kernel is the plain one and the epilogue runs in the
reduce. RMSNorm prologue (``NORM``): every program reduces its token rows' sum of squares with
rms_norm.py's row tiles and device functions (:func:`_norm_rstd`), then normalizes each chunk of x
as it loads it. Residual epilogue: ``round(y + r)`` as add.py. Hence the fused forms are
bit-identical to the chain of per-op kernels.

Programmatic dependent launch (``PDL``): the kernel lets the next one launch at its start (a
config's ``late_launch``: after its K loop) and issues its first weight chunk's load before the
grid dependency wait; the activations (and the
prologue's reduction) come after it. Under the interpreter every dot operand is cast to float32
(``DOT_F32``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from tileinfer.backends.triton.device_functions import (
    add_residual,
    load_row_halves,
    round_to,
    rstd_halves,
    scale_normalized,
    silu_mul_f32,
)
from tileinfer.backends.triton.linear_gemv_tiles import (
    LM_HEAD_ROWS,
    GemvConfig,
    gemv_config,
    gemv_split_k,
    gemv_tiles,
    verify_tiles,
)
from tileinfer.backends.triton.pdl import launch_options
from tileinfer.backends.triton.rms_norm import norm_launch_config
from tileinfer.backends.triton.linear_split_counters import split_counters

GEMV_BLOCK_T = 16  # token rows of the GEMV's tl.dot (T = 2..16 padded to 16)
REDUCE_BLOCK = 1024


@triton.jit
def _load_w(w_ptrs, k0, offs_k, K, EVEN_K: tl.constexpr):
    # Every device function here returns once, at the end: the compiler would also build the code
    # after a return inside a constexpr branch.
    if EVEN_K:
        w = tl.load(w_ptrs + k0, eviction_policy="evict_first")
    else:
        w = tl.load(w_ptrs + k0, mask=(offs_k < K - k0)[None, :], other=0.0, eviction_policy="evict_first")
    return w


@triton.jit
def _load_x(x_ptrs, k0, offs_k, K, t_mask, USE_DOT: tl.constexpr, EVEN_K: tl.constexpr):
    if USE_DOT:
        if EVEN_K:
            x = tl.load(x_ptrs + k0, mask=t_mask[:, None], other=0.0, eviction_policy="evict_last")
        else:
            x = tl.load(x_ptrs + k0, mask=t_mask[:, None] & (offs_k < K - k0)[None, :], other=0.0,
                        eviction_policy="evict_last")
    else:
        if EVEN_K:
            x = tl.load(x_ptrs + k0, eviction_policy="evict_last")
        else:
            x = tl.load(x_ptrs + k0, mask=offs_k < K - k0, other=0.0, eviction_policy="evict_last")
    return x


@triton.jit
def _norm_rstd(x_ptr, T, stride_xt, eps, BLOCK_T: tl.constexpr, NORM_K: tl.constexpr,
               NORM_HALF: tl.constexpr, USE_DOT: tl.constexpr):
    """The RMSNorm prologue's ``rsqrt(mean(x^2) + eps)`` of each token row of ``x`` (``NORM_K`` =
    K elements): a float32 scalar (T = 1 path) or ``[BLOCK_T, 1]`` (tl.dot path; padded rows 1).
    Each row is reduced alone, on the tiles of rms_norm.py's row kernel."""
    if USE_DOT:
        offs_t = tl.arange(0, BLOCK_T)[:, None]
        rstd = tl.full((BLOCK_T, 1), 1.0, tl.float32)
        for t in range(0, T):
            a, b = load_row_halves(x_ptr + t * stride_xt, NORM_K, NORM_HALF)
            rstd = tl.where(offs_t == t, tl.sum(rstd_halves(a, b, NORM_K, eps)), rstd)
    else:
        a, b = load_row_halves(x_ptr, NORM_K, NORM_HALF)
        rstd = tl.sum(rstd_halves(a, b, NORM_K, eps))
    return rstd


@triton.jit
def _normalize_x(x, nw_ptr, k0, offs_k, K, rstd, USE_DOT: tl.constexpr, EVEN_K: tl.constexpr):
    """The chunk ``x[:, k0:k0 + BLOCK_K]`` RMS-normalized: ``round(w * round(x * rstd))`` with the
    norm weight's chunk, in x's dtype (as the row kernel stores it)."""
    if EVEN_K:
        w = tl.load(nw_ptr + k0 + offs_k, eviction_policy="evict_last")
    else:
        w = tl.load(nw_ptr + k0 + offs_k, mask=offs_k < K - k0, other=0.0, eviction_policy="evict_last")
    w = w.to(tl.float32)
    if USE_DOT:
        w = w[None, :]
    return scale_normalized(x.to(tl.float32), rstd, w, x.dtype)


@triton.jit
def _gemv_accumulate(acc, w, x, USE_DOT: tl.constexpr, DOT_F32: tl.constexpr, BITS: tl.constexpr):
    # BITS: unused (the int8 GEMV's accumulate takes it; gemv_rows calls either)
    if USE_DOT:
        if DOT_F32:
            w = w.to(tl.float32)
            x = x.to(tl.float32)
        acc = tl.dot(x, tl.trans(w), acc, input_precision="ieee")
    else:
        acc = acc + w.to(tl.float32) * x.to(tl.float32)[None, :]
    return acc


@triton.jit
def gemv_rows(
    x_ptr, w_ptr, nw_ptr, rows, T, K, kb_lo, kb_hi, stride_xt, stride_wn, eps,
    BLOCK_T: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, USE_DOT: tl.constexpr,
    DOT_F32: tl.constexpr, EVEN_K: tl.constexpr, PDL: tl.constexpr, NORM: tl.constexpr,
    NORM_K: tl.constexpr, NORM_HALF: tl.constexpr, ACCUMULATE: tl.constexpr, ACC_K: tl.constexpr,
    BITS: tl.constexpr,
):
    """float32 sums of x[t, k] * w[rows, k] over the K chunks [kb_lo, kb_hi) (never empty):
    [BLOCK_T, BLOCK_N] (tl.dot path) or [BLOCK_N] (T = 1 path). ``rows`` must be valid row
    indices (no row mask). The first chunk is peeled: its weight load is issued before the grid
    dependency wait (``PDL``), so it overlaps the tail of the kernel before; the activations, which
    that kernel may have written, are read after it. The order of the sums is the same either way.
    ``NORM``: x is RMS-normalized on the fly with the weight at ``nw_ptr`` (the prologue).
    ``ACCUMULATE(acc, w, x, USE_DOT, DOT_F32, BITS)`` adds a chunk's products (``_gemv_accumulate``;
    the int8 GEMV's converts the weights first); the T = 1 path's accumulator is ``[BLOCK_N,
    ACC_K]``, summed over its columns after the loop."""
    offs_k = tl.arange(0, BLOCK_K)
    offs_t = tl.arange(0, BLOCK_T)
    t_mask = offs_t < T
    w_ptrs = w_ptr + rows.to(tl.int64)[:, None] * stride_wn + offs_k[None, :]
    if USE_DOT:
        x_ptrs = x_ptr + offs_t.to(tl.int64)[:, None] * stride_xt + offs_k[None, :]
        acc = tl.zeros((BLOCK_T, BLOCK_N), dtype=tl.float32)
    else:
        x_ptrs = x_ptr + offs_k
        acc = tl.zeros((BLOCK_N, ACC_K), dtype=tl.float32)
    k0 = kb_lo * BLOCK_K
    w = _load_w(w_ptrs, k0, offs_k, K, EVEN_K)
    if PDL:
        gdc_wait()
    if NORM:
        rstd = _norm_rstd(x_ptr, T, stride_xt, eps, BLOCK_T, NORM_K, NORM_HALF, USE_DOT)
    x = _load_x(x_ptrs, k0, offs_k, K, t_mask, USE_DOT, EVEN_K)
    if NORM:
        x = _normalize_x(x, nw_ptr, k0, offs_k, K, rstd, USE_DOT, EVEN_K)
    acc = ACCUMULATE(acc, w, x, USE_DOT, DOT_F32, BITS)
    for kb in range(kb_lo + 1, kb_hi):
        k0 = kb * BLOCK_K
        w = _load_w(w_ptrs, k0, offs_k, K, EVEN_K)
        x = _load_x(x_ptrs, k0, offs_k, K, t_mask, USE_DOT, EVEN_K)
        if NORM:
            x = _normalize_x(x, nw_ptr, k0, offs_k, K, rstd, USE_DOT, EVEN_K)
        acc = ACCUMULATE(acc, w, x, USE_DOT, DOT_F32, BITS)
    if not USE_DOT:
        acc = tl.sum(acc, axis=1)
    return acc


@triton.jit
def gemv_program(K, N, kb_per_split, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr,
                 LATE_LAUNCH: tl.constexpr):
    """A GEMV program's place: ``(pid_k, kb_lo, kb_hi, offs_n, rows)``, its split, that split's K
    chunks ``[kb_lo, kb_hi)``, its BLOCK_N output columns and the weight rows they read (``offs_n
    % N``: tail rows re-read a valid row; their results are not stored). With ``PDL`` it first lets
    the next kernel launch, unless ``LATE_LAUNCH`` (then the kernel calls :func:`launch_late`
    after its K loop)."""
    if PDL:
        if not LATE_LAUNCH:
            gdc_launch_dependents()
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    kb_lo = pid_k * kb_per_split
    kb_hi = tl.minimum(kb_lo + kb_per_split, tl.cdiv(K, BLOCK_K))
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rows = offs_n % N  # tail rows re-read a valid row; their results are not stored
    return pid_k, kb_lo, kb_hi, offs_n, rows


@triton.jit
def launch_late(PDL: tl.constexpr, LATE_LAUNCH: tl.constexpr):
    """With ``PDL`` and ``LATE_LAUNCH``: let the next kernel launch now (after the K loop, so its
    programs do not take SM slots while this kernel's weight stream runs)."""
    if PDL:
        if LATE_LAUNCH:
            gdc_launch_dependents()


@triton.jit
def store_gemv(acc, y_ptr, r_ptr, offs_n, pid_k, T, N, stride_ys, stride_yt, stride_rt,
               BLOCK_T: tl.constexpr, USE_DOT: tl.constexpr, RESIDUAL: tl.constexpr):
    """The GEMV's store of the float32 ``acc`` (``[BLOCK_T, BLOCK_N]`` or ``[BLOCK_N]``) of columns
    ``offs_n``: rounded to y's dtype, plus ``r`` where RESIDUAL (add.py's rounding), in split
    ``pid_k``'s slice of y (``stride_ys``; 0 without split-K)."""
    out_ty = y_ptr.dtype.element_ty
    y_ptr += pid_k.to(tl.int64) * stride_ys
    n_mask = offs_n < N
    if USE_DOT:
        offs_t = tl.arange(0, BLOCK_T).to(tl.int64)[:, None]
        mask = (offs_t < T) & n_mask[None, :]
        y = add_residual(acc.to(out_ty), r_ptr + offs_t * stride_rt + offs_n[None, :], mask, RESIDUAL)
        tl.store(y_ptr + offs_t * stride_yt + offs_n[None, :], y, mask=mask)
    else:
        y = add_residual(acc.to(out_ty), r_ptr + offs_n, n_mask, RESIDUAL)
        tl.store(y_ptr + offs_n, y, mask=n_mask)


@triton.jit
def _gemv_kernel(
    x_ptr, w_ptr, y_ptr, nw_ptr, r_ptr, o_ptr, lock_ptr, T, N, K, I_OFF, kb_per_split, eps,
    stride_xt, stride_wn, stride_ys, stride_yt, stride_rt, stride_ot,
    BLOCK_T: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    USE_DOT: tl.constexpr, SWIGLU: tl.constexpr, DOT_F32: tl.constexpr, EVEN_K: tl.constexpr,
    PDL: tl.constexpr, NORM: tl.constexpr, NORM_K: tl.constexpr, NORM_HALF: tl.constexpr,
    RESIDUAL: tl.constexpr, FUSED_REDUCE: tl.constexpr, LATE_LAUNCH: tl.constexpr,
):
    """y[t, n] (or split pid_k's float32 partial of it) for the BLOCK_N output columns of this
    program. N = output columns (I when SWIGLU: gate row n, up row I_OFF + n). NORM: x is
    RMS-normalized first (weight ``nw_ptr``, ``NORM_K`` = K); RESIDUAL: ``r[t, n]`` is added to the
    rounded result (``r`` has the output's shape). FUSED_REDUCE (split-K, no SWIGLU): y holds the
    partials, and the last split's program of each column block writes ``o`` (``reduce_if_last``).
    LATE_LAUNCH (with PDL): the next kernel may launch once every program finished its K loop."""
    pid_k, kb_lo, kb_hi, offs_n, rows = gemv_program(K, N, kb_per_split, BLOCK_N, BLOCK_K, PDL, LATE_LAUNCH)
    acc = gemv_rows(x_ptr, w_ptr, nw_ptr, rows, T, K, kb_lo, kb_hi, stride_xt, stride_wn, eps, BLOCK_T, BLOCK_N,
                    BLOCK_K, USE_DOT, DOT_F32, EVEN_K, PDL, NORM, NORM_K, NORM_HALF, _gemv_accumulate, BLOCK_K, False)
    out_ty = y_ptr.dtype.element_ty
    if SWIGLU:
        acc_u = gemv_rows(x_ptr, w_ptr, nw_ptr, rows + I_OFF, T, K, kb_lo, kb_hi, stride_xt, stride_wn, eps,
                          BLOCK_T, BLOCK_N, BLOCK_K, USE_DOT, DOT_F32, EVEN_K, PDL, NORM, NORM_K, NORM_HALF,
                          _gemv_accumulate, BLOCK_K, False)
        acc = silu_mul_f32(round_to(acc, out_ty), round_to(acc_u, out_ty))
    launch_late(PDL, LATE_LAUNCH)
    store_gemv(acc, y_ptr, r_ptr, offs_n, pid_k, T, N, stride_ys, stride_yt, stride_rt, BLOCK_T, USE_DOT,
               RESIDUAL and not FUSED_REDUCE)
    if FUSED_REDUCE:
        reduce_if_last(y_ptr, o_ptr, r_ptr, lock_ptr, offs_n, T, N, stride_ys, stride_yt, stride_ot, stride_rt,
                       BLOCK_T, USE_DOT, RESIDUAL)


@triton.jit
def reduce_if_last(p_ptr, o_ptr, r_ptr, lock_ptr, offs_n, T, N, stride_ps, stride_pt, stride_ot, stride_rt,
                   BLOCK_T: tl.constexpr, USE_DOT: tl.constexpr, RESIDUAL: tl.constexpr):
    """Split-K without a reduce kernel: after a program stored its split's float32 partial of
    columns ``offs_n`` in ``p`` (``[splits, T, N]``), it counts itself in the column block's
    counter (``lock_ptr``, int32, 0 between launches); the program that counts last adds the
    partials of splits 0, 1, ... in that order (the reduce kernel's order: the same bits), rounds
    to o's dtype, adds ``r`` where RESIDUAL, stores ``o`` and sets the counter back to 0. The
    barrier orders every thread's partial store before the count; the count's acquire-release
    and the L1-bypassing loads make the other programs' partials visible to the last one."""
    tl.debug_barrier()
    lock = lock_ptr + tl.program_id(0)
    counted = tl.atomic_add(lock, 1, sem="acq_rel")
    splits = tl.num_programs(1)
    if counted == splits - 1:
        n_mask = offs_n < N
        if USE_DOT:
            offs_t = tl.arange(0, BLOCK_T).to(tl.int64)[:, None]
            mask = (offs_t < T) & n_mask[None, :]
            p_ptrs = p_ptr + offs_t * stride_pt + offs_n[None, :]
            o_ptrs = o_ptr + offs_t * stride_ot + offs_n[None, :]
            r_ptrs = r_ptr + offs_t * stride_rt + offs_n[None, :]
        else:
            mask = n_mask
            p_ptrs = p_ptr + offs_n
            o_ptrs = o_ptr + offs_n
            r_ptrs = r_ptr + offs_n
        acc = tl.load(p_ptrs, mask=mask, other=0.0, cache_modifier=".cg")
        for s in range(1, splits):
            acc += tl.load(p_ptrs + s * stride_ps, mask=mask, other=0.0, cache_modifier=".cg")
        y = add_residual(acc.to(o_ptr.dtype.element_ty), r_ptrs, mask, RESIDUAL)
        tl.store(o_ptrs, y, mask=mask)
        tl.atomic_xchg(lock, 0)


@triton.jit
def _sum_splits(p_ptrs, mask, stride_ps, SPLIT_K: tl.constexpr):
    """Partials of splits 0, 1, ..., SPLIT_K-1 added in that order (deterministic)."""
    acc = tl.load(p_ptrs, mask=mask, other=0.0)
    for s in tl.static_range(1, SPLIT_K):
        acc += tl.load(p_ptrs + s * stride_ps, mask=mask, other=0.0)
    return acc


@triton.jit
def _splitk_reduce_kernel(
    p_ptr, y_ptr, r_ptr, N, I_OFF, stride_ps, stride_pt, stride_yt, stride_rt,
    SPLIT_K: tl.constexpr, BLOCK: tl.constexpr, SWIGLU: tl.constexpr, PDL: tl.constexpr,
    RESIDUAL: tl.constexpr,
):
    if PDL:
        gdc_launch_dependents()
        gdc_wait()
    t = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < N
    p_ptrs = p_ptr + t * stride_pt + offs
    acc = _sum_splits(p_ptrs, mask, stride_ps, SPLIT_K)
    out_ty = y_ptr.dtype.element_ty
    if SWIGLU:
        acc_u = _sum_splits(p_ptrs + I_OFF, mask, stride_ps, SPLIT_K)
        acc = silu_mul_f32(round_to(acc, out_ty), round_to(acc_u, out_ty))
    y = add_residual(acc.to(out_ty), r_ptr + t * stride_rt + offs, mask, RESIDUAL)
    tl.store(y_ptr + t * stride_yt + offs, y, mask=mask)


def launch_gemv(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor, norm_weight: torch.Tensor | None, eps: float,
                residual: torch.Tensor | None, cfg: GemvConfig, n_out: int, i_off: int, swiglu: bool,
                dot_f32: bool, pdl: bool) -> None:
    """The GEMV of ``linear`` (T <= 16) on checked arguments: ``_gemv_kernel`` alone, or with split
    K its float32 partials over all weight rows (the prologue included) then
    ``_splitk_reduce_kernel``, which applies the epilogues. ``i_off``: the first up row of a SwiGLU
    weight (else 0); ``dot_f32``: float32 dot operands (the interpreter); ``pdl``: granted."""
    launch_gemv_kernel(_gemv_kernel, x, (w,), w, out, norm_weight, eps, residual, cfg, n_out, i_off, swiglu,
                       dot_f32, pdl, LATE_LAUNCH=cfg.late_launch)


def launch_gemv_kernel(kernel, x: torch.Tensor, weights: tuple[torch.Tensor, ...], no_norm: torch.Tensor,
                       out: torch.Tensor, norm_weight: torch.Tensor | None, eps: float, residual: torch.Tensor | None,
                       cfg, n_out: int, i_off: int, swiglu: bool, dot_f32: bool, pdl: bool, **extra) -> None:
    """Launch a GEMV ``kernel`` with the arguments of ``_gemv_kernel`` (``weights``: what stands at
    its ``w_ptr``, e.g. ``(q, scale)``; the first is the ``[N, K]`` weight; ``no_norm``: the tensor
    passed as the unused ``nw_ptr`` without the norm prologue; ``extra``: constexprs of its own)
    alone, or with split K over all weight rows then ``_splitk_reduce_kernel`` (or, with the
    config's ``fused_reduce`` and no SwiGLU, the sum in the last split's program)."""
    T, K = x.shape
    n_w = weights[0].shape[0]
    stride_wn = weights[0].stride(0)
    use_dot = T > 1
    k_blocks = triton.cdiv(K, cfg.block_k)
    kb_per_split = triton.cdiv(k_blocks, cfg.split_k)
    split = triton.cdiv(k_blocks, kb_per_split)  # no empty split
    norm = norm_weight is not None
    has_residual = residual is not None
    nw = norm_weight if norm else no_norm
    r = residual if has_residual else out
    consts = dict(BLOCK_T=GEMV_BLOCK_T if use_dot else 1, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
                  USE_DOT=use_dot, DOT_F32=dot_f32, EVEN_K=K % cfg.block_k == 0, PDL=pdl,
                  NORM=norm, NORM_K=K if norm else 0, NORM_HALF=norm_launch_config(K, 1)[1] if norm else 1,
                  **extra, num_warps=cfg.num_warps, num_stages=cfg.num_stages, enable_fp_fusion=True,
                  **launch_options(pdl))
    if split == 1:
        grid = (triton.cdiv(n_out, cfg.block_n), 1)
        kernel[grid](x, *weights, out, nw, r, out, out, T, n_out, K, i_off, kb_per_split, eps,
                     x.stride(0), stride_wn, 0, out.stride(0), r.stride(0), out.stride(0),
                     SWIGLU=swiglu, RESIDUAL=has_residual, FUSED_REDUCE=False, **consts)
        return
    # Split-K: the partial kernel is the plain one over all weight rows (the prologue included);
    # the epilogues run in the reduce kernel, or in the last split's program (fused_reduce).
    part = torch.empty((split, T, n_w), dtype=torch.float32, device=x.device)
    grid = (triton.cdiv(n_w, cfg.block_n), split)
    if getattr(cfg, "fused_reduce", False) and not swiglu:
        kernel[grid](x, *weights, part, nw, r, out, split_counters(x.device, grid[0]), T, n_w, K, 0, kb_per_split, eps,
                     x.stride(0), stride_wn, part.stride(0), part.stride(1), r.stride(0), out.stride(0),
                     SWIGLU=False, RESIDUAL=has_residual, FUSED_REDUCE=True, **consts)
        return
    kernel[grid](x, *weights, part, nw, part, part, part, T, n_w, K, 0, kb_per_split, eps,
                 x.stride(0), stride_wn, part.stride(0), part.stride(1), 0, 0,
                 SWIGLU=False, RESIDUAL=False, FUSED_REDUCE=False, **consts)
    grid = (T, triton.cdiv(n_out, REDUCE_BLOCK))
    _splitk_reduce_kernel[grid](part, out, r, n_out, i_off, part.stride(0), part.stride(1), out.stride(0),
                                r.stride(0), SPLIT_K=split, BLOCK=REDUCE_BLOCK, SWIGLU=swiglu, PDL=pdl,
                                RESIDUAL=has_residual, num_warps=4, enable_fp_fusion=True, **launch_options(pdl))


__all__ = ["LM_HEAD_ROWS", "GemvConfig", "gemv_config", "gemv_program", "gemv_rows", "gemv_split_k", "gemv_tiles", "launch_gemv", "launch_late",
           "launch_gemv_kernel", "reduce_if_last", "store_gemv", "verify_tiles"]
