"""The persistent GEMM of :func:`linear.linear` and :func:`linear_int8.linear_int8` (T > 16 tokens),
taken where the tile config says ``persistent`` (``GemmConfig`` of linear_gemm.py,
``Int8GemmConfig`` of linear_int8_gemm.py); the model-dtype and the W8A16 forms are one kernel
(``INT8``), so that both tile, schedule and finish alike.

Tiling and grid. Output tiles of BLOCK_M x BLOCK_N (BLOCK_K chunks of K, float32 accumulator) over
a grid of ``programs`` (the SMs, or fewer when there is less work), each program looping over its
tiles: tile ``pid``, ``pid + P``, ... in the GROUP_M-swizzled order of the non-persistent kernel, so
that the next tile's loads follow the last one's epilogue without a new launch. With ``tma`` the x
and weight tiles arrive through host-built TMA descriptors, zero-filled past the tensors' ends,
where the tensors allow them (16-byte aligned bases and row strides: :func:`tma_ok`); else the
same code loads them through pointers (cp.async, staged by the pipeliner). The interpreter runs
the descriptors too. The W8A16 form loads the int8 weight tile
as is (half the bytes of BF16 in shared memory), converts it in registers after the shared-memory
load (:func:`int8_to`), accumulates in float32 and applies the row scales in the epilogue;
``swap_ab`` computes the tile transposed (``q x^T``) as linear_int8_gemm.py does.

Fusions. SwiGLU: a program computes the gate tile (weight rows n) and then the up tile (rows
``I_OFF + n``) of the same output tile one after the other with the plain tile's code, keeping the
rounded gate tile in registers, so that it holds one accumulator (the plain kernel's registers)
and equals the plain kernel's [gate; up] output followed by silu_mul bit for bit. Residual:
``round(y + r)``; float32 logits store the accumulator. All through linear_gemm.py's epilogue.

Split tail (``split_rows`` > 0). Where the tiles would fill the last wave poorly (Qwen3-4B's
o_proj and down at T = 1,024: 160 tiles of 128 x 128 for 132 SMs, two waves of which the second is
a fifth full), the last ``split_rows`` row blocks of tiles are computed in ``split_k`` ranges of
K, after the whole tiles: each range ("unit") stores its float32 partial (scaled, for W8A16) in a
workspace ``[split_k, rows, N_w]`` and counts itself on its tile's counter (an atomic add, on the
GEMV's split counters, 0 between launches); the unit that arrives last adds the tile's partials in
split order (deterministic: the order does not depend on arrival), runs the epilogue (SwiGLU on
the gate and up partials, residual) and resets the counter. Units go
to programs in contiguous ranges sized so that programs with one whole tile fewer take more units
(:func:`balance`). The rows split and ``split_k`` are the config's (the rule picks them from the
weight's row count, the same for the fused SwiGLU call and the plain call of the per-op chain),
hence bit-identical fused and per-op results there too. :func:`split_plan` is that rule.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from tileinfer.backends.triton.device_functions import round_to, silu_mul_f32
from tileinfer.backends.triton.interpreter import sms_of
from tileinfer.backends.triton.linear_gemm import store_gemm
from tileinfer.backends.triton.linear_split_counters import split_counters
from tileinfer.backends.triton.linear_int8_gemv import int8_to

# The split rule's cost model (estimates until the sweep measures the split tiles): one SM's MMA
# throughput (the non-persistent BF16 GEMM runs Qwen3-4B's gate_up at T = 1,024 at 578 TFLOP/s on
# an H200, 4.4 per SM: 176.5 us in bench/results/NVIDIA-H200/tiles_a1a4273/linear_int8.json), the
# bandwidth of the partials' write and read (mostly in L2: a guess), and the fixed cost of a split
# (the last units' sums after the others: a guess).
SM_FLOPS = 4.4e12
PARTIAL_BYTES_PER_S = 3.0e12
SPLIT_FIXED_US = 2.0
SPLIT_CANDIDATES = (2, 3, 4, 6, 8)


@functools.lru_cache(maxsize=None)
def balance(dp_tiles: int, dp_cost: int, units: int, unit_cost: int, programs: int) -> tuple[int, int, int]:
    """How many split units each program takes after its whole tiles: ``(n_lo, n_hi, makespan)``.

    Whole tiles go round-robin (program p gets tiles p, p + P, ...): the first ``dp_tiles % P``
    programs hold one more. Programs with that extra tile take ``n_lo`` units, the others ``n_hi``,
    in contiguous ranges (program p's first unit is ``p * n_lo`` for p < r, else ``r * n_lo + (p -
    r) * n_hi``); ``n_hi - n_lo`` covers the missing tile's cost. Costs in BLOCK_K chunks: a whole
    tile ``dp_cost``, a unit ``unit_cost``. ``makespan``: the busiest program's chunks."""
    q, r = divmod(dp_tiles, programs)
    if units == 0:
        return 0, 0, (q + (r > 0)) * dp_cost
    if r == 0:
        n = triton.cdiv(units, programs)
        return n, n, q * dp_cost + n * unit_cost
    d = dp_cost // unit_cost
    n_lo = max(0, triton.cdiv(units - (programs - r) * d, programs))
    n_hi = min(n_lo + d, triton.cdiv(units - r * n_lo, programs - r))
    return n_lo, n_hi, max((q + 1) * dp_cost + n_lo * unit_cost, q * dp_cost + n_hi * unit_cost)


@functools.lru_cache(maxsize=None)
def split_plan(M: int, n_w: int, K: int, block_m: int, block_n: int, block_k: int, programs: int) -> tuple[int, int]:
    """``(split_rows, split_k)`` for a persistent GEMM of ``M`` rows on a weight of ``n_w`` rows
    (plain tiles; 2I for the fused SwiGLU weight, as the per-op chain's plain call sees it).

    Rule: the estimated time of every candidate (no split; or the last ``b`` row blocks in ``s``
    ranges of K, each of at least 2 chunks) is the busiest program's chunks (:func:`balance`) at
    ``SM_FLOPS`` per SM, plus the partials' bytes (written and read once, float32) at
    ``PARTIAL_BYTES_PER_S`` and ``SPLIT_FIXED_US``; the fastest wins, ties to fewer splits."""
    k_tiles = triton.cdiv(K, block_k)
    num_pid_m, num_pid_n = triton.cdiv(M, block_m), triton.cdiv(n_w, block_n)
    chunk_us = 2 * block_m * block_n * block_k / SM_FLOPS * 1e6
    best, best_us = (0, 1), balance(num_pid_m * num_pid_n, k_tiles, 0, 1, programs)[2] * chunk_us
    for s in SPLIT_CANDIDATES:
        per_split = triton.cdiv(k_tiles, s)
        if per_split < 2 or triton.cdiv(k_tiles, per_split) != s:
            continue
        for b in range(1, num_pid_m + 1):
            units = b * num_pid_n * s
            span = balance((num_pid_m - b) * num_pid_n, k_tiles, units, per_split, programs)[2]
            partial_bytes = 8 * (M - (num_pid_m - b) * block_m) * n_w * s
            us = span * chunk_us + partial_bytes / PARTIAL_BYTES_PER_S * 1e6 + SPLIT_FIXED_US
            if us < best_us:
                best, best_us = (b, s), us
    return best


def tma_ok(*tensors: torch.Tensor) -> bool:
    """Whether TMA descriptors can be made for these 2-D row-major tensors: 16-byte aligned base
    and row stride (a compiled launch; the interpreter runs descriptors too)."""
    return all(t.data_ptr() % 16 == 0 and (t.stride(0) * t.element_size()) % 16 == 0 and t.stride(1) == 1
               for t in tensors)


@triton.jit
def _swizzled(tile, rows, num_pid_n, GROUP_M: tl.constexpr):
    """(pid_m, pid_n) of whole tile ``tile`` among ``rows`` row blocks x ``num_pid_n``, GROUP_M-swizzled."""
    num_pid_in_group = GROUP_M * num_pid_n
    first_pid_m = (tile // num_pid_in_group) * GROUP_M
    group_size_m = tl.maximum(tl.minimum(rows - first_pid_m, GROUP_M), 1)
    pid_m = first_pid_m + (tile % num_pid_in_group) % group_size_m
    pid_n = (tile % num_pid_in_group) // group_size_m
    return pid_m, pid_n


@triton.jit
def _tile_sum(x_ptr, w_ptr, M, N, K, m0, n0, w_off, kb_lo, kb_hi, stride_xm, stride_wn,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, DOT_F32: tl.constexpr,
              EVEN_K: tl.constexpr, INT8: tl.constexpr, BITS: tl.constexpr, SWAP_AB: tl.constexpr,
              TMA: tl.constexpr):
    """float32 sums over the K chunks [kb_lo, kb_hi) of x rows ``m0..`` times weight rows ``w_off +
    (n0.. mod N)``: ``[BLOCK_M, BLOCK_N]``, or ``[BLOCK_N, BLOCK_M]`` with SWAP_AB."""
    if SWAP_AB:
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    offs_k = tl.arange(0, BLOCK_K)
    if not TMA:
        rows_m = ((m0 + tl.arange(0, BLOCK_M)) % M).to(tl.int64)  # tails re-read valid rows; not stored
        rows_w = ((n0 + tl.arange(0, BLOCK_N)) % N + w_off).to(tl.int64)
        a_ptrs = x_ptr + rows_m[:, None] * stride_xm + offs_k[None, :]
        b_ptrs = w_ptr + rows_w[:, None] * stride_wn + offs_k[None, :]
    for kb in range(kb_lo, kb_hi):
        k0 = kb * BLOCK_K
        if TMA:
            a = x_ptr.load([m0, k0])
            b = w_ptr.load([n0 + w_off, k0])
        elif EVEN_K:
            a = tl.load(a_ptrs + k0)
            b = tl.load(b_ptrs + k0)
        else:
            k_mask = (offs_k < K - k0)[None, :]
            a = tl.load(a_ptrs + k0, mask=k_mask, other=0.0)
            b = tl.load(b_ptrs + k0, mask=k_mask, other=0)
        if DOT_F32:
            a = a.to(tl.float32)
            if not INT8:
                b = b.to(tl.float32)
        if INT8:
            b = int8_to(b, a.dtype, BITS)
        if SWAP_AB:
            acc = tl.dot(b, tl.trans(a), acc, input_precision="ieee")
        else:
            acc = tl.dot(a, tl.trans(b), acc, input_precision="ieee")
    if SWAP_AB:
        acc = tl.trans(acc)
    return acc


@triton.jit
def _sum_partials(p_ptrs, mask, stride_ps, SPLITS: tl.constexpr):
    """The partials of splits 0, 1, ..., SPLITS - 1 added in that order, read past L1 (other
    programs wrote them)."""
    acc = tl.load(p_ptrs, mask=mask, other=0.0, cache_modifier=".cg")
    for s in range(1, SPLITS):
        acc += tl.load(p_ptrs + s * stride_ps, mask=mask, other=0.0, cache_modifier=".cg")
    return acc


@triton.jit
def _gemm_persistent_kernel(
    x_ptr, w_ptr, s_ptr, y_ptr, r_ptr, p_ptr, c_ptr,
    M, N, K, I_OFF, stride_xm, stride_wn, stride_ym, stride_rm, stride_ps, stride_pm,
    DP_ROWS, NUM_PROGRAMS, N_LO, N_HI, KB_PER_SPLIT,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    SWIGLU: tl.constexpr, DOT_F32: tl.constexpr, EVEN_K: tl.constexpr, RESIDUAL: tl.constexpr,
    INT8: tl.constexpr, BITS: tl.constexpr, SWAP_AB: tl.constexpr, TMA: tl.constexpr,
    FLATTEN: tl.constexpr, SPLIT: tl.constexpr, SPLITS: tl.constexpr,
):
    """y = x w^T (W8A16: ``(x q^T) * scale``) on N output columns (I when SWIGLU: gate rows n, up
    rows I_OFF + n), RESIDUAL adding ``r``. Whole tiles: row blocks [0, DP_ROWS); with SPLIT the
    others in SPLITS ranges of KB_PER_SPLIT chunks (partials ``p``, counters ``c``). ``x_ptr`` and
    ``w_ptr`` are TMA descriptors with TMA. ``s_ptr``: the float32 row scales (INT8). Without SPLIT
    the loop body has no branch (the gate half's store is masked off): Triton 3.6 cannot flatten
    a tile loop whose body holds an ``if``."""
    pid = tl.program_id(0)
    HALVES: tl.constexpr = 2 if SWIGLU else 1
    num_pid_n = tl.cdiv(N, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    dp_tiles = DP_ROWS * num_pid_n
    my_dp = tl.maximum(tl.cdiv(dp_tiles - pid, NUM_PROGRAMS), 0)
    dp_iters = HALVES * my_dp
    n_iter = dp_iters
    if SPLIT:
        units = (tl.cdiv(M, BLOCK_M) - DP_ROWS) * num_pid_n * HALVES * SPLITS
        r = dp_tiles % NUM_PROGRAMS
        u_lo = tl.where(pid < r, pid * N_LO, r * N_LO + (pid - r) * N_HI)
        n_iter += tl.maximum(tl.minimum(tl.where(pid < r, N_LO, N_HI), units - u_lo), 0)
    out_ty = y_ptr.dtype.element_ty
    gate = tl.zeros((BLOCK_M, BLOCK_N), dtype=out_ty)  # the rounded gate tile (SWIGLU), kept for half 1
    for v in tl.range(0, n_iter, flatten=FLATTEN):
        is_dp = v < dp_iters
        pid_m, pid_n = _swizzled(tl.where(is_dp, pid + (v // HALVES) * NUM_PROGRAMS, 0), DP_ROWS, num_pid_n, GROUP_M)
        half = v % HALVES
        kb_lo = 0
        kb_hi = k_tiles
        if SPLIT:
            u = u_lo + v - dp_iters
            band_tile = u // (SPLITS * HALVES)
            split = u % SPLITS
            pid_m = tl.where(is_dp, pid_m, DP_ROWS + band_tile // num_pid_n)
            pid_n = tl.where(is_dp, pid_n, band_tile % num_pid_n)
            half = tl.where(is_dp, half, (u // SPLITS) % HALVES)
            kb_lo = tl.where(is_dp, 0, split * KB_PER_SPLIT)
            kb_hi = tl.where(is_dp, k_tiles, tl.minimum(kb_lo + KB_PER_SPLIT, k_tiles))
        w_off = half * I_OFF
        acc = _tile_sum(x_ptr, w_ptr, M, N, K, pid_m * BLOCK_M, pid_n * BLOCK_N, w_off, kb_lo, kb_hi, stride_xm,
                        stride_wn, BLOCK_M, BLOCK_N, BLOCK_K, DOT_F32, EVEN_K, INT8, BITS, SWAP_AB, TMA)
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        if INT8:
            acc = acc * tl.load(s_ptr + offs_n % N + w_off)[None, :]
        if SPLIT:
            if is_dp:
                gate = _store_tile(acc, gate, half, y_ptr, r_ptr, offs_m, offs_n, M, N, stride_ym, stride_rm, out_ty,
                                   SWIGLU, RESIDUAL)
            else:
                _split_unit(acc, p_ptr, c_ptr, y_ptr, r_ptr, offs_m, offs_n, M, N, I_OFF, w_off, split,
                            band_tile, DP_ROWS * BLOCK_M, stride_ps, stride_pm, stride_ym, stride_rm, out_ty,
                            SWIGLU, RESIDUAL, HALVES * SPLITS, SPLITS)
        else:
            gate = _store_tile(acc, gate, half, y_ptr, r_ptr, offs_m, offs_n, M, N, stride_ym, stride_rm, out_ty,
                               SWIGLU, RESIDUAL)


@triton.jit
def _store_tile(acc, gate, half, y_ptr, r_ptr, offs_m, offs_n, M, N, stride_ym, stride_rm, out_ty: tl.constexpr,
                SWIGLU: tl.constexpr, RESIDUAL: tl.constexpr):
    """A whole tile's epilogue; returns the gate tile to keep. SWIGLU: at half 0 (the gate) the
    rounded tile is kept and nothing stored (the store is masked off: no branch); at half 1 (the
    up) ``silu(gate) * round(up)`` is stored."""
    if SWIGLU:
        y = silu_mul_f32(gate.to(tl.float32), round_to(acc, out_ty))
        gate = acc.to(out_ty)
        M = tl.where(half == 1, M, 0)
    else:
        y = acc
    store_gemm(y, y_ptr, r_ptr, offs_m, offs_n, M, N, stride_ym, stride_rm, RESIDUAL)
    return gate


@triton.jit
def _split_unit(acc, p_ptr, c_ptr, y_ptr, r_ptr, offs_m, offs_n, M, N, I_OFF, w_off, split, band_tile, row0,
                stride_ps, stride_pm, stride_ym, stride_rm, out_ty: tl.constexpr, SWIGLU: tl.constexpr,
                RESIDUAL: tl.constexpr, ARRIVALS: tl.constexpr, SPLITS: tl.constexpr):
    """A split unit's end: its float32 partial (rows ``offs_m - row0`` of the workspace, columns
    ``w_off + offs_n``) stored, then counted on the band tile's counter; the tile's last unit adds
    the partials in split order, stores the output tile through the epilogue and sets the counter
    back to 0 (the GEMV's ``reduce_if_last`` protocol, on its counters: linear_gemv.py)."""
    mask = (offs_m < M)[:, None] & (offs_n < N)[None, :]
    p_ptrs = p_ptr + (offs_m - row0).to(tl.int64)[:, None] * stride_pm + offs_n[None, :]
    tl.store(p_ptrs + split * stride_ps + w_off, acc, mask=mask)
    tl.debug_barrier()  # every thread's partial is written before the count
    if tl.atomic_add(c_ptr + band_tile, 1, sem="acq_rel", scope="gpu") == ARRIVALS - 1:
        tl.debug_barrier()  # the last unit: every partial is there
        acc = _sum_partials(p_ptrs, mask, stride_ps, SPLITS)
        if SWIGLU:
            gate = acc.to(out_ty)
            acc = _sum_partials(p_ptrs + I_OFF, mask, stride_ps, SPLITS)
            acc = silu_mul_f32(gate.to(tl.float32), round_to(acc, out_ty))
        store_gemm(acc, y_ptr, r_ptr, offs_m, offs_n, M, N, stride_ym, stride_rm, RESIDUAL)
        tl.atomic_xchg(c_ptr + band_tile, 0)  # the counters are 0 between launches


def launch_gemm_persistent(x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor | None, out: torch.Tensor,
                           residual: torch.Tensor | None, cfg, n_out: int, i_off: int, swiglu: bool,
                           dot_f32: bool) -> None:
    """The persistent GEMM on checked (and already normalized) arguments: ``w`` ``[N_w, K]`` in x's
    dtype, or int8 with ``scale`` float32 ``[N_w]``; ``cfg`` a ``GemmConfig`` or ``Int8GemmConfig``
    with ``persistent`` (its ``bit_convert`` / ``swap_ab`` where it has them). One launch; a split
    tail uses a float32 workspace and the GEMV's split counters (``split_counters``)."""
    M, K = x.shape
    n_w = w.shape[0]
    bm, bn, bk = cfg.block_m, cfg.block_n, cfg.block_k
    programs = cfg.programs or sms_of(x.device)
    num_pid_m, num_pid_n, k_tiles = triton.cdiv(M, bm), triton.cdiv(n_out, bn), triton.cdiv(K, bk)
    halves = 2 if swiglu else 1
    split_rows = min(cfg.split_rows, num_pid_m)
    per_split = triton.cdiv(k_tiles, cfg.split_k)
    splits = triton.cdiv(k_tiles, per_split) if split_rows else 1
    dp_rows = num_pid_m - split_rows
    band_tiles = split_rows * num_pid_n
    units = band_tiles * halves * splits
    programs = min(programs, dp_rows * num_pid_n + units)
    n_lo, n_hi, _ = balance(dp_rows * num_pid_n, halves * k_tiles, units, per_split, programs)
    r = residual if residual is not None else out
    part, counts = out, out
    if split_rows:
        part = torch.empty((splits, M - dp_rows * bm, n_w), dtype=torch.float32, device=x.device)
        counts = split_counters(x.device, band_tiles)
    tma = cfg.tma and tma_ok(x, w)
    x_arg = TensorDescriptor(x, [M, K], [x.stride(0), 1], [bm, bk]) if tma else x
    w_arg = TensorDescriptor(w, [n_w, K], [w.stride(0), 1], [bn, bk]) if tma else w
    int8 = scale is not None
    _gemm_persistent_kernel[(programs,)](
        x_arg, w_arg, scale if int8 else w, out, r, part, counts, M, n_out, K, i_off, x.stride(0), w.stride(0),
        out.stride(0), r.stride(0), part.stride(0), part.stride(-2), dp_rows, programs, n_lo, n_hi, per_split,
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=cfg.group_m, SWIGLU=swiglu, DOT_F32=dot_f32,
        EVEN_K=K % bk == 0, RESIDUAL=residual is not None, INT8=int8, BITS=getattr(cfg, "bit_convert", True),
        SWAP_AB=getattr(cfg, "swap_ab", False), TMA=tma, FLATTEN=cfg.flatten, SPLIT=split_rows > 0, SPLITS=splits,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages, enable_fp_fusion=True)


__all__ = ["balance", "launch_gemm_persistent", "split_plan", "tma_ok"]
