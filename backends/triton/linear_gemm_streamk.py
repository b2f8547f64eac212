"""The stream-K schedule of the persistent GEMM (linear_gemm_persistent.py), taken where the tile
config says ``stream_k``: for layers whose whole tiles leave SMs idle (Qwen3-4B's o_proj and down at
T = 1,024: 80 tiles of 128 x 256 for 132 SMs). Weights in the model dtype or int8 rows (W8A16,
untransposed: no ``swap_ab``), scaled or not, with the residual and float32-logits epilogues; no
SwiGLU (:func:`streamk_launch` says why).

Tiling and grid. Output tiles of BLOCK_M x BLOCK_N (BLOCK_K steps of K, float32 accumulator) in the
persistent kernel's GROUP_M-swizzled order, over P programs (the SMs, or fewer where the region below
has fewer steps; :func:`streamk_ranges` of linear_tiles.py). Where the tiles make at least two waves,
all but the last ``tiles % P + P`` go round-robin first (tile pid, pid + P, ...), each whole in one
program, as in the persistent kernel; the others (every tile where there are fewer than 2P) are the
stream-K region: its iterations, (tile, BLOCK_K step) pairs in tile order, I = region tiles x K
steps, are cut into P contiguous ranges of q or q + 1 steps (the first ``I mod P`` programs one
more), program p taking the p-th, accumulating each tile's steps of its range in registers with the
persistent kernel's tile code (``_tile_sum``). A tile whose steps all lie in one range goes through
the plain epilogue (``store_tile``: residual, float32 logits). A tile split across programs
p_first..p_last (its first and last steps' programs) has each piece store its float32 partial in the
workspace, at slot ``p + s`` for program p and region tile s (the pieces of one tile in adjacent
slots, no slot shared: p_first(s') >= p_last(s) for s' > s), and count itself on counter ``p_first``
(a range ends inside at most one tile: one counter a program, at 0 between launches); the piece that
arrives last adds the partials in slot order, i.e. in K order, runs the epilogue and resets the
counter (``_split_unit``, the split tail's protocol). No program waits on another. The split points
depend on P and the shape only: the same bits on every run and for every epilogue (not the unsplit
kernel's bits: another float32 grouping of the K sum). The tile loop is not flattened (its body
branches between the two ends).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tileinfer.backends.triton.device_functions import store_tile
from tileinfer.backends.triton.interpreter import sms_of
from tileinfer.backends.triton.linear_gemm import KernelLaunch
from tileinfer.backends.triton.linear_gemm_persistent import _split_unit, _swizzled, _tile_sum, operands
from tileinfer.backends.triton.linear_tiles import INT8_CONVERTS, GemmConfig, streamk_ranges


@triton.jit
def _owner(i, Q, R):
    """The program whose range holds region step ``i`` (the first R ranges of Q + 1 steps, then Q)."""
    return tl.where(i < R * (Q + 1), i // (Q + 1), R + (i - R * (Q + 1)) // Q)


@triton.jit
def _gemm_streamk_kernel(
    x_ptr, w_ptr, s_ptr, y_ptr, r_ptr, p_ptr, c_ptr,
    M, N, K, stride_xm, stride_wn, stride_ym, stride_rm, DP_TILES, NUM_PROGRAMS, Q, R,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    DOT_F32: tl.constexpr, EVEN_K: tl.constexpr, RESIDUAL: tl.constexpr, INT8: tl.constexpr, BITS: tl.constexpr,
    TMA: tl.constexpr, FRAG: tl.constexpr, SCALED: tl.constexpr,
):
    """y = x w^T (W8A16: ``(x q^T) * scale``) on N output columns, RESIDUAL adding ``r``: whole tiles
    [0, DP_TILES) round-robin, then this program's range of the region's steps (Q, R: the ranges'
    sizes); partials ``p`` (float32 ``[slots, BLOCK_M * BLOCK_N]``), counters ``c``. ``x_ptr`` and
    ``w_ptr`` are TMA descriptors with TMA; ``s_ptr`` the float32 row scales (SCALED)."""
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    my_dp = DP_TILES // NUM_PROGRAMS
    start = pid * Q + tl.minimum(pid, R)
    end = start + Q + (pid < R).to(tl.int32)
    s_first = start // k_tiles
    n_iter = my_dp + (end - 1) // k_tiles - s_first + 1
    out_ty = y_ptr.dtype.element_ty
    SLOT: tl.constexpr = BLOCK_M * BLOCK_N
    local = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]  # a slot's elements
    for v in tl.range(0, n_iter):
        is_dp = v < my_dp
        s = s_first + v - my_dp  # the region tile (stream-K iterations)
        kb_lo = tl.where(is_dp, 0, tl.maximum(start - s * k_tiles, 0))
        kb_hi = tl.where(is_dp, k_tiles, tl.minimum(end - s * k_tiles, k_tiles))
        pid_m, pid_n = _swizzled(tl.where(is_dp, pid + v * NUM_PROGRAMS, DP_TILES + s), num_pid_m, num_pid_n,
                                 GROUP_M)
        acc = _tile_sum(x_ptr, w_ptr, M, N, K, pid_m * BLOCK_M, pid_n * BLOCK_N, 0, kb_lo, kb_hi, stride_xm,
                        stride_wn, BLOCK_M, BLOCK_N, BLOCK_K, DOT_F32, EVEN_K, INT8, BITS, False, TMA, FRAG)
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        if SCALED:
            acc = acc * tl.load(s_ptr + offs_n % N)[None, :]
        if (kb_lo == 0) & (kb_hi == k_tiles):
            store_tile(acc, y_ptr, r_ptr, offs_m, offs_n, M, N, stride_ym, stride_rm, RESIDUAL)
        else:
            p_first = _owner(s * k_tiles, Q, R)
            pieces = _owner(s * k_tiles + k_tiles - 1, Q, R) - p_first + 1
            mask = (offs_m < M)[:, None] & (offs_n < N)[None, :]
            p_ptrs = p_ptr + (p_first + s).to(tl.int64) * SLOT + local
            _split_unit(acc, p_ptrs, pid - p_first, pieces, SLOT, c_ptr, p_first, pieces, mask, y_ptr, r_ptr,
                        offs_m, offs_n, M, N, 0, 0, stride_ym, stride_rm, out_ty, False, RESIDUAL)


def streamk_launch(x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor | None, out: torch.Tensor,
                   residual: torch.Tensor | None, cfg: GemmConfig, n_out: int, swiglu: bool, dot_f32: bool,
                   counters: torch.Tensor | None, frag: bool = False) -> KernelLaunch:
    """The stream-K GEMM's launch on checked arguments (those of ``persistent_launch``; ``cfg`` with
    ``stream_k``): a float32 workspace of ``programs + region tiles`` tile slots made for the call
    (as the split tail's: in a CUDA graph's pool when captured) and ``counters`` (int32 zeros, at
    least one per program: :func:`streamk_counters`; made for the call where None).

    SwiGLU is refused: the per-op chain's plain call runs the stream-K schedule of the [gate; up]
    weight's 2I columns, whose split points differ from those of the fused call's I columns, so the
    two would not give the same bits (the BF16 rule keeps the fused SwiGLU on non-persistent tiles)."""
    assert cfg.stream_k and not cfg.swap_ab, f"streamk_launch takes an untransposed stream_k config, got {cfg}"
    assert not swiglu, "stream-K has no SwiGLU epilogue (its split points differ from the per-op chain's 2I columns)"
    M, K = x.shape
    tiles = triton.cdiv(M, cfg.block_m) * triton.cdiv(n_out, cfg.block_n)
    dp_tiles, programs, q, r = streamk_ranges(tiles, triton.cdiv(K, cfg.block_k), cfg.programs or sms_of(x.device))
    part = torch.empty((programs + tiles - dp_tiles, cfg.block_m * cfg.block_n), dtype=torch.float32,
                       device=x.device)
    if counters is None:
        counters = torch.zeros(programs, dtype=torch.int32, device=x.device)
    assert counters.dtype == torch.int32 and counters.numel() >= programs and counters.device == x.device, (
        f"stream-K needs {programs} int32 counters on {x.device}, got {counters.numel()} {counters.dtype}")
    r_arg = residual if residual is not None else out
    tma, x_arg, w_arg = operands(x, w, cfg)
    args = (x_arg, w_arg, w if scale is None else scale, out, r_arg, part, counters, M, n_out, K, x.stride(0),
            w.stride(0), out.stride(0), r_arg.stride(0), dp_tiles, programs, q, r)
    return KernelLaunch(_gemm_streamk_kernel, (programs,), args, dict(
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m, DOT_F32=dot_f32,
        EVEN_K=K % cfg.block_k == 0, RESIDUAL=residual is not None, INT8=w.dtype == torch.int8,
        BITS=INT8_CONVERTS[cfg.int8_convert], TMA=tma, FRAG=frag, SCALED=scale is not None,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages, enable_fp_fusion=True))


def streamk_counters(M: int, n_out: int, K: int, cfg: GemmConfig, sms: int) -> int:
    """The counters a stream-K launch with ``cfg`` on ``M`` rows, ``n_out`` output columns and ``K``
    on ``sms`` SMs counts on: one per program (at most ``cfg.programs`` or ``sms``)."""
    tiles = triton.cdiv(M, cfg.block_m) * triton.cdiv(n_out, cfg.block_n)
    return streamk_ranges(tiles, triton.cdiv(K, cfg.block_k), cfg.programs or sms)[1]


__all__ = ["streamk_counters", "streamk_launch"]
