"""The GEMV of :func:`linear.linear` (T <= 16 tokens: decode, speculative verify) for both weight
formats, its split-K reduce, and the counter with which the last of several programs reduces.

Tiling and grid. ``_gemv_kernel``: a program owns BLOCK_N weight rows and streams a range of K in
BLOCK_K chunks (``gemv_config`` of linear_tiles.py gives the tiles); every thread loads 16
contiguous bytes of a row per access (weights ``evict_first``: they are read once per step;
activations ``evict_last``). Grid ``(cdiv(N, BLOCK_N), SPLIT_K)``. For T = 1 the multiply runs on
CUDA cores into a float32 register tile, summed over K once after the loop: ``[BLOCK_N, BLOCK_K]``
of FMAs, or for int8 weights each thread's 16 contiguous products added in registers first
(``[BLOCK_N, BLOCK_K / 16]``: a full-width tile took 120 registers a thread at the T = 1 tiles,
this one under 72). For T = 2..16 it is ``tl.dot`` with the token rows padded to BLOCK_T = 16
(``acc[16, BLOCK_N] += x[16, BK] @ w[BN, BK]^T``, :func:`dot_chunk`): at T = 16 CUDA cores would
need ~69 TFLOP/s of fp32 FMAs to keep up with 4.25 TB/s of bf16 weights, more than the H200's ~67
TFLOP/s peak, while the tensor cores make the math free for any T <= 16, and one compiled kernel
(T a run-time argument, masked rows) serves every T in 2..16.

Weight formats (``INT8``): weights in the model dtype, or int8 rows (16 weights a 16-byte access
where the model dtype has 8, so BLOCK_K is twice as long for the same bytes) converted exactly in
registers (:func:`int8_to`, on the bit patterns, not the I2F instruction: 16 results per clock and
SM on sm_90, fewer than a memory-bound GEMV streams), the float32 accumulator multiplied by the
row scales before the epilogues. Int8 rows in the ``fragments`` layout (``FRAG``, linear_layout.py)
are multiplied as stored, by the activation chunk put in their order (:func:`in_fragment_order`:
the same products, summed in another order than for ``rows``).

Split-K. Layers whose grid would leave SMs idle (at T >= 2: o_proj and down, N = hidden) split K
across SPLIT_K programs writing float32 partials ``[SPLIT_K, T, N]`` (scaled, for int8);
``_splitk_reduce_kernel`` (grid ``(T, cdiv(N_out, 1024))``) adds them in a fixed order
(deterministic, no atomics) and applies the epilogues; or (a config's ``fused_reduce``, not with
SwiGLU) the last split's program of each column block, found by a counter, adds them in the same
order and applies them (:func:`reduce_if_last`: one launch fewer, the same bits). The counters
belong to the caller (``counters``: int32 zeros, left at zero by every launch).

Fusions. SwiGLU: a program owns gate rows j..j+BN and up rows I+j..I+j+BN of the fused [gate; up]
weight, computes both accumulators with the same code and tiles as the plain kernel (the same
per-row accumulation order), rounds each to the output dtype as the plain store would, and applies
:func:`silu_mul_f32`; with split-K the partial kernel is the plain one and the epilogue runs in the
reduce. Residual epilogue: ``round(y + r)`` as add.py. Hence the fused forms are bit-identical to
the chain of per-op kernels.

Programmatic dependent launch (``PDL``): the kernel lets the next one launch at its start (a
config's ``late_launch``: after its K loop) and issues its first weight chunk's load before the
grid dependency wait; the activations come after it. Under the interpreter every dot operand is
cast to float32 (``DOT_F32``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from tileinfer.backends.triton.device_functions import (add_residual, dot_chunk, int8_to, launch_dependents_then_wait,
                                                        round_to, silu_mul_f32)
from tileinfer.backends.triton.linear_layout import in_fragment_order
from tileinfer.backends.triton.linear_tiles import INT8_CONVERTS, GemvConfig
from tileinfer.backends.triton.pdl import launch_options

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
def _accumulate(acc, w, x, USE_DOT: tl.constexpr, DOT_F32: tl.constexpr, INT8: tl.constexpr, BITS: tl.constexpr,
                FRAG: tl.constexpr = False):
    """A chunk's products added to ``acc``: tl.dot (:func:`dot_chunk`), or on CUDA cores (T = 1;
    int8: each thread's 16 contiguous products summed first). FRAG: ``w`` in the ``fragments``
    layout, ``x`` put in its order."""
    if FRAG:
        x = in_fragment_order(x, w.shape[1])
    if USE_DOT:
        acc = dot_chunk(x, w, acc, DOT_F32, INT8, BITS, False)
    elif INT8:
        prod = int8_to(w, tl.float32, BITS) * x.to(tl.float32)[None, :]
        acc = acc + tl.sum(tl.reshape(prod, (prod.shape[0], prod.shape[1] // 16, 16)), axis=2)
    else:
        acc = acc + w.to(tl.float32) * x.to(tl.float32)[None, :]
    return acc


@triton.jit
def gemv_rows(
    x_ptr, w_ptr, s_ptr, rows, T, K, kb_lo, kb_hi, stride_xt, stride_wn,
    BLOCK_T: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, USE_DOT: tl.constexpr,
    DOT_F32: tl.constexpr, EVEN_K: tl.constexpr, PDL: tl.constexpr, INT8: tl.constexpr, BITS: tl.constexpr,
    FRAG: tl.constexpr = False,
):
    """float32 sums of x[t, k] * w[rows, k] over the K chunks [kb_lo, kb_hi) (never empty), times
    the row scales ``s[rows]`` where INT8: [BLOCK_T, BLOCK_N] (tl.dot path) or [BLOCK_N] (T = 1
    path). ``rows`` must be valid row indices (no row mask). FRAG: int8 weights in the ``fragments``
    layout. The first chunk is peeled: its weight load is issued before the grid dependency wait
    (``PDL``), so it overlaps the tail of the kernel before; the activations, which that kernel may
    have written, are read after it. The order of the sums is the same either way."""
    offs_k = tl.arange(0, BLOCK_K)
    offs_t = tl.arange(0, BLOCK_T)
    t_mask = offs_t < T
    w_ptrs = w_ptr + rows.to(tl.int64)[:, None] * stride_wn + offs_k[None, :]
    if USE_DOT:
        x_ptrs = x_ptr + offs_t.to(tl.int64)[:, None] * stride_xt + offs_k[None, :]
        acc = tl.zeros((BLOCK_T, BLOCK_N), dtype=tl.float32)
    else:
        x_ptrs = x_ptr + offs_k
        acc = tl.zeros((BLOCK_N, BLOCK_K // 16 if INT8 else BLOCK_K), dtype=tl.float32)
    k0 = kb_lo * BLOCK_K
    w = _load_w(w_ptrs, k0, offs_k, K, EVEN_K)
    if PDL:
        gdc_wait()
    x = _load_x(x_ptrs, k0, offs_k, K, t_mask, USE_DOT, EVEN_K)
    acc = _accumulate(acc, w, x, USE_DOT, DOT_F32, INT8, BITS, FRAG)
    for kb in range(kb_lo + 1, kb_hi):
        k0 = kb * BLOCK_K
        w = _load_w(w_ptrs, k0, offs_k, K, EVEN_K)
        x = _load_x(x_ptrs, k0, offs_k, K, t_mask, USE_DOT, EVEN_K)
        acc = _accumulate(acc, w, x, USE_DOT, DOT_F32, INT8, BITS, FRAG)
    if not USE_DOT:
        acc = tl.sum(acc, axis=1)
    if INT8:
        s = tl.load(s_ptr + rows)
        if USE_DOT:
            s = s[None, :]
        acc = acc * s
    return acc


@triton.jit
def _store_gemv(acc, y_ptr, r_ptr, offs_n, pid_k, T, N, stride_ys, stride_yt, stride_rt,
                BLOCK_T: tl.constexpr, USE_DOT: tl.constexpr, RESIDUAL: tl.constexpr):
    """The store of the float32 ``acc`` (``[BLOCK_T, BLOCK_N]`` or ``[BLOCK_N]``) of columns
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
    x_ptr, w_ptr, s_ptr, y_ptr, r_ptr, o_ptr, lock_ptr, T, N, K, I_OFF, kb_per_split,
    stride_xt, stride_wn, stride_ys, stride_yt, stride_rt, stride_ot,
    BLOCK_T: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    USE_DOT: tl.constexpr, SWIGLU: tl.constexpr, DOT_F32: tl.constexpr, EVEN_K: tl.constexpr,
    PDL: tl.constexpr, RESIDUAL: tl.constexpr, FUSED_REDUCE: tl.constexpr, LATE_LAUNCH: tl.constexpr,
    INT8: tl.constexpr, BITS: tl.constexpr, FRAG: tl.constexpr,
):
    """y[t, n] (or split pid_k's float32 partial of it) for the BLOCK_N output columns of this
    program. N = output columns (I when SWIGLU: gate row n, up row I_OFF + n). RESIDUAL: ``r[t,
    n]`` is added to the rounded result (``r`` has the output's shape). FUSED_REDUCE (split-K, no
    SWIGLU): y holds the partials, and the last split's program of each column block writes ``o``
    (``reduce_if_last``). LATE_LAUNCH (with PDL): the next kernel may launch once every program
    finished its K loop. INT8: int8 weights with float32 row scales ``s`` (BITS: the conversion on
    bit patterns; FRAG: in the ``fragments`` layout)."""
    if PDL:
        if not LATE_LAUNCH:
            gdc_launch_dependents()
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    kb_lo = pid_k * kb_per_split
    kb_hi = tl.minimum(kb_lo + kb_per_split, tl.cdiv(K, BLOCK_K))
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rows = offs_n % N  # tail rows re-read a valid row; their results are not stored
    acc = gemv_rows(x_ptr, w_ptr, s_ptr, rows, T, K, kb_lo, kb_hi, stride_xt, stride_wn, BLOCK_T, BLOCK_N, BLOCK_K,
                    USE_DOT, DOT_F32, EVEN_K, PDL, INT8, BITS, FRAG)
    out_ty = y_ptr.dtype.element_ty
    if SWIGLU:
        acc_u = gemv_rows(x_ptr, w_ptr, s_ptr, rows + I_OFF, T, K, kb_lo, kb_hi, stride_xt, stride_wn, BLOCK_T,
                          BLOCK_N, BLOCK_K, USE_DOT, DOT_F32, EVEN_K, PDL, INT8, BITS, FRAG)
        acc = silu_mul_f32(round_to(acc, out_ty), round_to(acc_u, out_ty))
    if PDL:
        if LATE_LAUNCH:
            gdc_launch_dependents()
    _store_gemv(acc, y_ptr, r_ptr, offs_n, pid_k, T, N, stride_ys, stride_yt, stride_rt, BLOCK_T, USE_DOT,
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
    launch_dependents_then_wait(PDL)
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


def gemv_splits(K: int, cfg: GemvConfig) -> tuple[int, int]:
    """``(splits, chunks per split)`` that a launch with ``cfg`` runs over K (no empty split)."""
    k_blocks = triton.cdiv(K, cfg.block_k)
    kb_per_split = triton.cdiv(k_blocks, cfg.split_k)
    return triton.cdiv(k_blocks, kb_per_split), kb_per_split


def fused_reduce_counters(n_w: int, K: int, cfg: GemvConfig, swiglu: bool) -> int:
    """The split-K counters a launch with ``cfg`` on ``n_w`` weight rows uses (0 without the fused
    reduce): one per column block."""
    if not cfg.fused_reduce or swiglu or gemv_splits(K, cfg)[0] == 1:
        return 0
    return triton.cdiv(n_w, cfg.block_n)


def launch_gemv(x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor | None, out: torch.Tensor,
                residual: torch.Tensor | None, cfg: GemvConfig, n_out: int, i_off: int, swiglu: bool, dot_f32: bool,
                pdl: bool, counters: torch.Tensor | None, frag: bool = False) -> None:
    """The GEMV of ``linear`` (T <= 16) on checked arguments: ``_gemv_kernel`` alone, or with split
    K its float32 partials over all weight rows then ``_splitk_reduce_kernel``, which applies the
    epilogues (or, with the config's ``fused_reduce`` and no SwiGLU, the sum in the last split's
    program, counting on ``counters``). ``scale``: the int8 weight's row scales (None: ``w`` in
    x's dtype); ``i_off``: the first up row of a SwiGLU weight (else 0); ``dot_f32``: float32 dot
    operands (the interpreter); ``pdl``: granted; ``frag``: the int8 weight in the ``fragments``
    layout."""
    T, K = x.shape
    n_w = w.shape[0]
    int8 = scale is not None
    assert not int8 or cfg.block_k % 16 == 0, f"int8: block_k must be a multiple of 16 (a 16-byte access), got {cfg}"
    use_dot = T > 1
    split, kb_per_split = gemv_splits(K, cfg)
    has_residual = residual is not None
    r = residual if has_residual else out
    s = scale if int8 else w
    consts = dict(BLOCK_T=GEMV_BLOCK_T if use_dot else 1, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
                  USE_DOT=use_dot, DOT_F32=dot_f32, EVEN_K=K % cfg.block_k == 0, PDL=pdl,
                  LATE_LAUNCH=cfg.late_launch, INT8=int8, BITS=INT8_CONVERTS[cfg.int8_convert],
                  FRAG=frag,
                  num_warps=cfg.num_warps, num_stages=cfg.num_stages, enable_fp_fusion=True, **launch_options(pdl))
    if split == 1:
        grid = (triton.cdiv(n_out, cfg.block_n), 1)
        _gemv_kernel[grid](x, w, s, out, r, out, out, T, n_out, K, i_off, kb_per_split,
                           x.stride(0), w.stride(0), 0, out.stride(0), r.stride(0), out.stride(0),
                           SWIGLU=swiglu, RESIDUAL=has_residual, FUSED_REDUCE=False, **consts)
        return
    # Split-K: the partial kernel is the plain one over all weight rows; the epilogues run in the
    # reduce kernel, or in the last split's program (fused_reduce).
    part = torch.empty((split, T, n_w), dtype=torch.float32, device=x.device)
    grid = (triton.cdiv(n_w, cfg.block_n), split)
    needed = fused_reduce_counters(n_w, K, cfg, swiglu)
    if needed:
        if counters is None:
            counters = torch.zeros(needed, dtype=torch.int32, device=x.device)
        assert counters.dtype == torch.int32 and counters.numel() >= needed and counters.device == x.device, (
            f"the fused reduce needs {needed} int32 counters on {x.device}, got {counters.numel()} {counters.dtype}")
        _gemv_kernel[grid](x, w, s, part, r, out, counters, T, n_w, K, 0, kb_per_split,
                           x.stride(0), w.stride(0), part.stride(0), part.stride(1), r.stride(0), out.stride(0),
                           SWIGLU=False, RESIDUAL=has_residual, FUSED_REDUCE=True, **consts)
        return
    _gemv_kernel[grid](x, w, s, part, part, part, part, T, n_w, K, 0, kb_per_split,
                       x.stride(0), w.stride(0), part.stride(0), part.stride(1), 0, 0,
                       SWIGLU=False, RESIDUAL=False, FUSED_REDUCE=False, **consts)
    grid = (T, triton.cdiv(n_out, REDUCE_BLOCK))
    _splitk_reduce_kernel[grid](part, out, r, n_out, i_off, part.stride(0), part.stride(1), out.stride(0),
                                r.stride(0), SPLIT_K=split, BLOCK=REDUCE_BLOCK, SWIGLU=swiglu, PDL=pdl,
                                RESIDUAL=has_residual, num_warps=4, enable_fp_fusion=True, **launch_options(pdl))


__all__ = ["GEMV_BLOCK_T", "REDUCE_BLOCK", "fused_reduce_counters", "gemv_rows", "gemv_splits", "launch_gemv",
           "reduce_if_last"]
