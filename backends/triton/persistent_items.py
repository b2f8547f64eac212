"""The work items of the persistent decode step (persistent.py) as ``@triton.jit`` device
functions, and the counters through which an item waits for its inputs.

Every item computes the rows of the step's ``T <= 16`` tokens padded to fixed tiles (16 token rows
for a GEMV, ``16 * GROUP`` query rows padded to a power of two for attention) whatever ``T`` is,
so that a token's row is reduced in the same order in a 1-token step and in a 16-token verify step
(batch-invariant rows):

- :func:`gemv_item`: ``BLOCK_N`` output columns of one linear, ``y = x W^T`` through ``tl.dot``
  over ``[16, BLOCK_K]`` activation chunks (the RMSNorm of the input rows computed in the item's
  prologue when NORM; int8 weights converted exactly and their row scales applied to the float32
  accumulator), then the SwiGLU, residual-add or float32-logits epilogue. The first weight chunk is
  loaded before the item waits for its input, and each chunk's successor before the chunk's dot.
- :func:`attention_inputs_item`: one kv head's q heads (RMSNorm, RoPE) into the q buffer, its key
  (RMSNorm, RoPE) and value into the paged cache, for every token of the step; into int8 pages
  (KV_INT8) the key smoothed and both quantized per vector as the per-op kernel does
  (``store_kv_int8`` of device_functions.py).
- :func:`attention_item`: one of ``NUM_SPLITS`` partitions of one kv head's keys: the chunks
  ``split, split + NUM_SPLITS, ...`` of ``CHUNK`` positions (a fixed partition: which keys a split
  owns does not depend on T), through the online-softmax tile loops of paged_attention_tiles.py
  (``attend_range``: model-dtype or int8 pages, the query smoothed first where SMOOTH); the last
  split of the kv head to finish (a counter) combines the partials in split order.

Synchronization: an item that produced data runs a CTA barrier, then a release increment of its
counter (:func:`signal`); a consumer spins on an acquire read until the counter reaches its target
(:func:`wait_for`) and reads what others wrote with ``.cg`` loads (past L1).
"""

from __future__ import annotations

import triton
import triton.language as tl

from tileinfer.backends.triton.device_functions import (add_residual, dot_chunk, page_slot, rms_norm_halves,
                                                        round_to, rope_rotate, scale_normalized, silu_mul_f32,
                                                        store_kv_int8)
from tileinfer.backends.triton.paged_attention_tiles import (attend_range, empty_state, kv_head_bases, load_q_rows,
                                                             smooth_q)

BLOCK_T = tl.constexpr(16)  # token rows of every GEMV tile (T = 1..16 padded)


@triton.jit
def wait_for(counter_ptr, target):
    """Spin until the int32 counter reaches ``target`` (acquire: what its producers wrote before
    their release is visible after)."""
    seen = tl.atomic_add(counter_ptr, 0, sem="acquire", scope="gpu")
    while seen < target:
        seen = tl.atomic_add(counter_ptr, 0, sem="acquire", scope="gpu")


@triton.jit
def signal(counter_ptr):
    """Count one finished item: every thread's stores are ordered before the release increment."""
    tl.debug_barrier()
    tl.atomic_add(counter_ptr, 1, sem="release", scope="gpu")


@triton.jit
def _load_x(x_rows, row_ok, k0, offs_k, K: tl.constexpr):
    return tl.load(x_rows + k0, mask=row_ok[:, None] & (k0 + offs_k < K)[None, :], other=0.0, cache_modifier=".cg")


@triton.jit
def _row_rstd(x_ptr, row_ok, K: tl.constexpr, eps, BLOCK_K: tl.constexpr):
    """``rsqrt(mean(x^2) + eps)`` of the 16 rows at ``x_ptr`` (``[16, K]`` contiguous), summed in
    BLOCK_K chunks: ``[16, 1]`` float32."""
    offs_t = tl.arange(0, BLOCK_T)
    offs_k = tl.arange(0, BLOCK_K)
    x_rows = x_ptr + offs_t[:, None] * K + offs_k[None, :]
    ss = tl.zeros([BLOCK_T], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        x = _load_x(x_rows, row_ok, k0, offs_k, K).to(tl.float32)
        ss += tl.sum(x * x, 1)
    return tl.math.rsqrt(ss / K + eps)[:, None]


@triton.jit
def _load_weight(w_rows, k0, offs_k, K: tl.constexpr, n_ok):
    return tl.load(w_rows + k0, mask=n_ok[:, None] & (k0 + offs_k < K)[None, :], other=0,
                   eviction_policy="evict_first")


@triton.jit
def gemv_item(x_ptr, T, w_ptr, s_ptr, nw_ptr, eps, y_ptr, cap_ptr, capture, n0, wait_ptr, wait_target,
              K: tl.constexpr, N: tl.constexpr, UP_ROWS: tl.constexpr,
              NORM: tl.constexpr, SWIGLU: tl.constexpr, RESIDUAL: tl.constexpr, INT8: tl.constexpr,
              BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, DOT_F32: tl.constexpr, STAGES: tl.constexpr = 1,
              SPLITS: tl.constexpr = 1, split=0, split_ptr=None, tile_counter=None,
              CONVERT: tl.constexpr = 0):
    """Columns ``n0 .. n0 + BLOCK_N`` of ``y[16, N] = x[16, K] W^T`` for the first ``T`` rows
    (``x``, ``y`` contiguous; ``W`` ``[rows, K]`` row-major, int8 with float32 row scales ``s``
    where INT8). NORM: ``x`` RMS-normalized with weight ``nw``: a pass over the rows after the wait,
    then each chunk rounded as Qwen3 rounds (``round(nw * round(x * rstd))``).
    SWIGLU: rows ``n`` (gate) and ``UP_ROWS + n`` (up), each accumulator rounded to y's dtype,
    then ``silu(g) * u``. RESIDUAL: ``y = round(y + y_old)`` (in place: the residual stream).
    ``capture >= 0``: the result also at ``cap_ptr``. Waits for ``wait_ptr`` to reach
    ``wait_target``. The weight chunks: STAGES 1, each chunk's successor loaded into registers
    before the chunk's dot, the first before the wait; more, the compiler's software pipeline of
    STAGES stages through shared memory, after the wait. CONVERT: how int8 weights become floats
    (``int8_to``'s BITS: 0 Triton's cast, 1 bit patterns, 2 byte permutes). None of these changes
    an operation; with INT8 weights the pipelined builds (STAGES > 1) give the dots' operands Triton's
    ``kWidth`` 4 where the others have 2 (sm_90 TTGIR), which places the K elements at other
    positions of each m16n8k16 MMA: the same products, summed by the tensor core in another order
    (other last bits, seen at the Qwen3-0.6B shape on an H100). SPLITS > 1 (not
    with SWIGLU): this item sums the ``split``-th of SPLITS equal runs of K chunks into the float32
    scratch ``split_ptr`` (``[SPLITS, 16, N]``) and counts itself in ``tile_counter``; the tile's
    last split adds the partial sums up in split order and runs the epilogue. Returns 1 where this
    item wrote the output (always with SPLITS 1), else 0."""
    act_ty = x_ptr.dtype.element_ty
    offs_t = tl.arange(0, BLOCK_T)
    offs_n = n0 + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    row_ok = offs_t < T
    n_ok = offs_n < N
    w_rows = w_ptr + offs_n.to(tl.int64)[:, None] * K + offs_k[None, :]
    x_rows = x_ptr + offs_t[:, None] * K + offs_k[None, :]
    K_RUN: tl.constexpr = (((K + BLOCK_K - 1) // BLOCK_K + SPLITS - 1) // SPLITS) * BLOCK_K  # K per split
    k_lo = split * K_RUN
    k_hi = tl.minimum(k_lo + K_RUN, K)
    if STAGES == 1:  # the first weight chunk in registers before the wait
        wg = _load_weight(w_rows, k_lo, offs_k, K, n_ok)
        if SWIGLU:
            wu = _load_weight(w_rows + UP_ROWS * K, k_lo, offs_k, K, n_ok)
    wait_for(wait_ptr, wait_target)
    if NORM:
        rstd = _row_rstd(x_ptr, row_ok, K, eps, BLOCK_K)
    acc = tl.zeros([BLOCK_T, BLOCK_N], tl.float32)
    acc_u = tl.zeros([BLOCK_T, BLOCK_N], tl.float32)
    for k0 in tl.range(k_lo, k_hi, BLOCK_K, num_stages=STAGES):
        x = _load_x(x_rows, row_ok, k0, offs_k, K)
        if NORM:
            nw = tl.load(nw_ptr + k0 + offs_k, mask=k0 + offs_k < K, other=0.0).to(tl.float32)
            x = scale_normalized(x.to(tl.float32), rstd, nw[None, :], act_ty)
        if STAGES > 1:  # the compiler's pipeline keeps STAGES - 1 chunks in flight (through shared memory)
            wg = _load_weight(w_rows, k0, offs_k, K, n_ok)
            acc = dot_chunk(x, wg, acc, DOT_F32, INT8, CONVERT, False)
            if SWIGLU:
                wu = _load_weight(w_rows + UP_ROWS * K, k0, offs_k, K, n_ok)
                acc_u = dot_chunk(x, wu, acc_u, DOT_F32, INT8, CONVERT, False)
        else:  # each chunk's successor loaded before its dot
            next_g = _load_weight(w_rows, k0 + BLOCK_K, offs_k, K, n_ok)
            acc = dot_chunk(x, wg, acc, DOT_F32, INT8, CONVERT, False)
            wg = next_g
            if SWIGLU:
                next_u = _load_weight(w_rows + UP_ROWS * K, k0 + BLOCK_K, offs_k, K, n_ok)
                acc_u = dot_chunk(x, wu, acc_u, DOT_F32, INT8, CONVERT, False)
                wu = next_u
    at = offs_t[:, None] * N + offs_n[None, :]
    wrote = 1
    if SPLITS > 1:
        tl.static_assert(not SWIGLU, "split K runs are for the plain and residual GEMVs")
        tl.store(split_ptr + split * (BLOCK_T * N) + at, acc, mask=row_ok[:, None] & n_ok[None, :])
        tl.debug_barrier()
        wrote = (tl.atomic_add(tile_counter, 1, sem="acq_rel", scope="gpu") == SPLITS - 1).to(tl.int32)
        if wrote != 0:  # the tile's last split: the partial sums in split order
            acc = tl.zeros([BLOCK_T, BLOCK_N], tl.float32)
            for j in range(SPLITS):
                acc += tl.load(split_ptr + j * (BLOCK_T * N) + at, mask=row_ok[:, None] & n_ok[None, :], other=0.0,
                               cache_modifier=".cg")
    if wrote != 0:
        out_ty = y_ptr.dtype.element_ty
        if INT8:
            acc = acc * tl.load(s_ptr + offs_n, mask=n_ok, other=0.0)[None, :]
            if SWIGLU:
                acc_u = acc_u * tl.load(s_ptr + UP_ROWS + offs_n, mask=n_ok, other=0.0)[None, :]
        if SWIGLU:
            acc = silu_mul_f32(round_to(acc, out_ty), round_to(acc_u, out_ty))
        mask = row_ok[:, None] & n_ok[None, :]
        y = add_residual(acc.to(out_ty), y_ptr + at, mask, RESIDUAL)
        tl.store(y_ptr + at, y, mask=mask)
        if capture >= 0:
            tl.store(cap_ptr + capture.to(tl.int64) * (BLOCK_T * N) + at, y, mask=mask)
    return wrote


@triton.jit
def _norm_rope_rows(src, row_ok, w_ptr, c, s, eps, D: tl.constexpr):
    """RMSNorm (weight ``w_ptr`` ``[D]``) then RoPE (``c``, ``s`` per row) of the head vectors at
    the row pointers ``src`` ``[R, 1]``: the two rotated halves, in src's dtype."""
    dtype = src.dtype.element_ty
    offs = tl.arange(0, D // 2)[None, :]
    a = tl.load(src + offs, mask=row_ok, other=0.0, cache_modifier=".cg").to(tl.float32)
    b = tl.load(src + D // 2 + offs, mask=row_ok, other=0.0, cache_modifier=".cg").to(tl.float32)
    wa = tl.load(w_ptr + offs).to(tl.float32)
    wb = tl.load(w_ptr + D // 2 + offs).to(tl.float32)
    na, nb = rms_norm_halves(a, b, wa, wb, D, eps, dtype)
    return rope_rotate(na.to(tl.float32), nb.to(tl.float32), c, s, dtype)


@triton.jit
def _rope_tables(cos_ptr, sin_ptr, stride_cs, pos, D: tl.constexpr):
    offs = tl.arange(0, D // 2)[None, :]
    return tl.load(cos_ptr + pos * stride_cs + offs), tl.load(sin_ptr + pos * stride_cs + offs)


@triton.jit
def attention_inputs_item(qkv_ptr, q_ptr, k_pages, v_pages, ks_ptr, vs_ptr, smooth_ptr, bt_ptr, pos_ptr, cos_ptr,
                          sin_ptr, stride_cs, qn_ptr, kn_ptr, eps, kv_head, T, stride_kp, stride_kh, stride_ks,
                          stride_sp, stride_sh, H: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr,
                          GROUP: tl.constexpr, ROWS: tl.constexpr, PAGE_SIZE: tl.constexpr, KV_INT8: tl.constexpr,
                          SMOOTH: tl.constexpr):
    """For kv head ``kv_head`` and every token ``t < T`` of ``qkv`` (``[16, (H + 2 HKV) D]``):
    q heads ``kv_head * GROUP ..`` normalized and rotated into ``q`` (``[16, H, D]``; ``ROWS``: 16 * GROUP
    token-head rows padded to a power of two, the padding masked), the key
    normalized and rotated and the value copied into the pages at the token's position. KV_INT8:
    the pages are int8, the key (divided by the smoothing ``smooth`` ``[D]`` float32 where SMOOTH)
    and the value quantized with one float32 scale per vector into ``ks``, ``vs`` (``[P, HKV,
    PAGE_SIZE]``, strides ``stride_sp``, ``stride_sh``, slots contiguous; :func:`store_kv_int8`)."""
    width = (H + 2 * HKV) * D
    offs = tl.arange(0, D // 2)[None, :]
    r = tl.arange(0, ROWS)[:, None]
    tok = r // GROUP
    head = kv_head * GROUP + r % GROUP
    ok = tok < T
    pos = tl.load(pos_ptr + tok, mask=ok, other=0)
    c, s = _rope_tables(cos_ptr, sin_ptr, stride_cs, pos, D)
    qa, qb = _norm_rope_rows(qkv_ptr + tok * width + head * D, ok, qn_ptr, c, s, eps, D)
    q_row = q_ptr + tok * (H * D) + head * D + offs
    tl.store(q_row, qa, mask=ok)
    tl.store(q_row + D // 2, qb, mask=ok)

    t = tl.arange(0, BLOCK_T)[:, None]
    ok = t < T
    pos = tl.load(pos_ptr + t, mask=ok, other=0)
    c, s = _rope_tables(cos_ptr, sin_ptr, stride_cs, pos, D)
    ka, kb = _norm_rope_rows(qkv_ptr + t * width + (H + kv_head) * D, ok, kn_ptr, c, s, eps, D)
    page, slot = page_slot(bt_ptr, pos, PAGE_SIZE)
    dst = page * stride_kp + kv_head * stride_kh + slot * stride_ks + offs
    v = qkv_ptr + t * width + (H + HKV + kv_head) * D + offs
    if KV_INT8:
        va = tl.load(v, mask=ok, other=0.0, cache_modifier=".cg").to(tl.float32)
        vb = tl.load(v + D // 2, mask=ok, other=0.0, cache_modifier=".cg").to(tl.float32)
        at = page * stride_sp + kv_head * stride_sh + slot  # [16, 1]
        store_kv_int8(k_pages + dst, v_pages + dst, ks_ptr + at, vs_ptr + at, ka.to(tl.float32), kb.to(tl.float32),
                      va, vb, smooth_ptr, offs, ok, ok, SMOOTH, D)
    else:
        tl.store(k_pages + dst, ka, mask=ok)
        tl.store(k_pages + dst + D // 2, kb, mask=ok)
        tl.store(v_pages + dst, tl.load(v, mask=ok, cache_modifier=".cg"), mask=ok)
        tl.store(v_pages + dst + D // 2, tl.load(v + D // 2, mask=ok, cache_modifier=".cg"), mask=ok)


@triton.jit
def attention_item(q_ptr, k_pages, v_pages, ks_ptr, vs_ptr, smooth_ptr, bt_ptr, pos_ptr, part_ptr, stat_ptr, out_ptr,
                   split_counter, T, causal, kv_head, split, qk_scale, stride_kp, stride_kh, stride_ks, stride_sp,
                   stride_sh, H: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr, GROUP: tl.constexpr,
                   ROWS: tl.constexpr, PAGE_SIZE: tl.constexpr, NUM_SPLITS: tl.constexpr, CHUNK: tl.constexpr,
                   BLOCK_N: tl.constexpr, KV_INT8: tl.constexpr, SMOOTH: tl.constexpr, UPCAST: tl.constexpr,
                   DOT_PRECISION: tl.constexpr):
    """Split ``split`` of kv head ``kv_head``'s attention for the step's ``T`` query tokens (q
    ``[16, H, D]``, in ``ROWS`` rows: 16 * GROUP padded to a power of two; causal where ``causal``
    != 0, else each query sees all the step's keys too: a block drafter's step), over the keys of
    chunks ``split + j * NUM_SPLITS`` (``CHUNK`` positions each) below ``start + T``. Its float32
    partials (``acc`` ``[BLOCK_M, D]``, max and sum) go to the scratch ``part`` ``[HKV, NUM_SPLITS,
    BLOCK_M, D]`` and ``stat`` ``[2, HKV, NUM_SPLITS, BLOCK_M]``; the kv head's last split to count
    itself in ``split_counter`` combines them in split order into ``out`` (``[16, H * D]``, q's
    dtype). Returns 1 where it combined, else 0. KV_INT8: int8 pages with float32 scales ``ks``,
    ``vs`` (``[P, HKV, PAGE_SIZE]``, strides ``stride_sp``, ``stride_sh``), the query rows first
    multiplied by the smoothing where SMOOTH (:func:`smooth_q`, :func:`attend_tiles_int8`), as the
    per-op decode attention."""
    BLOCK_M: tl.constexpr = ROWS
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D)
    q, tok, head, row_ok = load_q_rows(q_ptr, H * D, D, kv_head, offs_m, offs_d, T, GROUP, UPCAST)
    if SMOOTH:  # the cache holds k / k_smooth
        q = smooth_q(q, smooth_ptr, offs_d, q_ptr.dtype.element_ty, UPCAST)
    start = tl.load(pos_ptr).to(tl.int32)
    length = start + T
    qpos = tl.where(causal != 0, start + tok, length - 1)  # non-causal: every row sees every key of the step
    seen = tl.where(causal != 0, start + 1, length)  # the keys every row sees
    k_base, v_base, ks_base, vs_base = kv_head_bases(k_pages, v_pages, ks_ptr, vs_ptr, kv_head, stride_kh, stride_kh,
                                                     stride_sh)
    acc, l_i, m_i = empty_state(BLOCK_M, D)
    for lo in range(split * CHUNK, length, NUM_SPLITS * CHUNK):
        hi = tl.minimum(lo + CHUNK, length)
        full_end = lo + (tl.maximum(tl.minimum(hi, seen) - lo, 0) // BLOCK_N) * BLOCK_N
        acc, l_i, m_i = attend_range(acc, l_i, m_i, q, k_base, v_base, ks_base, vs_base, bt_ptr, stride_kp,
                                     stride_ks, stride_kp, stride_ks, stride_sp, qpos, lo, full_end, hi, qk_scale,
                                     offs_d, BLOCK_N, PAGE_SIZE, KV_INT8, UPCAST, DOT_PRECISION)
    row = (kv_head * NUM_SPLITS + split) * BLOCK_M + offs_m
    tl.store(part_ptr + row.to(tl.int64)[:, None] * D + offs_d[None, :], acc, mask=row_ok[:, None])  # T's rows only
    tl.store(stat_ptr + row, m_i, mask=row_ok)
    tl.store(stat_ptr + HKV * NUM_SPLITS * BLOCK_M + row, l_i, mask=row_ok)
    tl.debug_barrier()
    last = tl.atomic_add(split_counter, 1, sem="acq_rel", scope="gpu") == NUM_SPLITS - 1
    if last:
        _combine(part_ptr, stat_ptr, out_ptr, kv_head, offs_m, offs_d, tok, head, row_ok,
                 H, HKV, D, NUM_SPLITS, BLOCK_M)
    return last.to(tl.int32)


@triton.jit
def _combine(part_ptr, stat_ptr, out_ptr, kv_head, offs_m, offs_d, tok, head, row_ok,
             H: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr, NUM_SPLITS: tl.constexpr,
             BLOCK_M: tl.constexpr):
    """``sum_s w_s acc_s / sum_s w_s l_s`` with ``w_s = exp2(m_s - max_s m_s)``, summed in split
    order (a split that saw no key of a row has ``m_s = -inf``: weight 0, adds exact zeros). Only the
    step's rows (``row_ok``) are read: at T = 1, GROUP of the 16 * GROUP rows."""
    first = kv_head * NUM_SPLITS * BLOCK_M + offs_m
    m_all = tl.full([BLOCK_M], float("-inf"), tl.float32)
    for s in range(NUM_SPLITS):
        m_s = tl.load(stat_ptr + first + s * BLOCK_M, mask=row_ok, other=float("-inf"), cache_modifier=".cg")
        m_all = tl.maximum(m_all, m_s)
    m_sub = tl.where(m_all == float("-inf"), 0.0, m_all)
    num = tl.zeros([BLOCK_M, D], tl.float32)
    den = tl.zeros([BLOCK_M], tl.float32)
    for s in range(NUM_SPLITS):
        row = first + s * BLOCK_M
        w = tl.math.exp2(tl.load(stat_ptr + row, mask=row_ok, other=float("-inf"), cache_modifier=".cg") - m_sub)
        den += tl.load(stat_ptr + HKV * NUM_SPLITS * BLOCK_M + row, mask=row_ok, other=0.0, cache_modifier=".cg") * w
        num += tl.load(part_ptr + row.to(tl.int64)[:, None] * D + offs_d[None, :], mask=row_ok[:, None], other=0.0,
                       cache_modifier=".cg") * w[:, None]
    out = num / tl.where(den > 0, den, 1.0)[:, None]
    tl.store(out_ptr + (tok * (H * D) + head * D)[:, None] + offs_d[None, :], out.to(out_ptr.dtype.element_ty),
             mask=row_ok[:, None])
