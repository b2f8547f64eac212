"""The W8A16 GEMV of :func:`linear_int8.linear_int8` (T <= 16 tokens: decode, speculative verify):
int8 weights with one float32 scale per output row, activations in the model dtype;
linear_int8.py checks the arguments and picks this path or the GEMM (linear_int8_gemm.py).

Tiling and grid: those of the BF16 GEMV (linear_gemv.py), on int8 weight tiles of the same bytes.
A program owns BLOCK_N weight rows and streams a range of K in BLOCK_K chunks, each thread loading
16 contiguous bytes of a row per access: 16 int8 weights where the BF16 GEMV loads 8, so BLOCK_K is
twice BF16's for the same bytes in flight (T = 1: 4 x 1,024 int8 = 4 KB a step, the BF16 tile's 4
x 512 x 2 bytes). Weights ``evict_first`` (read once per step), activations ``evict_last``. Grid
``(cdiv(N, BLOCK_N), SPLIT_K)``. Every weight tile is read once for all token rows: T = 1
multiplies on CUDA cores and adds each thread's 16 contiguous products in registers into a
``[BLOCK_N, BLOCK_K / 16]`` float32 tile, summed over K after the loop (a full-width tile took
120 registers a thread at the T = 1 tiles, this one under 72, the BF16 GEMV's count:
tests/backends/triton/test_linear_int8_compile.py); T = 2..16 converts the tile to the activation
dtype and runs ``tl.dot`` with the token rows padded to 16. The int8 -> float conversion is exact
and done in registers with integer and floating-point adds on the bit patterns (:func:`int8_to`:
``2^23 + 128 + q`` read as a float32, minus ``2^23 + 128``), not the I2F conversion (16 results
per clock and SM on sm_90 by the CUDA programming guide's throughput table, fewer than the weights
a memory-bound GEMV streams); ``bit_convert=False`` uses Triton's plain cast (the
benchmark's comparison). The float32 accumulator is multiplied by the row scales in the epilogue.
Layers whose grid would leave SMs idle (o_proj, down: N = hidden) split K across SPLIT_K programs
(``gemv_split_k``, the BF16 rule) writing scaled float32 partials ``[SPLIT_K, T, N]``, which the
BF16 GEMV's reduce kernel adds in a fixed order and finishes with the epilogues.

Fusions, as the BF16 GEMV: SwiGLU (gate rows j.., up rows I + j.. of the fused weight and scales,
each scaled and rounded to the output dtype, then :func:`silu_mul_f32`), the RMSNorm prologue
(``NORM``, the BF16 GEMV's device functions) and the residual add (``round(y + r)``); float32
logits store the scaled accumulator. PDL: the first weight chunk is loaded before the grid
dependency wait. Under the interpreter every dot operand is float32 (``DOT_F32``).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from tileinfer.backends.triton.device_functions import round_to, silu_mul_f32
from tileinfer.backends.triton.interpreter import DEFAULT_NUM_SMS
from tileinfer.backends.triton.linear_gemv import (
    GEMV_BLOCK_T,
    gemv_program,
    gemv_rows,
    gemv_tiles,
    launch_gemv_kernel,
    launch_late,
    reduce_if_last,
    store_gemv,
)


@dataclass(frozen=True)
class Int8GemvConfig:
    block_n: int
    block_k: int
    split_k: int
    num_warps: int
    num_stages: int
    bit_convert: bool = True  # int8 -> float by bit patterns (False: Triton's cast)
    fused_reduce: bool = False  # split-K: the last split's program adds the partials (no reduce kernel)
    late_launch: bool = False  # with PDL: the next kernel may launch after the K loop, not at the start


@functools.lru_cache(maxsize=None)
def gemv_int8_config(N: int, K: int, T: int, sms: int = DEFAULT_NUM_SMS) -> Int8GemvConfig:
    """Tiles of the W8A16 GEMV; ``N`` = weight rows (2I for the fused SwiGLU weight), ``T`` <= 16.

    Rule (measured on an H200 over the Qwen3-0.6B / 4B layers, every weight out of L2, against
    ~15 alternatives per layer: bench/kernels/linear_int8.py --sweep):

    - T = 1: BLOCK_N = 4, BLOCK_K = 512 int8 columns, 2 warps, 1 stage (8 rows for an lm_head:
      98 % of the copy bandwidth at Qwen3-4B's); layers with fewer than 8 programs of 4 rows per
      SM (o_proj, down, Qwen3-0.6B's qkv) BLOCK_K = 2,048 and 4 warps. Tiles of 1,024 / 2,048
      columns (the BF16 tiles' bytes) are 11-33 % slower on qkv, gate_up and the lm_head. Records:
      bench/results/NVIDIA-H200/tiles_df4a228/.
    - T = 2..16 (tl.dot, M padded to 16): BLOCK_N = 32 (64 for an lm_head), BLOCK_K = 128,
      4 warps, 4 stages, SPLIT_K by ``gemv_split_k`` (linear_gemv.py ``verify_tiles``).
    - BLOCK_K shrinks to next_pow2(K) for small K (never below 16).
    """
    return Int8GemvConfig(*gemv_tiles(N, K, T, sms, int8=True))


@triton.jit
def int8_to(q, DTYPE: tl.constexpr, BITS: tl.constexpr):
    """The int8 tile ``q`` as exact ``DTYPE`` values (float16 / bfloat16 / float32).

    ``BITS``: on the bit patterns, with no conversion instruction. float32: ``0x4B000080 + q``
    (sign-extended) is the float ``2^23 + 128 + q``, minus ``2^23 + 128`` gives q exactly. float16:
    ``0x6480 + q`` is ``1152 + q`` (the float16 unit at 1024 is 1), minus 1152. bfloat16: the top
    half of q's float32 pattern (q has at most 8 significant bits, the low half is zero)."""
    if BITS:
        if DTYPE == tl.float16:
            v = (q.to(tl.int16) + 0x6480).to(tl.float16, bitcast=True) - 1152.0
        else:
            v = (q.to(tl.int32) + 0x4B000080).to(tl.float32, bitcast=True) - 8388736.0
            if DTYPE == tl.bfloat16:
                v = (v.to(tl.int32, bitcast=True) >> 16).to(tl.int16).to(tl.bfloat16, bitcast=True)
    else:
        v = q.to(DTYPE)
    return v


@triton.jit
def _accumulate_int8(acc, w, x, USE_DOT: tl.constexpr, DOT_F32: tl.constexpr, BITS: tl.constexpr):
    if USE_DOT:
        if DOT_F32:
            x = x.to(tl.float32)
        acc = tl.dot(x, tl.trans(int8_to(w, x.dtype, BITS)), acc, input_precision="ieee")
    else:
        prod = int8_to(w, tl.float32, BITS) * x.to(tl.float32)[None, :]
        acc = acc + tl.sum(tl.reshape(prod, (prod.shape[0], prod.shape[1] // 16, 16)), axis=2)
    return acc


@triton.jit
def _scaled(acc, s_ptr, rows, USE_DOT: tl.constexpr):
    """The accumulator times the float32 scales of ``rows`` (one per output column)."""
    s = tl.load(s_ptr + rows)
    if USE_DOT:
        s = s[None, :]
    return acc * s


@triton.jit
def _gemv_int8_kernel(
    x_ptr, w_ptr, s_ptr, y_ptr, nw_ptr, r_ptr, o_ptr, lock_ptr, T, N, K, I_OFF, kb_per_split, eps,
    stride_xt, stride_wn, stride_ys, stride_yt, stride_rt, stride_ot,
    BLOCK_T: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    USE_DOT: tl.constexpr, SWIGLU: tl.constexpr, DOT_F32: tl.constexpr, EVEN_K: tl.constexpr,
    PDL: tl.constexpr, NORM: tl.constexpr, NORM_K: tl.constexpr, NORM_HALF: tl.constexpr,
    RESIDUAL: tl.constexpr, BITS: tl.constexpr, FUSED_REDUCE: tl.constexpr, LATE_LAUNCH: tl.constexpr,
):
    """y[t, n] = round(acc * scale[n]) (or split pid_k's scaled float32 partial) for the BLOCK_N
    output columns of this program; N = output columns (I when SWIGLU: gate row n, up row I_OFF +
    n). NORM: x is RMS-normalized first; RESIDUAL: ``r[t, n]`` is added to the rounded result."""
    pid_k, kb_lo, kb_hi, offs_n, rows = gemv_program(K, N, kb_per_split, BLOCK_N, BLOCK_K, PDL, LATE_LAUNCH)
    acc = gemv_rows(x_ptr, w_ptr, nw_ptr, rows, T, K, kb_lo, kb_hi, stride_xt, stride_wn, eps, BLOCK_T, BLOCK_N,
                    BLOCK_K, USE_DOT, DOT_F32, EVEN_K, PDL, NORM, NORM_K, NORM_HALF, _accumulate_int8, BLOCK_K // 16,
                    BITS)
    acc = _scaled(acc, s_ptr, rows, USE_DOT)
    out_ty = y_ptr.dtype.element_ty
    if SWIGLU:
        acc_u = gemv_rows(x_ptr, w_ptr, nw_ptr, rows + I_OFF, T, K, kb_lo, kb_hi, stride_xt, stride_wn, eps,
                          BLOCK_T, BLOCK_N, BLOCK_K, USE_DOT, DOT_F32, EVEN_K, PDL, NORM, NORM_K, NORM_HALF,
                          _accumulate_int8, BLOCK_K // 16, BITS)
        acc_u = _scaled(acc_u, s_ptr, rows + I_OFF, USE_DOT)
        acc = silu_mul_f32(round_to(acc, out_ty), round_to(acc_u, out_ty))
    launch_late(PDL, LATE_LAUNCH)
    store_gemv(acc, y_ptr, r_ptr, offs_n, pid_k, T, N, stride_ys, stride_yt, stride_rt, BLOCK_T, USE_DOT,
               RESIDUAL and not FUSED_REDUCE)
    if FUSED_REDUCE:
        reduce_if_last(y_ptr, o_ptr, r_ptr, lock_ptr, offs_n, T, N, stride_ys, stride_yt, stride_ot, stride_rt,
                       BLOCK_T, USE_DOT, RESIDUAL)


def launch_gemv_int8(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, out: torch.Tensor,
                     norm_weight: torch.Tensor | None, eps: float, residual: torch.Tensor | None,
                     cfg: Int8GemvConfig, n_out: int, i_off: int, swiglu: bool, dot_f32: bool, pdl: bool) -> None:
    """The GEMV of ``linear_int8`` (T <= 16) on checked arguments: ``_gemv_int8_kernel`` alone, or
    with split K its scaled float32 partials over all weight rows (the prologue included) then the
    BF16 GEMV's ``_splitk_reduce_kernel``, which applies the epilogues, or (``fused_reduce``) the
    sum of the partials by the last split's program (:func:`linear_gemv.reduce_if_last`)."""
    assert cfg.block_k % 16 == 0, f"block_k must be a multiple of 16 (a thread's 16-byte access), got {cfg.block_k}"
    launch_gemv_kernel(_gemv_int8_kernel, x, (q, scale), x, out, norm_weight, eps, residual, cfg, n_out, i_off, swiglu,
                       dot_f32, pdl, BITS=cfg.bit_convert, LATE_LAUNCH=cfg.late_launch)


__all__ = ["GEMV_BLOCK_T", "Int8GemvConfig", "gemv_int8_config", "int8_to", "launch_gemv_int8"]
