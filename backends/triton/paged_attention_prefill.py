"""The prefill kernel of the paged attention (paged_attention.py checks and launches it through
:func:`prefill_launch`, with the tiles of a :class:`PrefillTiles`).

Tiling and grid ``(num_kv_heads, cdiv(T * G, BLOCK_M))``: the ``T * G`` query rows of one kv head
are the (token, head-of-the-group) pairs in token-major order (row ``r`` is token ``r // G``, q head
``kv_head * G + r % G``), so one K/V tile load serves every q head of the group. A program owns
BLOCK_M rows (64 by the rule) and streams key tiles of BLOCK_N positions (64) up to the causal limit
of its last token (:func:`attend_tiles` of paged_attention_tiles.py): the tiles every row of the
block sees completely run without any mask, the few tiles on the diagonal apply the causal mask and
the end-of-context load mask (``CAUSAL=False``: every row sees all ``start + T`` keys, the tiles up
to the last tile boundary unmasked, the last one masked by the context end). The second grid axis
is walked backwards so that the longest (latest) blocks start first.

Int8 pages (``KV_INT8``, ``kv_store=paged_int8``; paged_attention_int8.py): the same loop through
:func:`attend_tiles_int8`, which converts each int8 tile in registers and applies the per-vector
scales to the scores and to ``P``; with ``SMOOTH`` the q rows are first multiplied by the key
smoothing and rounded (:func:`smooth_q`), as the reference attention does.

The start (the number of cached positions before the step) is read on the device from
``positions[0]``, as the decode kernel reads it, so that a prefill step captured into a CUDA graph
replays at any start (the grid depends on T alone).

With PDL a program lets the next kernel launch and then waits for the one before, first thing (q,
the pages, the block table and the positions may all be outputs of earlier kernels).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from tileinfer.backends.triton.device_functions import launch_dependents_then_wait
from tileinfer.backends.triton.linear_gemm import KernelLaunch
from tileinfer.backends.triton.paged_attention_tiles import attend_kv_head, load_q_rows, smooth_q
from tileinfer.backends.triton.paged_attention_int8 import Int8Pages, int8_arguments
from tileinfer.backends.triton.pdl import launch_options


@dataclass(frozen=True)
class PrefillTiles:
    """The prefill kernel's tiles: ``block_m`` query rows a program, ``block_n`` keys a tile (both
    powers of two >= 16), ``num_warps``, ``num_stages``."""

    block_m: int = 64
    block_n: int = 64
    num_warps: int = 4
    num_stages: int = 3

    def __post_init__(self):
        for name in ("block_m", "block_n"):
            n = getattr(self, name)
            assert n >= 16 and n & (n - 1) == 0, f"{name} must be a power of two >= 16: {self}"


@triton.jit
def _paged_prefill_kernel(
    q_ptr, k_ptr, v_ptr, bt_ptr, out_ptr, ks_ptr, vs_ptr, smooth_ptr,
    stride_qt, stride_qh,
    stride_kp, stride_kh, stride_ks,
    stride_vp, stride_vh, stride_vs,
    stride_ot, stride_oh,
    stride_sp, stride_sh,
    T, pos_ptr, qk_scale,
    CAUSAL: tl.constexpr, KV_INT8: tl.constexpr, SMOOTH: tl.constexpr,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, PAGE_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr, PDL: tl.constexpr,
):
    launch_dependents_then_wait(PDL)
    start = tl.load(pos_ptr).to(tl.int32)  # read on the device: a replayed CUDA graph sees the new value
    kv_head = tl.program_id(0)
    pid_m = tl.num_programs(1) - 1 - tl.program_id(1)  # longest blocks first
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    q, tok, head, row_ok = load_q_rows(q_ptr, stride_qt, stride_qh, kv_head, offs_m, offs_d, T,
                                       GROUP, UPCAST)
    if SMOOTH:  # the cache holds k / k_smooth
        q = smooth_q(q, smooth_ptr, offs_d, q_ptr.dtype.element_ty, UPCAST)
    qpos = start + tok

    first_tok = (pid_m * BLOCK_M) // GROUP
    last_tok = tl.minimum((pid_m * BLOCK_M + BLOCK_M - 1) // GROUP, T - 1)
    full_end = ((start + first_tok + 1) // BLOCK_N) * BLOCK_N  # keys every row of the block sees
    if not CAUSAL:  # every row sees all start + T keys, as the step's last token does
        qpos = tok * 0 + (start + T - 1)
        full_end = ((start + T) // BLOCK_N) * BLOCK_N
        last_tok = T - 1
    causal_end = start + last_tok + 1

    acc, l_i, m_i = attend_kv_head(q, k_ptr, v_ptr, ks_ptr, vs_ptr, bt_ptr, kv_head, stride_kh, stride_vh, stride_sh,
                                   stride_kp, stride_ks, stride_vp, stride_vs, stride_sp, qpos, 0, full_end, causal_end,
                                   qk_scale, offs_d, BLOCK_M, HEAD_DIM, BLOCK_N, PAGE_SIZE, KV_INT8, UPCAST,
                                   DOT_PRECISION)
    out = acc / l_i[:, None]
    tl.store(out_ptr + (tok * stride_ot + head * stride_oh)[:, None] + offs_d[None, :],
             out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None])


def prefill_launch(q: torch.Tensor, k_pages: torch.Tensor, v_pages: torch.Tensor, block_table: torch.Tensor,
                   out: torch.Tensor, positions: torch.Tensor, qk_scale: float, group: int, tiles: PrefillTiles,
                   upcast: bool, precision: str, pdl: bool, causal: bool = True,
                   quant: Int8Pages | None = None) -> KernelLaunch:
    """The launch of ``_paged_prefill_kernel`` on checked arguments (bench/kernels/paged_attention_build.py
    compiles it for sm_90 on ``meta`` tensors); the start is ``positions[0]`` (int64 on q's device),
    read by the kernel, so that a CUDA graph replays at any start; ``qk_scale`` has ``log2(e)``
    folded in, ``tiles`` are the kernel's, ``pdl`` is granted; ``causal=False``: every query sees
    all ``start + T`` keys; ``quant``: the pages are int8 with these scales (and smoothing)."""
    t, _, d = q.shape
    ks, vs, smooth = int8_arguments(q, quant)
    hkv, page_size = k_pages.shape[1], k_pages.shape[2]
    args = (q, k_pages, v_pages, block_table, out, ks, vs, smooth,
            q.stride(0), q.stride(1),
            k_pages.stride(0), k_pages.stride(1), k_pages.stride(2),
            v_pages.stride(0), v_pages.stride(1), v_pages.stride(2),
            out.stride(0), out.stride(1),
            ks.stride(0), ks.stride(1),
            t, positions, qk_scale)
    return KernelLaunch(_paged_prefill_kernel, (hkv, triton.cdiv(t * group, tiles.block_m)), args, dict(
        CAUSAL=causal, KV_INT8=quant is not None, SMOOTH=smooth is not q, GROUP=group, HEAD_DIM=d,
        PAGE_SIZE=page_size, BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n, UPCAST=upcast, DOT_PRECISION=precision,
        PDL=pdl, num_warps=tiles.num_warps, num_stages=tiles.num_stages, enable_fp_fusion=True, **launch_options(pdl)))


__all__ = ["PrefillTiles", "prefill_launch"]
