"""The tile loops of the paged attention kernels (paged_attention_decode.py and
paged_attention_prefill.py), so that both compute a query row's attention with the same code: the
query rows of a kv head (:func:`load_q_rows`), the online softmax over BLOCK_N-key tiles of the
paged cache (:func:`attend_tiles`), and the same over int8 pages with one float32 scale per cached
vector (``LayerKV``'s int8 layout): the query scaled by the key smoothing (:func:`smooth_q`) and the
tile loop (:func:`attend_tiles_int8`); both ranges of a kv head's keys, the ones every row sees
and the masked rest, from a carried state (:func:`attend_range`: also the persistent step's
attention items, persistent_items.py) or from the empty one (:func:`attend_kv_head`), with a kv
head's page addresses (:func:`kv_head_bases`) and the empty state (:func:`empty_state`).

Every function returns once, at its end: the compiler would also build the code after a return
inside a constexpr branch.
"""

from __future__ import annotations

import triton
import triton.language as tl

# -- the online-softmax tile loop of the paged attention -----------------------------------------------


@triton.jit
def _tile_pages(bt_ptr, n0, hi, BLOCK_N: tl.constexpr, PAGE_SIZE: tl.constexpr):
    """``(page, slot)`` (int64 pages) of keys ``n0 .. n0 + BLOCK_N - 1`` (``n0`` tile-aligned);
    table entries of keys ``>= hi`` are not read (page 0 stands in)."""
    if BLOCK_N <= PAGE_SIZE:
        # The tile lies in one page (both are powers of two): one table entry.
        page = tl.load(bt_ptr + n0 // PAGE_SIZE, mask=n0 < hi, other=0).to(tl.int64)
        slot = (n0 % PAGE_SIZE) + tl.arange(0, BLOCK_N)
    else:
        offs_n = n0 + tl.arange(0, BLOCK_N)
        page = tl.load(bt_ptr + offs_n // PAGE_SIZE, mask=offs_n < hi, other=0).to(tl.int64)
        slot = offs_n % PAGE_SIZE
    return page, slot


@triton.jit
def _tile_rows(bt_ptr, n0, hi, stride_kp, stride_ks, stride_vp, stride_vs,
               BLOCK_N: tl.constexpr, PAGE_SIZE: tl.constexpr):
    """Element offsets of the K and V rows of keys ``n0 .. n0 + BLOCK_N - 1`` (:func:`_tile_pages`)."""
    page, slot = _tile_pages(bt_ptr, n0, hi, BLOCK_N, PAGE_SIZE)
    return page * stride_kp + slot * stride_ks, page * stride_vp + slot * stride_vs


@triton.jit
def _load_tile(base, rows, offs_d, valid, MASKED: tl.constexpr, UPCAST: tl.constexpr):
    ptrs = base + rows[:, None] + offs_d[None, :]
    if MASKED:
        x = tl.load(ptrs, mask=valid[:, None], other=0.0)
    else:
        x = tl.load(ptrs)
    if UPCAST:
        x = x.to(tl.float32)
    return x


@triton.jit
def _online_softmax(s, l_i, m_i, offs_n, qpos, hi, MASKED: tl.constexpr):
    """One tile's update of the online softmax from its scaled scores ``s`` ``[BLOCK_M, BLOCK_N]``
    (base 2): ``(p, alpha, l_i, m_new)``; masked: keys ``>= hi`` and those after ``qpos`` hidden."""
    if MASKED:
        visible = (offs_n[None, :] <= qpos[:, None]) & (offs_n < hi)[None, :]
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        # A row that has seen no key yet keeps m = -inf: subtract 0 instead (no inf - inf).
        m_sub = tl.where(m_new == float("-inf"), 0.0, m_new)
    else:
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_sub = m_new
    p = tl.math.exp2(s - m_sub[:, None])
    alpha = tl.math.exp2(m_i - m_sub)
    l_i = l_i * alpha + tl.sum(p, 1)
    return p, alpha, l_i, m_new


@triton.jit
def _softmax_step(acc, l_i, m_i, q, k, v, offs_n, qpos, hi, qk_scale,
                  MASKED: tl.constexpr, DOT_PRECISION: tl.constexpr):
    s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale  # [BLOCK_M, BLOCK_N]
    p, alpha, l_i, m_new = _online_softmax(s, l_i, m_i, offs_n, qpos, hi, MASKED)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
    return acc, l_i, m_new


@triton.jit
def attend_tiles(acc, l_i, m_i, q, k_base, v_base, bt_ptr, stride_kp, stride_ks, stride_vp, stride_vs,
                 qpos, lo, hi, qk_scale, offs_d,
                 MASKED: tl.constexpr, BLOCK_N: tl.constexpr, PAGE_SIZE: tl.constexpr,
                 UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """Online softmax over keys ``[lo, hi)`` (``lo`` a multiple of BLOCK_N), ``exp2`` with
    ``log2(e)`` folded into ``qk_scale``, float32 ``acc``, ``P`` cast to the K/V dtype for the
    second ``tl.dot``. Unmasked: every key is valid and visible to every row, and ``hi - lo`` is a
    multiple of BLOCK_N. Masked: keys ``>= hi`` are not loaded and row ``i`` sees keys ``<= qpos[i]``
    only.

    The block-table entry of the next tile is read one iteration ahead, so that the K/V addresses
    are loop-carried values: with the lookup inside the iteration Triton did not pipeline the K/V
    loads (H200, 32k context, 16 splits: 72.8 us against 50.2 us).
    """
    k_rows, v_rows = _tile_rows(bt_ptr, lo, hi, stride_kp, stride_ks, stride_vp, stride_vs, BLOCK_N, PAGE_SIZE)
    for n0 in tl.range(lo, hi, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        k = _load_tile(k_base, k_rows, offs_d, offs_n < hi, MASKED, UPCAST)
        v = _load_tile(v_base, v_rows, offs_d, offs_n < hi, MASKED, UPCAST)
        k_rows, v_rows = _tile_rows(bt_ptr, n0 + BLOCK_N, hi, stride_kp, stride_ks, stride_vp, stride_vs,
                                    BLOCK_N, PAGE_SIZE)
        acc, l_i, m_i = _softmax_step(acc, l_i, m_i, q, k, v, offs_n, qpos, hi, qk_scale, MASKED, DOT_PRECISION)
    return acc, l_i, m_i


@triton.jit
def load_q_rows(q_ptr, stride_qt, stride_qh, kv_head, offs_m, offs_d, T,
                GROUP: tl.constexpr, UPCAST: tl.constexpr):
    """Rows ``offs_m`` of a kv head: (token ``r // GROUP``, q head ``kv_head * GROUP + r % GROUP``)."""
    tok = offs_m // GROUP
    head = kv_head * GROUP + offs_m % GROUP
    row_ok = offs_m < T * GROUP
    q = tl.load(q_ptr + (tok * stride_qt + head * stride_qh)[:, None] + offs_d[None, :],
                mask=row_ok[:, None], other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
    return q, tok, head, row_ok


# -- over int8 pages ------------------------------------------------------------------------------


@triton.jit
def smooth_q(q, smooth_ptr, offs_d, DTYPE: tl.constexpr, UPCAST: tl.constexpr):
    """``round(q * k_smooth)`` to DTYPE (q's dtype), as the reference attention scales the query when
    the cache holds ``k / k_smooth``; float32 again where UPCAST (the interpreter's bf16)."""
    s = tl.load(smooth_ptr + offs_d)
    q = (q.to(tl.float32) * s[None, :]).to(DTYPE)
    if UPCAST:
        q = q.to(tl.float32)
    return q


@triton.jit
def _int8_tile_rows(bt_ptr, n0, hi, stride_kp, stride_ks, stride_vp, stride_vs, stride_sp,
                    BLOCK_N: tl.constexpr, PAGE_SIZE: tl.constexpr):
    """:func:`_tile_rows` plus the offsets of the keys' scales (``[P, Hkv, page_size]``, slots
    contiguous, K's and V's alike)."""
    page, slot = _tile_pages(bt_ptr, n0, hi, BLOCK_N, PAGE_SIZE)
    return page * stride_kp + slot * stride_ks, page * stride_vp + slot * stride_vs, page * stride_sp + slot


@triton.jit
def _load_int8_tile(base, scale_base, rows, srows, offs_d, valid, MASKED: tl.constexpr, DTYPE: tl.constexpr):
    """An int8 ``[BLOCK_N, D]`` tile converted to DTYPE (exact: |int8| <= 127) and its ``[BLOCK_N]``
    float32 scales; 0 for keys not ``valid`` where MASKED."""
    ptrs = base + rows[:, None] + offs_d[None, :]
    if MASKED:
        x = tl.load(ptrs, mask=valid[:, None], other=0)
        scale = tl.load(scale_base + srows, mask=valid, other=0.0)
    else:
        x = tl.load(ptrs)
        scale = tl.load(scale_base + srows)
    return x.to(DTYPE), scale


@triton.jit
def _softmax_step_int8(acc, l_i, m_i, q, k, k_scale, v, v_scale, offs_n, qpos, hi, qk_scale,
                       MASKED: tl.constexpr, DOT_PRECISION: tl.constexpr):
    # Scores of the int8 keys, then each key's scale: q.(k8 * s) = (q.k8) * s.
    s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * (k_scale * qk_scale)[None, :]
    p, alpha, l_i, m_new = _online_softmax(s, l_i, m_i, offs_n, qpos, hi, MASKED)
    # P.(v8 * s) = (P * s).v8: each value's scale goes into its column of P before P's rounding,
    # times 128 (exact, undone after the dot) so that P * s ~ P * absmax(v) keeps float16 clear of
    # its subnormals (s alone is ~absmax / 127: P * s would lose bits where P < 1e-2).
    pv = (p * (v_scale * 128.0)[None, :]).to(v.dtype)
    acc = acc * alpha[:, None] + tl.dot(pv, v, input_precision=DOT_PRECISION) * (1.0 / 128.0)
    return acc, l_i, m_new


@triton.jit
def attend_tiles_int8(acc, l_i, m_i, q, k_base, v_base, ks_base, vs_base, bt_ptr, stride_kp, stride_ks,
                      stride_vp, stride_vs, stride_sp, qpos, lo, hi, qk_scale, offs_d,
                      MASKED: tl.constexpr, BLOCK_N: tl.constexpr, PAGE_SIZE: tl.constexpr,
                      DOT_PRECISION: tl.constexpr):
    """:func:`attend_tiles` over int8 pages with one float32 scale per cached vector (``ks_base``,
    ``vs_base``: the kv head's ``[P, page_size]`` scales, page stride ``stride_sp``): each tile is
    converted to q's dtype in registers, the key scales multiply the scores (with ``qk_scale``) and
    the value scales multiply ``P`` before its rounding to q's dtype for the second ``tl.dot``; no
    dequantized copy of the cache, no score matrix beyond the ``[BLOCK_M, BLOCK_N]`` tile. The
    block-table entry of the next tile is read one iteration ahead, as in :func:`attend_tiles`."""
    k_rows, v_rows, s_rows = _int8_tile_rows(bt_ptr, lo, hi, stride_kp, stride_ks, stride_vp, stride_vs,
                                             stride_sp, BLOCK_N, PAGE_SIZE)
    for n0 in tl.range(lo, hi, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        k, k_scale = _load_int8_tile(k_base, ks_base, k_rows, s_rows, offs_d, offs_n < hi, MASKED, q.dtype)
        v, v_scale = _load_int8_tile(v_base, vs_base, v_rows, s_rows, offs_d, offs_n < hi, MASKED, q.dtype)
        k_rows, v_rows, s_rows = _int8_tile_rows(bt_ptr, n0 + BLOCK_N, hi, stride_kp, stride_ks, stride_vp,
                                                 stride_vs, stride_sp, BLOCK_N, PAGE_SIZE)
        acc, l_i, m_i = _softmax_step_int8(acc, l_i, m_i, q, k, k_scale, v, v_scale, offs_n, qpos, hi, qk_scale,
                                           MASKED, DOT_PRECISION)
    return acc, l_i, m_i


@triton.jit
def kv_head_bases(k_ptr, v_ptr, ks_ptr, vs_ptr, kv_head, stride_kh, stride_vh, stride_sh):
    """The K and V pages (and, of int8 pages, the K and V scales) of kv head ``kv_head``."""
    head = kv_head.to(tl.int64)
    return k_ptr + head * stride_kh, v_ptr + head * stride_vh, ks_ptr + head * stride_sh, vs_ptr + head * stride_sh


@triton.jit
def empty_state(BLOCK_M: tl.constexpr, HEAD_DIM: tl.constexpr):
    """The online softmax before any key: float32 ``(acc [BLOCK_M, HEAD_DIM], l_i 0, m_i -inf)``."""
    return (tl.zeros([BLOCK_M, HEAD_DIM], tl.float32), tl.zeros([BLOCK_M], tl.float32),
            tl.full([BLOCK_M], float("-inf"), tl.float32))


@triton.jit
def attend_range(acc, l_i, m_i, q, k_base, v_base, ks_base, vs_base, bt_ptr, stride_kp, stride_ks, stride_vp,
                 stride_vs, stride_sp, qpos, lo, full_end, hi, qk_scale, offs_d,
                 BLOCK_N: tl.constexpr, PAGE_SIZE: tl.constexpr, KV_INT8: tl.constexpr, UPCAST: tl.constexpr,
                 DOT_PRECISION: tl.constexpr):
    """The online softmax state ``(acc, l_i, m_i)`` carried over keys ``[lo, hi)`` of one kv head
    (``k_base``, ``v_base``; ``ks_base``, ``vs_base`` its scales where KV_INT8): keys ``[lo,
    full_end)``, which every row sees, unmasked, then ``[full_end, hi)`` masked by ``qpos``
    (:func:`attend_tiles`, or :func:`attend_tiles_int8` with KV_INT8)."""
    if KV_INT8:
        acc, l_i, m_i = attend_tiles_int8(acc, l_i, m_i, q, k_base, v_base, ks_base, vs_base, bt_ptr, stride_kp,
                                          stride_ks, stride_vp, stride_vs, stride_sp, qpos, lo, full_end, qk_scale,
                                          offs_d, False, BLOCK_N, PAGE_SIZE, DOT_PRECISION)
        acc, l_i, m_i = attend_tiles_int8(acc, l_i, m_i, q, k_base, v_base, ks_base, vs_base, bt_ptr, stride_kp,
                                          stride_ks, stride_vp, stride_vs, stride_sp, qpos, full_end, hi, qk_scale,
                                          offs_d, True, BLOCK_N, PAGE_SIZE, DOT_PRECISION)
    else:
        acc, l_i, m_i = attend_tiles(acc, l_i, m_i, q, k_base, v_base, bt_ptr, stride_kp, stride_ks,
                                     stride_vp, stride_vs, qpos, lo, full_end, qk_scale, offs_d,
                                     False, BLOCK_N, PAGE_SIZE, UPCAST, DOT_PRECISION)
        acc, l_i, m_i = attend_tiles(acc, l_i, m_i, q, k_base, v_base, bt_ptr, stride_kp, stride_ks,
                                     stride_vp, stride_vs, qpos, full_end, hi, qk_scale, offs_d,
                                     True, BLOCK_N, PAGE_SIZE, UPCAST, DOT_PRECISION)
    return acc, l_i, m_i


@triton.jit
def attend_kv_head(q, k_ptr, v_ptr, ks_ptr, vs_ptr, bt_ptr, kv_head, stride_kh, stride_vh, stride_sh,
                   stride_kp, stride_ks, stride_vp, stride_vs, stride_sp, qpos, lo, full_end, hi, qk_scale, offs_d,
                   BLOCK_M: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, PAGE_SIZE: tl.constexpr,
                   KV_INT8: tl.constexpr, UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """The online softmax of the query rows ``q`` (``[BLOCK_M, HEAD_DIM]``) over keys ``[lo, hi)``
    of kv head ``kv_head``, from the empty state (:func:`attend_range`; the scales at ``ks_ptr``,
    ``vs_ptr`` with KV_INT8). Returns the float32 ``(acc [BLOCK_M, HEAD_DIM], l_i [BLOCK_M], m_i
    [BLOCK_M])``."""
    k_base, v_base, ks_base, vs_base = kv_head_bases(k_ptr, v_ptr, ks_ptr, vs_ptr, kv_head, stride_kh, stride_vh,
                                                     stride_sh)
    acc, l_i, m_i = empty_state(BLOCK_M, HEAD_DIM)
    return attend_range(acc, l_i, m_i, q, k_base, v_base, ks_base, vs_base, bt_ptr, stride_kp, stride_ks, stride_vp,
                        stride_vs, stride_sp, qpos, lo, full_end, hi, qk_scale, offs_d, BLOCK_N, PAGE_SIZE, KV_INT8,
                        UPCAST, DOT_PRECISION)
