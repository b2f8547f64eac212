"""The split-KV (flash-decoding) kernels of the paged attention for 1..16 new tokens
(paged_attention.py checks and launches them through :func:`launch_decode`).

``_paged_decode_kernel``, grid ``(num_kv_heads, num_splits)``: a program takes all ``T * G`` q rows
of its kv head (padded to BLOCK_M = max(16, next_pow2(T * G)) rows so that ``tl.dot`` runs on
tensor cores) and scans one contiguous, tile-aligned chunk of the ``L = start + T`` cached
positions in BLOCK_N-key tiles (:func:`attend_tiles` of paged_attention_tiles.py); tiles below ``start
+ 1`` are unmasked, the tail applies the causal mask of each row's token (``CAUSAL=False``: every
row sees all ``start + T`` keys, only the context end is masked). It writes the
unnormalized float32 output and the running max and sum of its rows to scratch buffers ``[T, H,
num_splits, D]`` / ``[T, H, num_splits]``; with one split it normalizes and writes the output
itself and the combine is skipped. The start is read on the device from ``positions[0]``, so that
a replayed CUDA graph follows the step.

Int8 pages (``KV_INT8``, ``kv_store=paged_int8``; paged_attention_int8.py): the same loop through
:func:`attend_tiles_int8`, which converts each int8 tile in registers and applies the per-vector
scales to the scores and to ``P``; with ``SMOOTH`` the q rows are first multiplied by the key
smoothing and rounded (:func:`smooth_q`), as the reference attention does.

``_paged_decode_combine_kernel``, grid ``(T * H,)``: a program loads the ``num_splits`` partials of
one (token, q head), weights each by ``exp2(m_s - M)`` (splits that saw no key of this row have
``m_s = -inf`` and weight 0; ``M`` is never ``-inf`` because key 0 is visible to every row), and
writes ``sum_s w_s acc_s / sum_s w_s l_s`` in q's dtype.

With PDL both kernels let the next kernel launch and then wait for the one before, first thing:
the kernels after them, down to the next GEMV, are placed while the attention runs and prefetch
their weights. Every program waits, also a decode split that finds no key.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tileinfer.backends.triton.device_functions import launch_dependents_then_wait
from tileinfer.backends.triton.paged_attention_tiles import attend_kv_head, load_q_rows, smooth_q
from tileinfer.backends.triton.paged_attention_int8 import Int8Pages, int8_arguments
from tileinfer.backends.triton.pdl import launch_options


@triton.jit
def _paged_decode_kernel(
    q_ptr, k_ptr, v_ptr, bt_ptr, out_ptr, ks_ptr, vs_ptr, smooth_ptr, part_ptr, max_ptr, sum_ptr,
    stride_qt, stride_qh,
    stride_kp, stride_kh, stride_ks,
    stride_vp, stride_vh, stride_vs,
    stride_ot, stride_oh,
    stride_sp, stride_sh,
    T, pos_ptr, qk_scale, num_splits,
    NUM_HEADS: tl.constexpr, SINGLE_SPLIT: tl.constexpr, CAUSAL: tl.constexpr,
    KV_INT8: tl.constexpr, SMOOTH: tl.constexpr,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, PAGE_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr, PDL: tl.constexpr,
):
    launch_dependents_then_wait(PDL)
    kv_head = tl.program_id(0)
    split = tl.program_id(1)
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    q, tok, head, row_ok = load_q_rows(q_ptr, stride_qt, stride_qh, kv_head, offs_m, offs_d, T,
                                       GROUP, UPCAST)
    if SMOOTH:  # the cache holds k / k_smooth
        q = smooth_q(q, smooth_ptr, offs_d, q_ptr.dtype.element_ty, UPCAST)
    start = tl.load(pos_ptr).to(tl.int32)  # read on the device: a replayed CUDA graph sees the new value
    length = start + T
    if CAUSAL:
        qpos = start + tok
        seen_by_all = start + 1
    else:  # every row sees all the keys, as the step's last token does
        qpos = tok * 0 + (length - 1)
        seen_by_all = length
    chunk = tl.cdiv(tl.cdiv(length, num_splits), BLOCK_N) * BLOCK_N
    lo = split * chunk  # chunk is a multiple of BLOCK_N
    hi = tl.minimum(lo + chunk, length)
    full_end = lo + (tl.maximum(tl.minimum(hi, seen_by_all) - lo, 0) // BLOCK_N) * BLOCK_N  # keys all rows see

    acc, l_i, m_i = attend_kv_head(q, k_ptr, v_ptr, ks_ptr, vs_ptr, bt_ptr, kv_head, stride_kh, stride_vh, stride_sh,
                                   stride_kp, stride_ks, stride_vp, stride_vs, stride_sp, qpos, lo, full_end, hi,
                                   qk_scale, offs_d, BLOCK_M, HEAD_DIM, BLOCK_N, PAGE_SIZE, KV_INT8, UPCAST,
                                   DOT_PRECISION)
    if SINGLE_SPLIT:
        out = acc / l_i[:, None]
        tl.store(out_ptr + (tok * stride_ot + head * stride_oh)[:, None] + offs_d[None, :],
                 out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None])
    else:
        row = (tok * NUM_HEADS + head) * num_splits + split  # scratch is [T, H, num_splits(, D)]
        tl.store(part_ptr + row[:, None] * HEAD_DIM + offs_d[None, :], acc, mask=row_ok[:, None])
        tl.store(max_ptr + row, m_i, mask=row_ok)
        tl.store(sum_ptr + row, l_i, mask=row_ok)


@triton.jit
def _paged_decode_combine_kernel(
    part_ptr, max_ptr, sum_ptr, out_ptr, stride_ot, stride_oh, num_splits,
    NUM_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_S: tl.constexpr, PDL: tl.constexpr,
):
    launch_dependents_then_wait(PDL)
    pid = tl.program_id(0)  # = token * NUM_HEADS + head
    tok = pid // NUM_HEADS
    head = pid % NUM_HEADS
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, HEAD_DIM)
    s_ok = offs_s < num_splits
    rows = pid * num_splits + offs_s
    m = tl.load(max_ptr + rows, mask=s_ok, other=float("-inf"))
    l = tl.load(sum_ptr + rows, mask=s_ok, other=0.0)
    m_all = tl.max(m, 0)
    m_sub = tl.where(m_all == float("-inf"), 0.0, m_all)
    w = tl.math.exp2(m - m_sub)  # 0 for splits that saw no key of this row
    part = tl.load(part_ptr + rows[:, None] * HEAD_DIM + offs_d[None, :], mask=s_ok[:, None], other=0.0)
    num = tl.sum(part * w[:, None], 0)
    den = tl.sum(l * w, 0)
    out = num / tl.where(den > 0, den, 1.0)
    tl.store(out_ptr + tok * stride_ot + head * stride_oh + offs_d, out.to(out_ptr.dtype.element_ty))


def _decode_scratch(t: int, h: int, num_splits: int, d: int, device: torch.device
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-query-row split buffers: partial output ``[T, H, S, D]``, max and sum ``[T, H, S]``, fp32.
    The one place the decode path allocates."""
    part = torch.empty(t, h, num_splits, d, dtype=torch.float32, device=device)
    stats = torch.empty(2, t, h, num_splits, dtype=torch.float32, device=device)
    return part, stats[0], stats[1]


def launch_decode(q: torch.Tensor, k_pages: torch.Tensor, v_pages: torch.Tensor, block_table: torch.Tensor,
                  out: torch.Tensor, positions: torch.Tensor, qk_scale: float, num_splits: int, group: int,
                  config: dict, upcast: bool, precision: str, pdl: bool, causal: bool = True,
                  quant: Int8Pages | None = None) -> None:
    """``_paged_decode_kernel`` (and, with more than one split, ``_paged_decode_combine_kernel``) on
    checked arguments; ``qk_scale`` has ``log2(e)`` folded in, ``config`` holds BLOCK_N, num_warps
    and num_stages, ``pdl`` is granted; ``causal=False``: every query sees all ``start + T`` keys;
    ``quant``: the pages are int8 with these scales (and smoothing)."""
    t, h, d = q.shape
    ks, vs, smooth = int8_arguments(q, quant)
    hkv, page_size = k_pages.shape[1], k_pages.shape[2]
    block_m = max(16, triton.next_power_of_2(t * group))
    if num_splits == 1:
        part = m_buf = l_buf = out  # unused by the kernel when SINGLE_SPLIT
    else:
        part, m_buf, l_buf = _decode_scratch(t, h, num_splits, d, q.device)
    _paged_decode_kernel[(hkv, num_splits)](
        q, k_pages, v_pages, block_table, out, ks, vs, smooth, part, m_buf, l_buf,
        q.stride(0), q.stride(1),
        k_pages.stride(0), k_pages.stride(1), k_pages.stride(2),
        v_pages.stride(0), v_pages.stride(1), v_pages.stride(2),
        out.stride(0), out.stride(1),
        ks.stride(0), ks.stride(1),
        t, positions, qk_scale, num_splits,
        NUM_HEADS=h, SINGLE_SPLIT=num_splits == 1, CAUSAL=causal, KV_INT8=quant is not None,
        SMOOTH=smooth is not q, GROUP=group, HEAD_DIM=d, PAGE_SIZE=page_size,
        BLOCK_M=block_m, UPCAST=upcast, DOT_PRECISION=precision, PDL=pdl,
        **config, enable_fp_fusion=True, **launch_options(pdl),
    )
    if num_splits > 1:
        _paged_decode_combine_kernel[(t * h,)](
            part, m_buf, l_buf, out, out.stride(0), out.stride(1), num_splits,
            NUM_HEADS=h, HEAD_DIM=d, BLOCK_S=triton.next_power_of_2(num_splits),
            PDL=pdl, num_warps=4 if d >= 128 else 2, enable_fp_fusion=True, **launch_options(pdl),
        )


__all__ = ["launch_decode"]
