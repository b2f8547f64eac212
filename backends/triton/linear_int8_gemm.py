"""The W8A16 GEMM of :func:`linear_int8.linear_int8` (T > 16 tokens: prefill); linear_int8.py
checks the arguments, applies the RMSNorm with rms_norm.py's kernel first, and picks this path or
the GEMV (linear_int8_gemv.py).

Tiling and grid: the BF16 GEMM's (linear_gemm.py): BLOCK_M x BLOCK_N x BLOCK_K tiles, 1-D grid
``(cdiv(M, BLOCK_M) * cdiv(N_out, BLOCK_N),)`` with a GROUP_M = 8 L2 swizzle, float32 accumulator.
Each K step loads the activation tile (model dtype) and the int8 weight tile, converts the weight
tile in registers to the activation dtype (exact: :func:`int8_to`, on the bit patterns) and runs
``tl.dot``; the per-output-row float32 scales multiply the accumulator in the epilogue, before
the SwiGLU (gate and up tiles of the same program, each scaled and rounded to the output dtype)
and the residual add (``round(y + r)``). Prefill is compute-bound, and the converted tile goes to
the tensor cores through registers rather than staged by the copy engine like the BF16 operands,
so the tiles are a rule of their own (:func:`gemm_int8_config`, ``GEMM_INT8_TILES``): int8 weight
rows of BLOCK_K = 128 bytes for the smaller tiles (a full 128-byte line per row). ``swap_ab``
computes the tile transposed (``q x^T``): the converted weight is then the dot's first operand,
which Hopper's tensor cores read from registers, while x is staged in shared memory by the
pipeliner as in the BF16 GEMM. Under the interpreter the dot operands are float32 (``DOT_F32``).
A config with ``persistent`` takes the persistent kernel of linear_gemm_persistent.py instead (the
BF16 one with ``INT8``: int8 weight tiles staged in shared memory by TMA or cp.async, converted
after the shared-memory load).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from tileinfer.backends.triton.device_functions import round_to, silu_mul_f32
from tileinfer.backends.triton.interpreter import DEFAULT_NUM_SMS
from tileinfer.backends.triton.linear_gemm import (
    GemmTiles,
    cheapest_gemm_tile,
    gemm_persistent,
    gemm_tile,
    store_gemm,
)
from tileinfer.backends.triton.linear_int8_gemv import int8_to


@dataclass(frozen=True)
class Int8GemmConfig(GemmTiles):
    """Tiles of the W8A16 GEMM: :class:`GemmTiles` (linear_gemm.py; the persistent kernel's options
    among them) and the int8 tile's conversion and operand order."""

    bit_convert: bool = True  # int8 -> float by bit patterns (False: Triton's cast)
    swap_ab: bool = False  # the converted weight tile as the dot's first operand (y^T = q x^T)

    def __post_init__(self):
        super().__post_init__()
        # On an H200 (Triton 3.6) the transposed split tail gives wrong sums (the fused and per-op
        # forms differ by up to 1.2 at every Qwen3 shape it splits), where the interpreter agrees
        # with the twin: bench/results/NVIDIA-H200/gpu_tests_0d5e3aa/persistent.log.
        assert not (self.swap_ab and self.split_rows), f"swap_ab and split_rows exclude each other: {self}"


# (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages, relative throughput of one tile's MMAs): the
# BF16 GEMM's candidates, with 128-byte int8 rows for the smaller ones. The throughputs are the
# BF16 ones until bench/kernels/linear_int8.py --sweep measures these on a GPU.
GEMM_INT8_TILES = (
    (128, 128, 64, 8, 3, 1.00),
    (64, 128, 128, 4, 3, 0.70),
    (128, 64, 128, 4, 3, 0.65),
    (64, 64, 128, 4, 3, 0.50),
)


@functools.lru_cache(maxsize=None)
def gemm_int8_config(M: int, N: int, K: int, sms: int = DEFAULT_NUM_SMS) -> Int8GemmConfig:
    """Tile of the W8A16 GEMM; ``N`` = weight rows (2I for the fused SwiGLU weight). The BF16
    rule (linear_gemm.py ``gemm_config``) over ``GEMM_INT8_TILES``: cost = cdiv(tiles, SMs) x BM x
    BN / throughput, the cheapest wins, ties to the earlier tile; BLOCK_K shrinks to next_pow2(K)
    for small K (never below 32). Computed transposed (``swap_ab``): measured on an H200 at the
    Qwen3-4B layers for T = 1,024, 3-23 % faster on every layer with the rule's tile
    (bench/results/NVIDIA-H200/tiles_a1a4273/linear_int8.json; the SwiGLU form was not swept)."""
    bm, bn, bk, warps, stages = cheapest_gemm_tile(M, N, GEMM_INT8_TILES, sms)
    return Int8GemmConfig(bm, bn, min(bk, max(32, triton.next_power_of_2(K))), 8, warps, stages, swap_ab=True)


@triton.jit
def _load_tile(ptrs, k0, offs_k, K, EVEN_K: tl.constexpr):
    if EVEN_K:
        t = tl.load(ptrs + k0)
    else:
        t = tl.load(ptrs + k0, mask=(offs_k < K - k0)[None, :], other=0)
    return t


@triton.jit
def _dot_tile(a, b, acc, SWAP_AB: tl.constexpr):
    """``acc + a b^T`` (``[BM, BN]``), or with SWAP_AB ``acc + b a^T`` (``[BN, BM]``)."""
    if SWAP_AB:
        acc = tl.dot(b, tl.trans(a), acc, input_precision="ieee")
    else:
        acc = tl.dot(a, tl.trans(b), acc, input_precision="ieee")
    return acc


@triton.jit
def _gemm_int8_kernel(
    x_ptr, w_ptr, s_ptr, y_ptr, r_ptr, M, N, K, I_OFF, stride_xm, stride_wn, stride_ym, stride_rm,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    SWIGLU: tl.constexpr, DOT_F32: tl.constexpr, EVEN_K: tl.constexpr, RESIDUAL: tl.constexpr,
    BITS: tl.constexpr, SWAP_AB: tl.constexpr,
):
    """One BLOCK_M x BLOCK_N tile of y = round((x q^T) * scale) (N = output columns; I when SWIGLU,
    whose program also computes the up tile at weight rows I_OFF + n); RESIDUAL adds ``r``.
    SWAP_AB: the tile is computed transposed, ``q x^T``, so that the converted weight tile is the
    dot's first operand (which the tensor cores may read from registers) and x the second."""
    offs_m, offs_n, offs_k, rows_n, a_ptrs, b_ptrs, u_ptrs = gemm_tile(x_ptr, w_ptr, M, N, I_OFF, stride_xm, stride_wn,
                                                                       BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M)
    if SWAP_AB:
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_u = acc
    for kb in range(0, tl.cdiv(K, BLOCK_K)):
        k0 = kb * BLOCK_K
        a = _load_tile(a_ptrs, k0, offs_k, K, EVEN_K)
        if DOT_F32:
            a = a.to(tl.float32)
        b = int8_to(_load_tile(b_ptrs, k0, offs_k, K, EVEN_K), a.dtype, BITS)
        acc = _dot_tile(a, b, acc, SWAP_AB)
        if SWIGLU:
            bu = int8_to(_load_tile(u_ptrs, k0, offs_k, K, EVEN_K), a.dtype, BITS)
            acc_u = _dot_tile(a, bu, acc_u, SWAP_AB)
    if SWAP_AB:
        acc = tl.trans(acc)
        if SWIGLU:
            acc_u = tl.trans(acc_u)
    out_ty = y_ptr.dtype.element_ty
    acc = acc * tl.load(s_ptr + rows_n)[None, :]
    if SWIGLU:
        acc_u = acc_u * tl.load(s_ptr + rows_n + I_OFF)[None, :]
        acc = silu_mul_f32(round_to(acc, out_ty), round_to(acc_u, out_ty))
    store_gemm(acc, y_ptr, r_ptr, offs_m, offs_n, M, N, stride_ym, stride_rm, RESIDUAL)


def launch_gemm_int8(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, out: torch.Tensor,
                     residual: torch.Tensor | None, cfg: Int8GemmConfig, n_out: int, i_off: int, swiglu: bool,
                     dot_f32: bool) -> None:
    """The GEMM of ``linear_int8`` (T > 16) on checked (and already normalized) arguments: one
    launch of ``_gemm_int8_kernel``, or of the persistent kernel (``cfg.persistent``)."""
    if cfg.persistent:
        gemm_persistent.launch_gemm_persistent(x, q, scale, out, residual, cfg, n_out, i_off, swiglu, dot_f32)
        return
    M, K = x.shape
    r = residual if residual is not None else out
    grid = (triton.cdiv(M, cfg.block_m) * triton.cdiv(n_out, cfg.block_n),)
    _gemm_int8_kernel[grid](x, q, scale, out, r, M, n_out, K, i_off, x.stride(0), q.stride(0), out.stride(0),
                            r.stride(0), BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
                            GROUP_M=cfg.group_m, SWIGLU=swiglu, DOT_F32=dot_f32, EVEN_K=K % cfg.block_k == 0,
                            RESIDUAL=residual is not None, BITS=cfg.bit_convert, SWAP_AB=cfg.swap_ab,
                            num_warps=cfg.num_warps,
                            num_stages=cfg.num_stages, enable_fp_fusion=True)


__all__ = ["GEMM_INT8_TILES", "Int8GemmConfig", "gemm_int8_config", "launch_gemm_int8"]
