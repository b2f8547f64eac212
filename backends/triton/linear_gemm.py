"""The GEMM of :func:`linear.linear` (T > 16 tokens: prefill) for both weight formats; linear.py
checks the arguments and picks this kernel, the persistent one (linear_gemm_persistent.py) or the
GEMV (linear_gemv.py).

Tiling and grid: the Triton matmul tutorial's BLOCK_M x BLOCK_N x BLOCK_K tiles, 1-D grid
``(cdiv(M, BLOCK_M) * cdiv(N_out, BLOCK_N),)`` with a GROUP_M = 8 L2 swizzle, float32 accumulator,
model-dtype dot operands on the GPU (float32 ones under the interpreter, ``DOT_F32``; float32 data
with ``input_precision="ieee"``). The tile is a rule (``gemm_config`` of linear_tiles.py, from the
weight's shape, its format and T), not run-time autotuning. Int8 weights (``INT8``): each K step
converts the int8 weight tile in registers to the activation dtype (exact: :func:`int8_to`) before
``tl.dot``, and the per-output-row float32 scales multiply the accumulator before the epilogues
(``SCALED``: also a model-dtype weight with row scales, the int8 weight's values written out by
int8_dequant.py: the W8A16 arithmetic on the model-dtype path's tiles).
The converted tile reaches the tensor cores through registers rather than staged by the copy
engine like the model-dtype operands, so ``swap_ab`` computes the tile transposed (``w x^T``): the
converted weight is then the dot's first operand, which Hopper's tensor cores read from registers,
while x is staged in shared memory by the pipeliner. ``FRAG``: the int8 weight in the ``fragments``
layout (linear_layout.py), each tile put back in column order after its load: the same sums.

Fusions. SwiGLU: the program of output tile (m, n) computes the gate tile at weight rows n and the
up tile at rows I + n in the same K loop with the same code, rounds each to the output dtype as the
plain store would and applies :func:`silu_mul_f32`; the residual epilogue is ``round(y + r)`` as
add.py. Hence bit-identical to the per-op chain where the gate and up tiles are the plain kernel's
tiles (``I`` a multiple of BLOCK_N, as the rule gives for the Qwen3 shapes).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from tileinfer.backends.triton.device_functions import dot_chunk, load_chunk, round_to, silu_mul_f32, store_tile
from tileinfer.backends.triton.linear_layout import rows_of_fragments
from tileinfer.backends.triton.linear_tiles import INT8_CONVERTS, GemmConfig


@triton.jit
def _weights(ptrs, k0, offs_k, K, EVEN_K: tl.constexpr, BLOCK_K: tl.constexpr, FRAG: tl.constexpr):
    """A weight chunk in column order (FRAG: loaded as stored in the ``fragments`` layout)."""
    b = load_chunk(ptrs, k0, offs_k, K, EVEN_K)
    if FRAG:
        b = rows_of_fragments(b, BLOCK_K)
    return b


@triton.jit
def _gemm_kernel(
    x_ptr, w_ptr, s_ptr, y_ptr, r_ptr, M, N, K, I_OFF, stride_xm, stride_wn, stride_ym, stride_rm,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    SWIGLU: tl.constexpr, DOT_F32: tl.constexpr, EVEN_K: tl.constexpr, RESIDUAL: tl.constexpr,
    INT8: tl.constexpr, BITS: tl.constexpr, SWAP_AB: tl.constexpr, FRAG: tl.constexpr, SCALED: tl.constexpr,
):
    """One BLOCK_M x BLOCK_N tile of y = x w^T (SCALED: ``(x w^T) * scale``, w int8 where INT8; N =
    output columns, I when SWIGLU, whose program also computes the matching up tile at weight rows
    I_OFF + n); RESIDUAL adds ``r`` (y's shape) to the rounded tile. SWAP_AB: the tile is computed transposed."""
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_pid_in_group = GROUP_M * num_pid_n
    first_pid_m = (pid // num_pid_in_group) * GROUP_M
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
    if SWAP_AB:
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_u = acc
    for kb in range(0, tl.cdiv(K, BLOCK_K)):
        k0 = kb * BLOCK_K
        a = load_chunk(a_ptrs, k0, offs_k, K, EVEN_K)
        acc = dot_chunk(a, _weights(b_ptrs, k0, offs_k, K, EVEN_K, BLOCK_K, FRAG), acc, DOT_F32, INT8, BITS, SWAP_AB)
        if SWIGLU:
            acc_u = dot_chunk(a, _weights(u_ptrs, k0, offs_k, K, EVEN_K, BLOCK_K, FRAG), acc_u, DOT_F32, INT8, BITS,
                              SWAP_AB)
    if SWAP_AB:
        acc = tl.trans(acc)
        if SWIGLU:
            acc_u = tl.trans(acc_u)
    if SCALED:
        acc = acc * tl.load(s_ptr + rows_n)[None, :]
        if SWIGLU:
            acc_u = acc_u * tl.load(s_ptr + rows_n + I_OFF)[None, :]
    out_ty = y_ptr.dtype.element_ty
    if SWIGLU:
        acc = silu_mul_f32(round_to(acc, out_ty), round_to(acc_u, out_ty))
    store_tile(acc, y_ptr, r_ptr, offs_m, offs_n, M, N, stride_ym, stride_rm, RESIDUAL)


class KernelLaunch(NamedTuple):
    """One launch as the launcher passes it, ``kernel[grid](*args, **kwargs)``: run by calling it,
    compiled for sm_90 with the launch's own specialization by bench/sm90_build.py (on any machine:
    ``meta`` tensors give the same arguments)."""

    kernel: object
    grid: tuple[int, ...]
    args: tuple
    kwargs: dict

    def __call__(self) -> None:
        self.kernel[self.grid](*self.args, **self.kwargs)


def gemm_launch(x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor | None, out: torch.Tensor,
                residual: torch.Tensor | None, cfg: GemmConfig, n_out: int, i_off: int, swiglu: bool,
                dot_f32: bool, frag: bool = False) -> KernelLaunch:
    """The GEMM of ``linear`` (T > 16) on checked arguments: the launch of ``_gemm_kernel`` with the
    non-persistent ``cfg``. ``scale``: the row scales of an int8 ``w``, or of one in x's dtype (None:
    ``w`` in x's dtype, unscaled); ``i_off``: the first up row of a SwiGLU weight (else 0); ``dot_f32``:
    float32 dot operands (the interpreter); ``frag``: the int8 weight in the ``fragments`` layout."""
    assert not cfg.persistent, f"the persistent kernel launches through linear_gemm_persistent.py: {cfg}"
    M, K = x.shape
    r = residual if residual is not None else out
    grid = (triton.cdiv(M, cfg.block_m) * triton.cdiv(n_out, cfg.block_n),)
    args = (x, w, w if scale is None else scale, out, r, M, n_out, K, i_off, x.stride(0), w.stride(0), out.stride(0),
            r.stride(0))
    return KernelLaunch(_gemm_kernel, grid, args, dict(
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m, SWIGLU=swiglu,
        DOT_F32=dot_f32, EVEN_K=K % cfg.block_k == 0, RESIDUAL=residual is not None, INT8=w.dtype == torch.int8,
        BITS=INT8_CONVERTS[cfg.int8_convert], SWAP_AB=cfg.swap_ab, FRAG=frag, SCALED=scale is not None,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages, enable_fp_fusion=True))


def launch_gemm(x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor | None, out: torch.Tensor,
                residual: torch.Tensor | None, cfg: GemmConfig, n_out: int, i_off: int, swiglu: bool,
                dot_f32: bool, frag: bool = False) -> None:
    """Runs :func:`gemm_launch`'s launch."""
    gemm_launch(x, w, scale, out, residual, cfg, n_out, i_off, swiglu, dot_f32, frag)()


__all__ = ["KernelLaunch", "gemm_launch", "launch_gemm"]
