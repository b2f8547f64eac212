"""The GEMM of :func:`linear.linear` (T > 16 tokens: prefill); linear.py checks the arguments,
applies the RMSNorm with rms_norm.py's kernel first, and picks this path or the GEMV
(linear_gemv.py).

Tiling and grid: the Triton matmul tutorial's BLOCK_M x BLOCK_N x BLOCK_K tiles, 1-D grid
``(cdiv(M, BLOCK_M) * cdiv(N_out, BLOCK_N),)`` with a GROUP_M = 8 L2 swizzle, float32 accumulator,
model-dtype dot operands on the GPU (float32 ones under the interpreter, ``DOT_F32``; float32 data
with ``input_precision="ieee"``). The tile is a rule (:func:`gemm_config`, from the weight's shape
and T), not run-time autotuning. SwiGLU: the program of output tile (m, n) computes the gate tile
at weight rows n and the up tile at rows I + n with the same code, rounds each to the output dtype
as the plain store would and applies :func:`silu_mul_f32`; the residual epilogue is ``round(y +
r)`` as add.py. Hence bit-identical to the per-op chain where the gate and up tiles are the plain
kernel's tiles (``I`` a multiple of BLOCK_N, as the rule gives for the Qwen3 shapes). A config with
``persistent`` takes the persistent kernel of linear_gemm_persistent.py instead (a grid of one
program per SM looping over the tiles, TMA descriptors, split tails; the same tile code and
epilogue).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from tileinfer.backends.triton.device_functions import add_residual, round_to, silu_mul_f32
from tileinfer.backends.triton.interpreter import DEFAULT_NUM_SMS


@dataclass(frozen=True)
class GemmTiles:
    """Tiles of a GEMM (this one's, :class:`GemmConfig`, and the W8A16 one's, linear_int8_gemm.py).
    The fields after ``num_stages`` select the persistent kernel of linear_gemm_persistent.py
    (``persistent``) and its options: ``tma`` (x and weight tiles through TMA descriptors),
    ``flatten`` (``tl.range``'s, on the tile loop: the next tile's loads may be issued during this
    one's epilogue), ``split_rows`` / ``split_k`` (the last row blocks computed in ranges of K;
    ``split_plan`` is the rule) and ``programs`` (the grid; 0: one per SM)."""

    block_m: int
    block_n: int
    block_k: int
    group_m: int
    num_warps: int
    num_stages: int
    persistent: bool = False
    tma: bool = False
    flatten: bool = False
    split_rows: int = 0
    split_k: int = 1
    programs: int = 0

    def __post_init__(self):
        check_persistent_options(self)


@dataclass(frozen=True)
class GemmConfig(GemmTiles):
    """Tiles of the BF16 GEMM (:class:`GemmTiles`)."""


def check_persistent_options(cfg) -> None:
    """The persistent kernel's options are set only with ``persistent``, and are in range."""
    options = dict(tma=cfg.tma, flatten=cfg.flatten, split_rows=cfg.split_rows, split_k=cfg.split_k != 1,
                   programs=cfg.programs)
    set_without = [k for k, v in options.items() if v and not cfg.persistent]
    assert not set_without, f"{', '.join(set_without)} need persistent=True: {cfg}"
    assert cfg.split_rows >= 0 and cfg.split_k >= 1 and cfg.programs >= 0, f"bad split or programs: {cfg}"
    # the split tail's epilogue branches; Triton 3.6 fails to flatten a loop with an if in it
    assert not (cfg.flatten and cfg.split_rows), f"flatten and split_rows exclude each other: {cfg}"


# (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages, relative throughput of one tile's MMAs).
# At most 128 x 128 so that the SwiGLU program's two float32 accumulators fit in registers with
# the same tile as the plain one (2 x 64 registers per thread at 8 warps).
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
    bm, bn, bk, warps, stages = cheapest_gemm_tile(M, N, GEMM_TILES, sms)
    return GemmConfig(bm, bn, bk, 8, warps, stages)


def cheapest_gemm_tile(M: int, N: int, candidates: tuple, sms: int = DEFAULT_NUM_SMS) -> tuple[int, ...]:
    """The rule of :func:`gemm_config` over ``candidates`` (rows of ``(BM, BN, BK, num_warps,
    num_stages, throughput)``): ``(BM, BN, BK, num_warps, num_stages)`` of the cheapest, ties to
    the earlier."""
    best, best_cost = None, None
    for bm, bn, bk, warps, stages, speed in candidates:
        tiles = triton.cdiv(M, bm) * triton.cdiv(N, bn)
        cost = triton.cdiv(tiles, sms) * bm * bn / speed
        if best_cost is None or cost < best_cost:
            best, best_cost = (bm, bn, bk, warps, stages), cost
    return best


@triton.jit
def gemm_tile(x_ptr, w_ptr, M, N, I_OFF, stride_xm, stride_wn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
              BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    """The program's output tile, GROUP_M-swizzled: ``(offs_m, offs_n, offs_k, rows_n, a_ptrs,
    b_ptrs, u_ptrs)``, its rows and columns, the K offsets of a chunk, the weight rows its columns
    read (tails re-read valid rows; not stored), and the first K chunk's pointers into x, the
    weight's rows and the up rows ``I_OFF + rows_n`` (SwiGLU)."""
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
    return offs_m, offs_n, offs_k, rows_n, a_ptrs, b_ptrs, u_ptrs


@triton.jit
def store_gemm(acc, y_ptr, r_ptr, offs_m, offs_n, M, N, stride_ym, stride_rm, RESIDUAL: tl.constexpr):
    """The GEMM's store of the float32 tile ``acc``: rounded to y's dtype, plus ``r`` where RESIDUAL
    (add.py's rounding)."""
    out_ty = y_ptr.dtype.element_ty
    mask = (offs_m < M)[:, None] & (offs_n < N)[None, :]
    r_ptrs = r_ptr + offs_m.to(tl.int64)[:, None] * stride_rm + offs_n[None, :]
    y = add_residual(acc.to(out_ty), r_ptrs, mask, RESIDUAL)
    tl.store(y_ptr + offs_m.to(tl.int64)[:, None] * stride_ym + offs_n[None, :], y, mask=mask)


@triton.jit
def _gemm_kernel(
    x_ptr, w_ptr, y_ptr, r_ptr, M, N, K, I_OFF, stride_xm, stride_wn, stride_ym, stride_rm,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    SWIGLU: tl.constexpr, DOT_F32: tl.constexpr, EVEN_K: tl.constexpr, RESIDUAL: tl.constexpr,
):
    """One BLOCK_M x BLOCK_N tile of y (N = output columns; I when SWIGLU, whose program also
    computes the matching up tile at weight rows I_OFF + n); RESIDUAL adds ``r`` (y's shape) to the
    rounded tile."""
    offs_m, offs_n, offs_k, rows_n, a_ptrs, b_ptrs, u_ptrs = gemm_tile(x_ptr, w_ptr, M, N, I_OFF, stride_xm, stride_wn,
                                                                       BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M)
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
        acc = silu_mul_f32(round_to(acc, out_ty), round_to(acc_u, out_ty))
    store_gemm(acc, y_ptr, r_ptr, offs_m, offs_n, M, N, stride_ym, stride_rm, RESIDUAL)


def launch_gemm(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor, residual: torch.Tensor | None,
                cfg: GemmConfig, n_out: int, i_off: int, swiglu: bool, dot_f32: bool) -> None:
    """The GEMM of ``linear`` (T > 16) on checked (and already normalized) arguments: one launch
    of ``_gemm_kernel``, or of the persistent kernel (``cfg.persistent``). ``i_off``: the first up
    row of a SwiGLU weight (else 0); ``dot_f32``: float32 dot operands (the interpreter)."""
    if cfg.persistent:
        gemm_persistent.launch_gemm_persistent(x, w, None, out, residual, cfg, n_out, i_off, swiglu, dot_f32)
        return
    M, K = x.shape
    r = residual if residual is not None else out
    grid = (triton.cdiv(M, cfg.block_m) * triton.cdiv(n_out, cfg.block_n),)
    _gemm_kernel[grid](x, w, out, r, M, n_out, K, i_off, x.stride(0), w.stride(0), out.stride(0), r.stride(0),
                       BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m,
                       SWIGLU=swiglu, DOT_F32=dot_f32, EVEN_K=K % cfg.block_k == 0,
                       RESIDUAL=residual is not None, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
                       enable_fp_fusion=True)


# Imported last: the persistent kernel's module takes store_gemm from this one (either may be
# imported first).
from tileinfer.backends.triton import linear_gemm_persistent as gemm_persistent  # noqa: E402

__all__ = ["GEMM_TILES", "GemmConfig", "check_persistent_options", "cheapest_gemm_tile", "gemm_config", "gemm_tile",
           "launch_gemm", "store_gemm"]
