"""y = x W^T as a GEMV (T <= 16 tokens: decode, speculative verify) or a GEMM (prefill), with the
SwiGLU and float32-logits epilogues; twin: ``reference.linear.linear`` (+ ``silu_mul``).

Tiling and grid. GEMV (``_gemv_kernel``): a program owns BLOCK_N weight rows and streams a range of
K in BLOCK_K chunks; every thread loads 16 contiguous bytes of a row per access (weights
``evict_first``: they are read once per step; activations ``evict_last``). Grid
``(cdiv(N, BLOCK_N), SPLIT_K)``. For T = 1 the multiply runs on CUDA cores into a
``[BLOCK_N, BLOCK_K]`` float32 register tile (FMAs), summed over K once after the loop. For T = 2..16
it is ``tl.dot`` with the token rows padded to BLOCK_T = 16 (``acc[16, BLOCK_N] += x[16, BK] @
w[BN, BK]^T``): at T = 16 CUDA cores would need ~69 TFLOP/s of fp32 FMAs to keep up with 4.25 TB/s of
bf16 weights, more than the H200's ~67 TFLOP/s peak, while the tensor cores make the math free for
any T <= 16, and one compiled kernel (T a run-time argument, masked rows) serves every T in 2..16.
Layers whose grid would leave SMs idle (at T >= 2: o_proj and down, N = hidden) split K across
SPLIT_K programs writing float32 partials ``[SPLIT_K, T, N]``; ``_splitk_reduce_kernel`` (grid
``(T, cdiv(N_out, 1024))``) adds them in a fixed order (deterministic, no atomics) and applies the
epilogue. GEMM (``_gemm_kernel``): the
Triton matmul tutorial's BLOCK_M x BLOCK_N x BLOCK_K tiles, 1-D grid with a GROUP_M = 8 L2 swizzle,
float32 accumulator, model-dtype operands on the GPU. Configs are rules, not run-time autotuning
(``gemv_config``, ``gemm_config``), chosen from the weight's shape, so the fused and unfused calls
use the same tiles. Epilogues: the accumulator is rounded to the output dtype at the store (float32
output: stored as is). SwiGLU: a program owns gate rows j..j+BN and up rows I+j..I+j+BN of the fused
[gate; up] weight, computes both accumulators with the same code and tiles as the unfused kernel
(the same per-row accumulation order), rounds each to the output dtype as the unfused store would,
and applies ``swiglu._silu_mul``; with split-K the partial kernel is the unfused one and the
epilogue runs in the reduce. Hence ``linear(x, w, epilogue="swiglu")`` is bit-identical to
``silu_mul(linear(x, w))``. Under the interpreter (no GPU) every tile is cast to float32 after
``tl.load`` (it computes bf16 dots and elementwise ops wrongly); on the GPU dot operands stay in the
model dtype, and float32 dots use ``input_precision="ieee"``.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from tileinfer.backends.triton.norm import (
    _add_round,
    _load_row_halves,
    _rstd_halves,
    _scale_normalized,
    add,
    norm_launch_config,
    rms_norm,
)
from tileinfer.backends.triton.pdl import launch_options, use_pdl
from tileinfer.backends.triton.pdl import pdl_supported as pdl_supported  # re-exported for existing callers
from tileinfer.backends.triton.swiglu import _silu_mul, silu_mul

GEMV_MAX_TOKENS = 16  # T <= 16: GEMV path; T > 16: GEMM path
GEMV_BLOCK_T = 16  # token rows of the GEMV's tl.dot (T = 2..16 padded to 16)
DEFAULT_NUM_SMS = 132  # H200; used when no GPU is visible (interpreter) so configs stay deterministic
REDUCE_BLOCK = 1024
EPILOGUES = ("none", "swiglu")


@dataclass(frozen=True)
class GemvConfig:
    block_n: int
    block_k: int
    split_k: int
    num_warps: int
    num_stages: int


@dataclass(frozen=True)
class GemmConfig:
    block_m: int
    block_n: int
    block_k: int
    group_m: int
    num_warps: int
    num_stages: int


def _next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


@functools.lru_cache(maxsize=None)
def num_sms(device_index: int | None = None) -> int:
    if torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET", "0") != "1":
        return torch.cuda.get_device_properties(device_index or 0).multi_processor_count
    return DEFAULT_NUM_SMS


@functools.lru_cache(maxsize=None)
def gemv_config(N: int, K: int, T: int, sms: int = DEFAULT_NUM_SMS) -> GemvConfig:
    """Tiles for the GEMV path; ``N`` = weight rows (2I for the fused SwiGLU weight), ``T`` <= 16.

    Rule (measured on an H200 over the Qwen3-0.6B / 4B layers with CUDA graphs, against ~25
    alternatives per class; each choice within ~5 % of the best tile on the geometric mean):

    - T = 1 (CUDA cores): BLOCK_N = 4, BLOCK_K = 512, 2 warps, 1 stage. Each thread keeps four
      16-byte loads in flight per step; small programs (4 KB per step, ~40 registers) give every
      layer >= 256 programs and up to 32 resident per SM, which hides DRAM latency better than
      bigger tiles or split-K did. Layers with fewer than 16 such programs per SM (Qwen3-4B's
      qkv, o_proj, down) take BLOCK_K = 1,024 and 4 warps: the same bytes in flight per thread,
      twice as many threads per SM. Measured over a whole Qwen3-4B step's linears in one graph,
      with PDL: 2.17 ms against 2.29 ms (bench/NOTES.md).
    - T = 2..16 (tl.dot, M padded to 16): BLOCK_N = 32, BLOCK_K = 128, 4 warps, 4 stages (the
      pipeliner keeps 3 steps of cp.async loads in flight).
    - BLOCK_K shrinks to next_pow2(K) for small K (never below 16).
    - SPLIT_K (``gemv_split_k``): only when the grid would leave a quarter of the SMs idle.
    """
    assert N >= 1 and K >= 1 and 1 <= T <= GEMV_MAX_TOKENS
    if T == 1:
        block_n, block_k, warps, stages = 4, 512, 2, 1
        if triton.cdiv(N, block_n) < 16 * sms:
            block_k, warps = 1024, 4
    else:
        block_n, block_k, warps, stages = 32, 128, 4, 4
    block_k = min(block_k, max(16, _next_pow2(K)))
    return GemvConfig(block_n, block_k, gemv_split_k(N, K, block_n, block_k, sms), warps, stages)


def gemv_split_k(N: int, K: int, block_n: int, block_k: int, sms: int = DEFAULT_NUM_SMS) -> int:
    """SPLIT_K for the given tiles: 1 when the grid has at least 3/4 as many programs as SMs (the
    reduce kernel costs ~2 us, more than the tail it would save); else doubled while the grid has
    fewer than 4 programs per SM and each split keeps at least 2 BLOCK_K chunks, then recomputed
    from the chunks per split (``cdiv``) so that no split is empty."""
    programs = triton.cdiv(N, block_n)
    k_blocks = triton.cdiv(K, block_k)
    if 4 * programs >= 3 * sms:
        return 1
    split = 1
    while programs * split < 4 * sms and k_blocks >= 4 * split:
        split *= 2
    return triton.cdiv(k_blocks, triton.cdiv(k_blocks, split))


# (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages, relative throughput of one tile's MMAs).
# At most 128 x 128 so that the SwiGLU program's two float32 accumulators fit in registers with
# the same tile as the unfused one (2 x 64 registers per thread at 8 warps).
# Relative throughputs measured on an H200 at M = 1024 (Qwen3-4B / 0.6B layers): 128 x 128 beat
# 128 x 64 even at 2 waves against 3 (o_proj: 52 against 59 us).
GEMM_TILES = (
    (128, 128, 64, 8, 3, 1.00),
    (64, 128, 64, 4, 4, 0.70),
    (128, 64, 64, 4, 4, 0.65),
    (64, 64, 64, 4, 4, 0.50),
)


@functools.lru_cache(maxsize=None)
def gemm_config(M: int, N: int, K: int, sms: int = DEFAULT_NUM_SMS) -> GemmConfig:
    """Tile for the GEMM path; ``N`` = weight rows (2I for the fused SwiGLU weight).

    Rule: for each candidate of ``GEMM_TILES``, cost = waves x tile cost, with waves =
    cdiv(tiles, SMs) (one resident tile per SM), tiles = cdiv(M, BM) * cdiv(N, BN) (padded rows
    and columns cost as much as real ones) and tile cost = BM * BN / throughput (K is common to all
    candidates). The cheapest wins; ties go to the earlier (larger) tile. GROUP_M = 8.
    """
    best, best_cost = None, None
    for bm, bn, bk, warps, stages, speed in GEMM_TILES:
        tiles = triton.cdiv(M, bm) * triton.cdiv(N, bn)
        cost = triton.cdiv(tiles, sms) * bm * bn / speed
        if best_cost is None or cost < best_cost:
            best, best_cost = GemmConfig(bm, bn, bk, 8, warps, stages), cost
    return best


# -- kernels ------------------------------------------------------------------------------------


@triton.jit
def _round_to(acc, dtype: tl.constexpr):
    """The float32 value that a store of ``acc`` in ``dtype`` followed by a load would give."""
    return acc.to(dtype).to(tl.float32)


@triton.jit
def _load_w(w_ptrs, k0, offs_k, K, EVEN_K: tl.constexpr):
    # Every helper here returns once, at the end: the compiler would also build the code after a
    # return inside a constexpr branch.
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
    Each row is reduced alone, on the tiles of norm.py's row kernel."""
    if USE_DOT:
        offs_t = tl.arange(0, BLOCK_T)[:, None]
        rstd = tl.full((BLOCK_T, 1), 1.0, tl.float32)
        for t in range(0, T):
            a, b = _load_row_halves(x_ptr + t * stride_xt, NORM_K, NORM_HALF)
            rstd = tl.where(offs_t == t, tl.sum(_rstd_halves(a, b, NORM_K, eps)), rstd)
    else:
        a, b = _load_row_halves(x_ptr, NORM_K, NORM_HALF)
        rstd = tl.sum(_rstd_halves(a, b, NORM_K, eps))
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
    return _scale_normalized(x.to(tl.float32), rstd, w, x.dtype)


@triton.jit
def _gemv_accumulate(acc, w, x, USE_DOT: tl.constexpr, DOT_F32: tl.constexpr):
    if USE_DOT:
        if DOT_F32:
            w = w.to(tl.float32)
            x = x.to(tl.float32)
        acc = tl.dot(x, tl.trans(w), acc, input_precision="ieee")
    else:
        acc = acc + w.to(tl.float32) * x.to(tl.float32)[None, :]
    return acc


@triton.jit
def _gemv_rows(
    x_ptr, w_ptr, nw_ptr, rows, T, K, kb_lo, kb_hi, stride_xt, stride_wn, eps,
    BLOCK_T: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, USE_DOT: tl.constexpr,
    DOT_F32: tl.constexpr, EVEN_K: tl.constexpr, PDL: tl.constexpr, NORM: tl.constexpr,
    NORM_K: tl.constexpr, NORM_HALF: tl.constexpr,
):
    """float32 sums of x[t, k] * w[rows, k] over the K chunks [kb_lo, kb_hi) (never empty):
    [BLOCK_T, BLOCK_N] (tl.dot path) or [BLOCK_N] (T = 1 path). ``rows`` must be valid row
    indices (no row mask). The first chunk is peeled: its weight load is issued before the grid
    dependency wait (``PDL``), so it overlaps the tail of the kernel before; the activations, which
    that kernel may have written, are read after it. The order of the sums is the same either way.
    ``NORM``: x is RMS-normalized on the fly with the weight at ``nw_ptr`` (the prologue)."""
    offs_k = tl.arange(0, BLOCK_K)
    offs_t = tl.arange(0, BLOCK_T)
    t_mask = offs_t < T
    w_ptrs = w_ptr + rows.to(tl.int64)[:, None] * stride_wn + offs_k[None, :]
    if USE_DOT:
        x_ptrs = x_ptr + offs_t.to(tl.int64)[:, None] * stride_xt + offs_k[None, :]
        acc = tl.zeros((BLOCK_T, BLOCK_N), dtype=tl.float32)
    else:
        x_ptrs = x_ptr + offs_k
        acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    k0 = kb_lo * BLOCK_K
    w = _load_w(w_ptrs, k0, offs_k, K, EVEN_K)
    if PDL:
        gdc_wait()
    if NORM:
        rstd = _norm_rstd(x_ptr, T, stride_xt, eps, BLOCK_T, NORM_K, NORM_HALF, USE_DOT)
    x = _load_x(x_ptrs, k0, offs_k, K, t_mask, USE_DOT, EVEN_K)
    if NORM:
        x = _normalize_x(x, nw_ptr, k0, offs_k, K, rstd, USE_DOT, EVEN_K)
    acc = _gemv_accumulate(acc, w, x, USE_DOT, DOT_F32)
    for kb in range(kb_lo + 1, kb_hi):
        k0 = kb * BLOCK_K
        w = _load_w(w_ptrs, k0, offs_k, K, EVEN_K)
        x = _load_x(x_ptrs, k0, offs_k, K, t_mask, USE_DOT, EVEN_K)
        if NORM:
            x = _normalize_x(x, nw_ptr, k0, offs_k, K, rstd, USE_DOT, EVEN_K)
        acc = _gemv_accumulate(acc, w, x, USE_DOT, DOT_F32)
    if not USE_DOT:
        acc = tl.sum(acc, axis=1)
    return acc


@triton.jit
def _add_residual(y, r_ptrs, mask, RESIDUAL: tl.constexpr):
    """The residual epilogue: ``round(y + r)`` (``y`` already in the output dtype), as norm.add."""
    if RESIDUAL:
        r = tl.load(r_ptrs, mask=mask, other=0.0).to(tl.float32)
        y = _add_round(y.to(tl.float32), r, y.dtype)
    return y


@triton.jit
def _gemv_kernel(
    x_ptr, w_ptr, y_ptr, nw_ptr, r_ptr, T, N, K, I_OFF, kb_per_split, eps,
    stride_xt, stride_wn, stride_ys, stride_yt, stride_rt,
    BLOCK_T: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    USE_DOT: tl.constexpr, SWIGLU: tl.constexpr, DOT_F32: tl.constexpr, EVEN_K: tl.constexpr,
    PDL: tl.constexpr, NORM: tl.constexpr, NORM_K: tl.constexpr, NORM_HALF: tl.constexpr,
    RESIDUAL: tl.constexpr,
):
    """y[t, n] (or split pid_k's float32 partial of it) for the BLOCK_N output columns of this
    program. N = output columns (I when SWIGLU: gate row n, up row I_OFF + n). NORM: x is
    RMS-normalized first (weight ``nw_ptr``, ``NORM_K`` = K); RESIDUAL: ``r[t, n]`` is added to the
    rounded result (``r`` has y's shape; never with split-K partials)."""
    if PDL:
        gdc_launch_dependents()
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    kb_lo = pid_k * kb_per_split
    kb_hi = tl.minimum(kb_lo + kb_per_split, tl.cdiv(K, BLOCK_K))
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rows = offs_n % N  # tail rows re-read a valid row; their results are not stored
    acc = _gemv_rows(x_ptr, w_ptr, nw_ptr, rows, T, K, kb_lo, kb_hi, stride_xt, stride_wn, eps,
                     BLOCK_T, BLOCK_N, BLOCK_K, USE_DOT, DOT_F32, EVEN_K, PDL, NORM, NORM_K, NORM_HALF)
    out_ty = y_ptr.dtype.element_ty
    if SWIGLU:
        acc_u = _gemv_rows(x_ptr, w_ptr, nw_ptr, rows + I_OFF, T, K, kb_lo, kb_hi, stride_xt, stride_wn, eps,
                           BLOCK_T, BLOCK_N, BLOCK_K, USE_DOT, DOT_F32, EVEN_K, PDL, NORM, NORM_K, NORM_HALF)
        acc = _silu_mul(_round_to(acc, out_ty), _round_to(acc_u, out_ty))
    y_ptr += pid_k.to(tl.int64) * stride_ys
    n_mask = offs_n < N
    if USE_DOT:
        offs_t = tl.arange(0, BLOCK_T).to(tl.int64)[:, None]
        mask = (offs_t < T) & n_mask[None, :]
        y = _add_residual(acc.to(out_ty), r_ptr + offs_t * stride_rt + offs_n[None, :], mask, RESIDUAL)
        tl.store(y_ptr + offs_t * stride_yt + offs_n[None, :], y, mask=mask)
    else:
        y = _add_residual(acc.to(out_ty), r_ptr + offs_n, n_mask, RESIDUAL)
        tl.store(y_ptr + offs_n, y, mask=n_mask)


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
        acc = _silu_mul(_round_to(acc, out_ty), _round_to(acc_u, out_ty))
    y = _add_residual(acc.to(out_ty), r_ptr + t * stride_rt + offs, mask, RESIDUAL)
    tl.store(y_ptr + t * stride_yt + offs, y, mask=mask)


@triton.jit
def _gemm_kernel(
    x_ptr, w_ptr, y_ptr, r_ptr, M, N, K, I_OFF, stride_xm, stride_wn, stride_ym, stride_rm,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    SWIGLU: tl.constexpr, DOT_F32: tl.constexpr, EVEN_K: tl.constexpr, RESIDUAL: tl.constexpr,
):
    """One BLOCK_M x BLOCK_N tile of y (N = output columns; I when SWIGLU, whose program also
    computes the matching up tile at weight rows I_OFF + n); RESIDUAL adds ``r`` (y's shape) to the
    rounded tile."""
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_pid_in_group = GROUP_M * num_pid_n
    group_id = pid // num_pid_in_group
    first_pid_m = group_id * GROUP_M
    group_size_m = min(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + ((pid % num_pid_in_group) % group_size_m)
    pid_n = (pid % num_pid_in_group) // group_size_m

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    rows_m = (offs_m % M).to(tl.int64)  # tails re-read valid rows; not stored
    rows_n = offs_n % N
    a_ptrs = x_ptr + rows_m[:, None] * stride_xm + offs_k[None, :]
    b_ptrs = w_ptr + rows_n.to(tl.int64)[:, None] * stride_wn + offs_k[None, :]
    u_ptrs = w_ptr + (rows_n + I_OFF).to(tl.int64)[:, None] * stride_wn + offs_k[None, :]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if SWIGLU:
        acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kb in range(0, tl.cdiv(K, BLOCK_K)):
        k0 = kb * BLOCK_K
        if EVEN_K:
            a = tl.load(a_ptrs + k0)
            b = tl.load(b_ptrs + k0)
        else:
            k_mask = offs_k < K - k0
            a = tl.load(a_ptrs + k0, mask=k_mask[None, :], other=0.0)
            b = tl.load(b_ptrs + k0, mask=k_mask[None, :], other=0.0)
        if DOT_F32:
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        acc = tl.dot(a, tl.trans(b), acc, input_precision="ieee")
        if SWIGLU:
            if EVEN_K:
                bu = tl.load(u_ptrs + k0)
            else:
                bu = tl.load(u_ptrs + k0, mask=k_mask[None, :], other=0.0)
            if DOT_F32:
                bu = bu.to(tl.float32)
            acc_u = tl.dot(a, tl.trans(bu), acc_u, input_precision="ieee")
    out_ty = y_ptr.dtype.element_ty
    if SWIGLU:
        acc = _silu_mul(_round_to(acc, out_ty), _round_to(acc_u, out_ty))
    mask = (offs_m < M)[:, None] & (offs_n < N)[None, :]
    r_ptrs = r_ptr + offs_m.to(tl.int64)[:, None] * stride_rm + offs_n[None, :]
    y = _add_residual(acc.to(out_ty), r_ptrs, mask, RESIDUAL)
    tl.store(y_ptr + offs_m.to(tl.int64)[:, None] * stride_ym + offs_n[None, :], y, mask=mask)


# -- launchers ----------------------------------------------------------------------------------


def _dot_f32(x: torch.Tensor) -> bool:
    # The interpreter (CPU tensors, or TRITON_INTERPRET=1) gets float32 dot operands.
    return x.device.type != "cuda" or os.environ.get("TRITON_INTERPRET", "0") == "1"


def _sms(x: torch.Tensor) -> int:
    return num_sms(x.device.index) if x.device.type == "cuda" else DEFAULT_NUM_SMS


def linear(
    x: torch.Tensor,
    w: torch.Tensor,
    *,
    out_dtype: torch.dtype | None = None,
    epilogue: str = "none",
    norm_weight: torch.Tensor | None = None,
    eps: float = 1e-6,
    residual: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    config: GemvConfig | GemmConfig | None = None,
    pdl: bool = False,
) -> torch.Tensor:
    """``y = norm(x) W^T (+ residual)`` with float32 accumulation, an optional RMSNorm prologue and
    SwiGLU / residual epilogues.

    - ``x``: ``[T, K]``, float16 / bfloat16 / float32, unit column stride (any row stride: a row
      slice works). ``w``: ``[N, K]`` row-major contiguous (nn.Linear layout), same dtype as ``x``.
    - ``out_dtype``: ``x.dtype`` (default) or ``torch.float32`` (lm_head logits: the float32
      accumulator is stored directly, never rounded through the model dtype).
    - ``norm_weight`` ``[K]`` (x's dtype): x is RMS-normalized first, ``eps`` inside the root, as
      ``norm.rms_norm`` rounds it. T <= 16: in the GEMV's prologue (each program reduces the whole
      row from L2, then normalizes each chunk as it loads it); T > 16: ``norm.rms_norm`` first.
    - ``epilogue="none"``: returns ``[T, N]``. ``epilogue="swiglu"``: ``w`` is the fused
      ``[gate; up]`` weight (N = 2I rows); returns ``[T, I]`` = ``silu(gate) * up`` of the two
      halves, each rounded to ``out_dtype`` first.
    - ``residual`` ``[T, N or I]`` (x's dtype, unit column stride): returns ``round(y + residual)``
      (``out`` may be ``residual``).
    - Bit for bit :func:`linear_unfused` (the chain ``rms_norm``, ``linear``, ``silu_mul``, ``add``).
    - T <= 16: GEMV kernel (+ split-K reduce kernel for few-row weights); T > 16: GEMM kernel.
      Tiles come from ``gemv_config(N, K, T)`` / ``gemm_config(T, N, K)`` on the weight's shape.
      Launched with floating-point contraction on (pinned: Triton's default until 3.10; the T = 1
      path's multiply-adds are FMAs, 5-8 % faster on the H200), as norm.py's row kernel is, so that
      the prologue's sum of squares contracts alike.
    - ``out``: optional preallocated ``[T, N or I]`` output of ``out_dtype`` with unit column
      stride. ``config``: override of the rule's tiles, for tests and tuning only (pass the same one
      to a fused and an unfused call to keep them bit-identical).
    - ``pdl``: launch with programmatic dependent launch (Hopper and newer, CUDA only; ignored
      elsewhere): the kernel lets the next one start early, and issues its first weight loads
      before waiting for the kernel before it. Same results bit for bit.
    """
    assert epilogue in EPILOGUES, f"unknown epilogue {epilogue!r}; valid: {', '.join(EPILOGUES)}"
    assert x.dim() == 2 and w.dim() == 2, f"x must be [T, K] and w [N, K], got {tuple(x.shape)}, {tuple(w.shape)}"
    T, K = x.shape
    n_w = w.shape[0]
    assert w.shape[1] == K, f"x {tuple(x.shape)} and w {tuple(w.shape)} disagree on K"
    assert x.dtype == w.dtype, f"x is {x.dtype} but w is {w.dtype}"
    assert x.dtype in (torch.float16, torch.bfloat16, torch.float32), f"unsupported dtype {x.dtype}"
    assert x.device == w.device, f"x on {x.device}, w on {w.device}"
    assert x.stride(1) == 1 or K == 1, "x must have unit column stride"
    assert w.is_contiguous(), "w must be row-major contiguous [N, K]"
    out_dtype = out_dtype or x.dtype
    assert out_dtype in (x.dtype, torch.float32), f"out_dtype must be {x.dtype} or float32, got {out_dtype}"
    swiglu = epilogue == "swiglu"
    assert not swiglu or n_w % 2 == 0, f"swiglu needs an even number of weight rows, got {n_w}"
    n_out = n_w // 2 if swiglu else n_w
    i_off = n_out if swiglu else 0
    if norm_weight is not None:
        assert norm_weight.shape == (K,) and norm_weight.dtype == x.dtype and norm_weight.is_contiguous(), (
            f"norm_weight must be ({K},) {x.dtype} contiguous, got {tuple(norm_weight.shape)} {norm_weight.dtype}"
        )
        assert K % 2 == 0, f"the RMSNorm prologue needs an even K, got {K}"
    if residual is not None:
        assert residual.shape == (T, n_out) and residual.dtype == out_dtype == x.dtype, (
            f"residual must be [{T}, {n_out}] {x.dtype}, got {tuple(residual.shape)} {residual.dtype}"
        )
        assert residual.stride(1) == 1 or n_out == 1, "residual must have unit column stride"
    if out is None:
        out = torch.empty((T, n_out), dtype=out_dtype, device=x.device)
    assert out.shape == (T, n_out) and out.dtype == out_dtype and out.device == x.device, (
        f"out must be [{T}, {n_out}] {out_dtype} on {x.device}, got {tuple(out.shape)} {out.dtype}"
    )
    assert out.stride(1) == 1 or n_out == 1, "out must have unit column stride"
    if T == 0 or n_out == 0:
        return out
    assert K > 0, "K must be positive"
    dot_f32 = _dot_f32(x)
    pdl = use_pdl(pdl, x.device)
    if T <= GEMV_MAX_TOKENS:
        cfg = config or gemv_config(n_w, K, T, _sms(x))
        assert isinstance(cfg, GemvConfig), "T <= 16 takes a GemvConfig"
        _launch_gemv(x, w, out, norm_weight, eps, residual, cfg, n_out, i_off, swiglu, dot_f32, pdl)
    else:
        cfg = config or gemm_config(T, n_w, K, _sms(x))
        assert isinstance(cfg, GemmConfig), "T > 16 takes a GemmConfig"
        if norm_weight is not None:
            x = rms_norm(x, norm_weight, eps, pdl=pdl)
        _launch_gemm(x, w, out, residual, cfg, n_out, i_off, swiglu, dot_f32)
    return out


def norm_warps(T: int, N: int, K: int, config: GemvConfig | GemmConfig | None = None,
               sms: int = DEFAULT_NUM_SMS) -> int | None:
    """The ``num_warps`` of the RMSNorm that ``linear(x, w, norm_weight=...)`` applies to ``x`` ``[T,
    K]`` for a weight of ``N`` rows: the GEMV's (its prologue reduces with them), or None (T > 16:
    ``rms_norm``'s own)."""
    if T > GEMV_MAX_TOKENS:
        return None
    return (config or gemv_config(N, K, T, sms)).num_warps


def linear_unfused(
    x: torch.Tensor,
    w: torch.Tensor,
    *,
    out_dtype: torch.dtype | None = None,
    epilogue: str = "none",
    norm_weight: torch.Tensor | None = None,
    eps: float = 1e-6,
    residual: torch.Tensor | None = None,
    config: GemvConfig | GemmConfig | None = None,
    pdl: bool = False,
) -> torch.Tensor:
    """:func:`linear` as the chain of one kernel per op: ``rms_norm`` (launched with the warps of
    the GEMV's prologue, :func:`norm_warps`), ``linear``, ``silu_mul``, ``add``. Same bits; the
    baseline the fused kernel is measured against."""
    T, K = x.shape
    if norm_weight is not None:
        warps = norm_warps(T, w.shape[0], K, config, _sms(x))
        x = rms_norm(x, norm_weight, eps, pdl=pdl, num_warps=warps)
    y = linear(x, w, out_dtype=out_dtype, config=config, pdl=pdl)
    if epilogue == "swiglu":
        y = silu_mul(y, pdl=pdl)
    if residual is not None:
        y = add(y, residual, pdl=pdl)
    return y


def _launch_gemv(x, w, out, norm_weight, eps: float, residual, cfg: GemvConfig, n_out: int, i_off: int,
                 swiglu: bool, dot_f32: bool, pdl: bool) -> None:
    T, K = x.shape
    n_w = w.shape[0]
    use_dot = T > 1
    k_blocks = triton.cdiv(K, cfg.block_k)
    kb_per_split = triton.cdiv(k_blocks, cfg.split_k)
    split = triton.cdiv(k_blocks, kb_per_split)  # no empty split
    norm = norm_weight is not None
    has_residual = residual is not None
    nw = norm_weight if norm else w
    r = residual if has_residual else out
    consts = dict(BLOCK_T=GEMV_BLOCK_T if use_dot else 1, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
                  USE_DOT=use_dot, DOT_F32=dot_f32, EVEN_K=K % cfg.block_k == 0, PDL=pdl,
                  NORM=norm, NORM_K=K if norm else 0, NORM_HALF=norm_launch_config(K, 1)[1] if norm else 1,
                  num_warps=cfg.num_warps, num_stages=cfg.num_stages, enable_fp_fusion=True, **launch_options(pdl))
    if split == 1:
        grid = (triton.cdiv(n_out, cfg.block_n), 1)
        _gemv_kernel[grid](x, w, out, nw, r, T, n_out, K, i_off, kb_per_split, eps,
                           x.stride(0), w.stride(0), 0, out.stride(0), r.stride(0),
                           SWIGLU=swiglu, RESIDUAL=has_residual, **consts)
        return
    # Split-K: the partial kernel is the unfused one over all weight rows (the prologue included);
    # the epilogues run in the reduce.
    part = torch.empty((split, T, n_w), dtype=torch.float32, device=x.device)
    grid = (triton.cdiv(n_w, cfg.block_n), split)
    _gemv_kernel[grid](x, w, part, nw, part, T, n_w, K, 0, kb_per_split, eps,
                       x.stride(0), w.stride(0), part.stride(0), part.stride(1), 0,
                       SWIGLU=False, RESIDUAL=False, **consts)
    grid = (T, triton.cdiv(n_out, REDUCE_BLOCK))
    _splitk_reduce_kernel[grid](part, out, r, n_out, i_off, part.stride(0), part.stride(1), out.stride(0),
                                r.stride(0), SPLIT_K=split, BLOCK=REDUCE_BLOCK, SWIGLU=swiglu, PDL=pdl,
                                RESIDUAL=has_residual, num_warps=4, enable_fp_fusion=True, **launch_options(pdl))


def _launch_gemm(x, w, out, residual, cfg: GemmConfig, n_out: int, i_off: int, swiglu: bool,
                 dot_f32: bool) -> None:
    M, K = x.shape
    r = residual if residual is not None else out
    grid = (triton.cdiv(M, cfg.block_m) * triton.cdiv(n_out, cfg.block_n),)
    _gemm_kernel[grid](x, w, out, r, M, n_out, K, i_off, x.stride(0), w.stride(0), out.stride(0), r.stride(0),
                       BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m,
                       SWIGLU=swiglu, DOT_F32=dot_f32, EVEN_K=K % cfg.block_k == 0,
                       RESIDUAL=residual is not None, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
                       enable_fp_fusion=True)
