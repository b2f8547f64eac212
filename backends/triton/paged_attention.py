"""Causal GQA flash attention read in place from the paged KV cache (twin:
``tileinfer.backends.reference.attention.causal_attention`` over ``gather_pages``).

``_paged_prefill_kernel``, grid ``(num_kv_heads, cdiv(T * G, BLOCK_M))``: the ``T * G`` query rows
of one kv head are the (token, head-of-the-group) pairs in token-major order (row ``r`` is token
``r // G``, q head ``kv_head * G + r % G``), so one K/V tile load serves every q head of the group.
A program owns BLOCK_M rows (64) and streams key tiles of BLOCK_N positions (64) up to the causal
limit of its last token: the tiles every row of the block sees completely run without any
mask, the few tiles on the diagonal apply the causal mask and the end-of-context load mask. The
second grid axis is walked backwards so that the longest (latest) blocks start first.

``_paged_decode_kernel`` (split-KV flash-decoding, for 1..16 new tokens), grid
``(num_kv_heads, num_splits)``: a program takes all ``T * G`` q rows of its kv head (padded to
BLOCK_M = max(16, next_pow2(T * G)) rows so that ``tl.dot`` runs on tensor cores) and scans one
contiguous, tile-aligned chunk of the ``L = start + T`` cached positions in BLOCK_N-key tiles;
tiles below ``start + 1`` are unmasked, the tail applies the causal mask of each row's token. It
writes the unnormalized float32 output and the running max and sum of its rows to scratch buffers
``[T, H, num_splits, D]`` / ``[T, H, num_splits]``; with one split it normalizes and writes the
output itself and the combine is skipped. ``decode_splits`` picks 16 splits for long contexts
(128 programs for 8 kv heads, about one per multiprocessor) and fewer below 2,048 positions.

``_paged_decode_combine_kernel``, grid ``(T * H,)``: a program loads the ``num_splits`` partials of
one (token, q head), weights each by ``exp2(m_s - M)`` (splits that saw no key of this row have
``m_s = -inf`` and weight 0; ``M`` is never ``-inf`` because key 0 is visible to every row), and
writes ``sum_s w_s acc_s / sum_s w_s l_s`` in q's dtype.

All kernels: K/V rows are found per tile through the block table (one page lookup per tile when
``BLOCK_N <= page_size``, one per key otherwise, so any power-of-two page size works; the entry of
the next tile is read one iteration ahead so that Triton pipelines the K/V loads), nothing is
gathered; the softmax is online with ``exp2`` and ``log2(e)`` folded into the scale; accumulation
is float32; ``P`` is cast to the K/V dtype for the second ``tl.dot``. Under the Triton interpreter
bfloat16 tiles are cast to float32 after loading (the interpreter mis-computes bf16 dots).

Programmatic dependent launch (``pdl=True``, Hopper; backends/triton/pdl.py), all three kernels:
a program lets the next kernel launch and then waits for the one before, first thing (q, the
pages, the block table and the positions may all be outputs of earlier kernels or copies).
Every program waits, also a decode split that finds no key. Same bits either way.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from tileinfer.backends.triton.pdl import launch_options, use_pdl

LOG2E = 1.4426950408889634
DECODE_MAX_TOKENS = 16
DECODE_MAX_SPLITS = 16  # the default for long contexts
DECODE_MIN_KEYS_PER_SPLIT = 128
# With PDL, whether the decode split kernel / the combine let the next kernel launch after their
# grid dependency wait (True) or at their start (False: the kernels after them, down to the next
# GEMV, are placed while attention runs and prefetch their weights); read at each launch
# (bench/kernels/decode_step_experiments.py compares both).
DECODE_TRIGGER_AFTER_WAIT = False
COMBINE_TRIGGER_AFTER_WAIT = False


def decode_splits(context_len: int) -> int:
    """Default split count of the decode kernel for ``context_len`` cached positions.

    ``min(16, context_len // 128)``, at least 1: every split scans at least 128 keys (two 64-key
    tiles), and long contexts use 16 splits, which with Qwen3's 8 kv heads gives 128 programs, about
    one per multiprocessor of an H100/H200 (132). A program streams K/V at about 15-30 GB/s, so the
    split count sets the bandwidth. Measured on an H200, Qwen3-4B, one new token: 32k context,
    8 splits 26 %, 16 splits 64 %, 32 splits 63 % of the copy bandwidth; 8k context, 16 splits
    21.5 us, 32 splits 22.4 us; 1k context, 8 splits 12.7 us, 16 splits 12.1 us, 4 splits ~17 us.
    """
    return max(1, min(DECODE_MAX_SPLITS, context_len // DECODE_MIN_KEYS_PER_SPLIT))


# -- shared inner loop ------------------------------------------------------------------------------


@triton.jit
def _tile_rows(bt_ptr, n0, hi, stride_kp, stride_ks, stride_vp, stride_vs,
               BLOCK_N: tl.constexpr, PAGE_SIZE: tl.constexpr):
    """Element offsets of the K and V rows of keys ``n0 .. n0 + BLOCK_N - 1`` (``n0`` tile-aligned);
    table entries of keys ``>= hi`` are not read (page 0 stands in)."""
    if BLOCK_N <= PAGE_SIZE:
        # The tile lies in one page (both are powers of two): one table entry.
        page = tl.load(bt_ptr + n0 // PAGE_SIZE, mask=n0 < hi, other=0).to(tl.int64)
        slot = (n0 % PAGE_SIZE) + tl.arange(0, BLOCK_N)
    else:
        offs_n = n0 + tl.arange(0, BLOCK_N)
        page = tl.load(bt_ptr + offs_n // PAGE_SIZE, mask=offs_n < hi, other=0).to(tl.int64)
        slot = offs_n % PAGE_SIZE
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
def _softmax_step(acc, l_i, m_i, q, k, v, offs_n, qpos, hi, qk_scale,
                  MASKED: tl.constexpr, DOT_PRECISION: tl.constexpr):
    s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale  # [BLOCK_M, BLOCK_N]
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
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
    return acc, l_i, m_new


@triton.jit
def _attend_tiles(acc, l_i, m_i, q, k_base, v_base, bt_ptr, stride_kp, stride_ks, stride_vp, stride_vs,
                  qpos, lo, hi, qk_scale, offs_d,
                  MASKED: tl.constexpr, BLOCK_N: tl.constexpr, PAGE_SIZE: tl.constexpr,
                  UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """Online softmax over keys ``[lo, hi)`` (``lo`` a multiple of BLOCK_N). Unmasked: every key
    is valid and visible to every row, and ``hi - lo`` is a multiple of BLOCK_N. Masked: keys
    ``>= hi`` are not loaded and row ``i`` sees keys ``<= qpos[i]`` only.

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
def _load_q_rows(q_ptr, stride_qt, stride_qh, kv_head, offs_m, offs_d, T,
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


# -- prefill ----------------------------------------------------------------------------------------


@triton.jit
def _paged_prefill_kernel(
    q_ptr, k_ptr, v_ptr, bt_ptr, out_ptr,
    stride_qt, stride_qh,
    stride_kp, stride_kh, stride_ks,
    stride_vp, stride_vh, stride_vs,
    stride_ot, stride_oh,
    T, start, qk_scale,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, PAGE_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr, PDL: tl.constexpr,
):
    if PDL:
        gdc_launch_dependents()
        gdc_wait()
    kv_head = tl.program_id(0)
    pid_m = tl.num_programs(1) - 1 - tl.program_id(1)  # longest blocks first
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    q, tok, head, row_ok = _load_q_rows(q_ptr, stride_qt, stride_qh, kv_head, offs_m, offs_d, T,
                                        GROUP, UPCAST)
    qpos = start + tok

    first_tok = (pid_m * BLOCK_M) // GROUP
    last_tok = tl.minimum((pid_m * BLOCK_M + BLOCK_M - 1) // GROUP, T - 1)
    full_end = ((start + first_tok + 1) // BLOCK_N) * BLOCK_N  # keys every row of the block sees
    causal_end = start + last_tok + 1

    k_base = k_ptr + kv_head.to(tl.int64) * stride_kh
    v_base = v_ptr + kv_head.to(tl.int64) * stride_vh
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    acc, l_i, m_i = _attend_tiles(acc, l_i, m_i, q, k_base, v_base, bt_ptr, stride_kp, stride_ks,
                                  stride_vp, stride_vs, qpos, 0, full_end, qk_scale, offs_d,
                                  False, BLOCK_N, PAGE_SIZE, UPCAST, DOT_PRECISION)
    acc, l_i, m_i = _attend_tiles(acc, l_i, m_i, q, k_base, v_base, bt_ptr, stride_kp, stride_ks,
                                  stride_vp, stride_vs, qpos, full_end, causal_end, qk_scale, offs_d,
                                  True, BLOCK_N, PAGE_SIZE, UPCAST, DOT_PRECISION)
    out = acc / l_i[:, None]
    tl.store(out_ptr + (tok * stride_ot + head * stride_oh)[:, None] + offs_d[None, :],
             out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None])


# -- decode: split-KV ---------------------------------------------------------------------------------


@triton.jit
def _trigger_and_wait(TRIGGER_AFTER_WAIT: tl.constexpr):
    """PDL: let the next kernel launch, then wait for the one before; or wait first."""
    if TRIGGER_AFTER_WAIT:
        gdc_wait()
        gdc_launch_dependents()
    else:
        gdc_launch_dependents()
        gdc_wait()


@triton.jit
def _paged_decode_kernel(
    q_ptr, k_ptr, v_ptr, bt_ptr, out_ptr, part_ptr, max_ptr, sum_ptr,
    stride_qt, stride_qh,
    stride_kp, stride_kh, stride_ks,
    stride_vp, stride_vh, stride_vs,
    stride_ot, stride_oh,
    T, pos_ptr, qk_scale, num_splits,
    NUM_HEADS: tl.constexpr, SINGLE_SPLIT: tl.constexpr,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, PAGE_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr, PDL: tl.constexpr, TRIGGER_AFTER_WAIT: tl.constexpr,
):
    if PDL:
        _trigger_and_wait(TRIGGER_AFTER_WAIT)
    kv_head = tl.program_id(0)
    split = tl.program_id(1)
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    q, tok, head, row_ok = _load_q_rows(q_ptr, stride_qt, stride_qh, kv_head, offs_m, offs_d, T,
                                        GROUP, UPCAST)
    start = tl.load(pos_ptr).to(tl.int32)  # read on the device: a replayed CUDA graph sees the new value
    qpos = start + tok

    length = start + T
    chunk = tl.cdiv(tl.cdiv(length, num_splits), BLOCK_N) * BLOCK_N
    lo = split * chunk  # chunk is a multiple of BLOCK_N
    hi = tl.minimum(lo + chunk, length)
    full_end = lo + (tl.maximum(tl.minimum(hi, start + 1) - lo, 0) // BLOCK_N) * BLOCK_N  # keys all rows see

    k_base = k_ptr + kv_head.to(tl.int64) * stride_kh
    v_base = v_ptr + kv_head.to(tl.int64) * stride_vh
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    acc, l_i, m_i = _attend_tiles(acc, l_i, m_i, q, k_base, v_base, bt_ptr, stride_kp, stride_ks,
                                  stride_vp, stride_vs, qpos, lo, full_end, qk_scale, offs_d,
                                  False, BLOCK_N, PAGE_SIZE, UPCAST, DOT_PRECISION)
    acc, l_i, m_i = _attend_tiles(acc, l_i, m_i, q, k_base, v_base, bt_ptr, stride_kp, stride_ks,
                                  stride_vp, stride_vs, qpos, full_end, hi, qk_scale, offs_d,
                                  True, BLOCK_N, PAGE_SIZE, UPCAST, DOT_PRECISION)
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
    TRIGGER_AFTER_WAIT: tl.constexpr,
):
    if PDL:
        _trigger_and_wait(TRIGGER_AFTER_WAIT)
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


# -- launchers ----------------------------------------------------------------------------------------


def _check_inputs(q: torch.Tensor, k_pages: torch.Tensor, v_pages: torch.Tensor, block_table: torch.Tensor,
                  start: int, out: torch.Tensor | None) -> tuple[int, int, int, int, int]:
    """Shared asserts; returns ``(T, H, D, num_kv_heads, page_size)``."""
    assert q.dim() == 3, f"q must be [T, H, D], got {tuple(q.shape)}"
    t, h, d = q.shape
    assert k_pages.dim() == 4 and k_pages.shape == v_pages.shape, (
        f"k_pages/v_pages must be [num_pages, Hkv, page_size, D] alike, got {tuple(k_pages.shape)} "
        f"and {tuple(v_pages.shape)}")
    _, hkv, page_size, dk = k_pages.shape
    assert dk == d, f"head_dim of q ({d}) and of the pages ({dk}) differ"
    assert d >= 16 and d & (d - 1) == 0, f"head_dim must be a power of two >= 16, got {d}"
    assert page_size >= 16 and page_size & (page_size - 1) == 0, (
        f"page_size must be a power of two >= 16, got {page_size}")
    assert h % hkv == 0, f"{h} q heads are not a multiple of {hkv} kv heads"
    assert q.dtype in (torch.float16, torch.bfloat16, torch.float32), f"unsupported dtype {q.dtype}"
    assert k_pages.dtype == q.dtype and v_pages.dtype == q.dtype, (
        f"pages must be in q's dtype {q.dtype}, got {k_pages.dtype}/{v_pages.dtype}")
    assert q.device == k_pages.device == v_pages.device == block_table.device, "tensors on different devices"
    assert q.stride(2) == 1 and k_pages.stride(3) == 1 and v_pages.stride(3) == 1, "head_dim must be contiguous"
    assert t >= 1 and start >= 0, f"need T >= 1 and start >= 0, got T={t}, start={start}"
    assert block_table.dim() == 1 and block_table.dtype == torch.int32 and block_table.stride(0) == 1, (
        "block_table must be a contiguous 1-D int32 tensor")
    needed = -(-(start + t) // page_size)
    assert block_table.numel() >= needed, f"block_table holds {block_table.numel()} pages, {needed} needed"
    if out is not None:
        assert out.shape == q.shape and out.dtype == q.dtype and out.device == q.device, (
            f"out must be {tuple(q.shape)} {q.dtype}, got {tuple(out.shape)} {out.dtype}")
        assert out.stride(2) == 1, "out's head_dim must be contiguous"
    return t, h, d, hkv, page_size


def _kernel_flags(dtype: torch.dtype, device: torch.device) -> tuple[bool, str]:
    """(UPCAST, DOT_PRECISION): bf16 tiles go to fp32 under the interpreter (its bf16 dot is wrong);
    fp32 data gets exact dots instead of TF32 on GPU."""
    upcast = device.type != "cuda" and dtype == torch.bfloat16
    precision = "ieee" if dtype == torch.float32 or upcast else "tf32"
    return upcast, precision


def _prefill_config(rows: int, head_dim: int) -> dict:
    """Block sizes and launch options of the prefill kernel for ``rows = T * G`` query rows.

    H200, Qwen3-4B shape, T = 1,024: BLOCK_M 64 x BLOCK_N 64, 4 warps, 3 stages gave 261 TFLOP/s
    from start 0 and 446 from start 4,096, against 204 / 365 for 128 x 128 with 8 warps.
    """
    block_m = min(64, max(16, triton.next_power_of_2(rows)))
    return dict(BLOCK_M=block_m, BLOCK_N=64, num_warps=4, num_stages=3)


def paged_prefill_attention(q: torch.Tensor, k_pages: torch.Tensor, v_pages: torch.Tensor,
                            block_table: torch.Tensor, start: int, scale: float, *,
                            out: torch.Tensor | None = None, pdl: bool = False) -> torch.Tensor:
    """Causal GQA attention of ``T`` new queries over the ``L = start + T`` cached positions.

    ``q`` ``[T, H, D]`` (any token/head strides, D contiguous) holds the queries of positions
    ``start .. start + T - 1``; ``k_pages``, ``v_pages`` ``[num_pages, Hkv, page_size, D]`` in q's
    dtype already hold positions ``0 .. L - 1`` (this step's K/V included), position ``p`` in page
    ``block_table[p // page_size]`` at slot ``p % page_size``. Query ``i`` sees keys
    ``0 .. start + i``; q head ``h`` reads kv head ``h // (H / Hkv)``. Scores are ``q.k * scale``,
    the softmax and ``P V`` accumulate in float32. Returns ``[T, H, D]`` in q's dtype (``out`` if
    given). Any T; D a power of two >= 16; page_size a power of two >= 16. ``pdl``: programmatic
    dependent launch where supported; same bits.
    """
    t, h, d, hkv, page_size = _check_inputs(q, k_pages, v_pages, block_table, start, out)
    if out is None:
        out = torch.empty_like(q, memory_format=torch.contiguous_format)
    group = h // hkv
    rows = t * group
    config = _prefill_config(rows, d)
    upcast, precision = _kernel_flags(q.dtype, q.device)
    grid = (hkv, triton.cdiv(rows, config["BLOCK_M"]))
    pdl = use_pdl(pdl, q.device)
    _paged_prefill_kernel[grid](
        q, k_pages, v_pages, block_table, out,
        q.stride(0), q.stride(1),
        k_pages.stride(0), k_pages.stride(1), k_pages.stride(2),
        v_pages.stride(0), v_pages.stride(1), v_pages.stride(2),
        out.stride(0), out.stride(1),
        t, start, scale * LOG2E,
        GROUP=group, HEAD_DIM=d, PAGE_SIZE=page_size, UPCAST=upcast, DOT_PRECISION=precision, PDL=pdl,
        **config, enable_fp_fusion=True, **launch_options(pdl),
    )
    return out


def _decode_scratch(t: int, h: int, num_splits: int, d: int, device: torch.device
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-query-row split buffers: partial output ``[T, H, S, D]``, max and sum ``[T, H, S]``, fp32.

    The one place the decode path allocates (a CUDA-graph version will hand in static buffers).
    """
    part = torch.empty(t, h, num_splits, d, dtype=torch.float32, device=device)
    stats = torch.empty(2, t, h, num_splits, dtype=torch.float32, device=device)
    return part, stats[0], stats[1]


def _decode_config(rows: int, head_dim: int) -> dict:
    """Key tile and launch options of the split-KV decode kernel for ``rows = T * G`` query rows.

    H200, 32k context, 16 splits: 64 keys, 4 warps, 3 stages (50 us) beat 2 stages (72 us), 128-key
    tiles (57 us) and 8 warps; the rows (16 or 64) hardly matter, the kernel is bound by K/V reads.
    """
    return dict(BLOCK_N=64, num_warps=4, num_stages=3)


def paged_decode_attention(q: torch.Tensor, k_pages: torch.Tensor, v_pages: torch.Tensor,
                           block_table: torch.Tensor, start: int, scale: float, *,
                           positions: torch.Tensor | None = None, num_splits: int | None = None,
                           out: torch.Tensor | None = None, pdl: bool = False) -> torch.Tensor:
    """Split-KV (flash-decoding) version of :func:`paged_prefill_attention` for 1..16 new tokens
    (a decode step, or the verification of speculative drafts); same contract and result.

    The ``L = start + T`` positions are cut into ``num_splits`` contiguous chunks (multiples of the
    key tile; trailing splits may be empty), each scanned by one program per kv head, then merged.
    ``num_splits`` defaults to :func:`decode_splits` ``(L)``.

    The kernel reads the start from ``positions[0]`` on the device (``positions``: the step's
    ``[T]`` int64 positions; made from ``start`` when not given), so that a CUDA graph captured
    once replays correctly at any start: then pass ``num_splits`` explicitly (sized for the longest
    context the graph serves), since the host ``start`` is only that of the capture.

    ``pdl``: launch the split kernel and the combine with programmatic dependent launch where
    supported; same bits.
    """
    t, h, d, hkv, page_size = _check_inputs(q, k_pages, v_pages, block_table, start, out)
    assert t <= DECODE_MAX_TOKENS, f"the decode kernel takes at most {DECODE_MAX_TOKENS} new tokens, got {t}"
    length = start + t
    if positions is None:
        positions = torch.tensor([start], dtype=torch.int64, device=q.device)
    assert positions.device == q.device and positions.dtype == torch.int64, "positions must be int64 on q's device"
    if num_splits is None:
        num_splits = decode_splits(length)
    assert num_splits >= 1, f"num_splits must be >= 1, got {num_splits}"
    if out is None:
        out = torch.empty_like(q, memory_format=torch.contiguous_format)
    group = h // hkv
    block_m = max(16, triton.next_power_of_2(t * group))
    config = _decode_config(t * group, d)
    upcast, precision = _kernel_flags(q.dtype, q.device)
    if num_splits == 1:
        part = m_buf = l_buf = out  # unused by the kernel when SINGLE_SPLIT
    else:
        part, m_buf, l_buf = _decode_scratch(t, h, num_splits, d, q.device)
    pdl = use_pdl(pdl, q.device)
    _paged_decode_kernel[(hkv, num_splits)](
        q, k_pages, v_pages, block_table, out, part, m_buf, l_buf,
        q.stride(0), q.stride(1),
        k_pages.stride(0), k_pages.stride(1), k_pages.stride(2),
        v_pages.stride(0), v_pages.stride(1), v_pages.stride(2),
        out.stride(0), out.stride(1),
        t, positions, scale * LOG2E, num_splits,
        NUM_HEADS=h, SINGLE_SPLIT=num_splits == 1, GROUP=group, HEAD_DIM=d, PAGE_SIZE=page_size,
        BLOCK_M=block_m, UPCAST=upcast, DOT_PRECISION=precision, PDL=pdl,
        TRIGGER_AFTER_WAIT=DECODE_TRIGGER_AFTER_WAIT, **config, enable_fp_fusion=True, **launch_options(pdl),
    )
    if num_splits > 1:
        _paged_decode_combine_kernel[(t * h,)](
            part, m_buf, l_buf, out, out.stride(0), out.stride(1), num_splits,
            NUM_HEADS=h, HEAD_DIM=d, BLOCK_S=triton.next_power_of_2(num_splits),
            PDL=pdl, TRIGGER_AFTER_WAIT=COMBINE_TRIGGER_AFTER_WAIT, num_warps=4 if d >= 128 else 2,
            enable_fp_fusion=True, **launch_options(pdl),
        )
    return out


__all__ = ["decode_splits", "paged_decode_attention", "paged_prefill_attention"]
