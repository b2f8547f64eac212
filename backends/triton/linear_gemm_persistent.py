"""The persistent GEMM of :func:`linear.linear` (T > 16 tokens), taken where the tile config says
``persistent`` (``GemmConfig`` of linear_tiles.py): one kernel for both weight formats (``INT8``),
so that both tile, schedule and finish alike.

Tiling and grid. Output tiles of BLOCK_M x BLOCK_N (BLOCK_K chunks of K, float32 accumulator) over
a grid of ``programs`` (the SMs, or fewer when there is less work), each program looping over its
tiles: tile ``pid``, ``pid + P``, ... in the GROUP_M-swizzled order of the non-persistent kernel, so
that the next tile's loads follow the last one's epilogue without a new launch. With ``tma`` the x
and weight tiles arrive through host-built TMA descriptors, zero-filled past the tensors' ends,
where the tensors allow them (16-byte aligned bases and row strides: :func:`tma_ok`); else the
same code loads them through pointers (cp.async, staged by the pipeliner). The interpreter runs
the descriptors too. The W8A16 form loads the int8 weight tile as is (half the bytes of BF16 in
shared memory), converts it in registers after the shared-memory load (:func:`int8_to`; a weight in
the ``fragments`` layout, ``FRAG``, put back in column order first: linear_layout.py),
accumulates in float32 and applies the row scales in the epilogue; ``swap_ab`` computes the tile
transposed (``q x^T``) as linear_gemm.py does. ``SCALED``: the row scales, of an int8 weight or of a
model-dtype one (int8_dequant.py's values: the W8A16 arithmetic on the model-dtype tiles).

Fusions. SwiGLU: a program computes the gate tile (weight rows n) and then the up tile (rows
``I_OFF + n``) of the same output tile one after the other with the plain tile's code, keeping the
rounded gate tile in registers, so that it holds one accumulator (the plain kernel's registers)
and equals the plain kernel's [gate; up] output followed by silu_mul bit for bit. Residual:
``round(y + r)``; float32 logits store the accumulator. All through :func:`store_tile`, the
epilogue of linear_gemm.py.

Split tail (``split_rows`` > 0). Where the tiles would fill the last wave poorly (Qwen3-4B's
o_proj and down at T = 1,024: 160 tiles of 128 x 128 for 132 SMs, two waves of which the second is
a fifth full), the last ``split_rows`` row blocks of tiles are computed in ``split_k`` ranges of
K, after the whole tiles: each range ("unit") stores its float32 partial (scaled, for W8A16) in a
workspace ``[split_k, rows, N_w]`` and counts itself on its tile's counter (an atomic add on the
caller's ``counters``, 0 between launches: the protocol of linear_gemv.py's ``reduce_if_last``);
the unit that arrives last adds the tile's partials in split order (deterministic: the order does
not depend on arrival), runs the epilogue (SwiGLU on the gate and up partials, residual) and
resets the counter. Units go to programs in contiguous ranges sized so that programs with one
whole tile fewer take more units (``balance`` of linear_tiles.py). The rows split and ``split_k``
are the config's (``split_plan`` of linear_tiles.py estimates them from the weight's row count, the
same for the fused SwiGLU call and the plain call of the per-op chain), hence bit-identical fused
and per-op results there too.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from tileinfer.backends.triton.device_functions import dot_chunk, load_chunk, round_to, silu_mul_f32, store_tile
from tileinfer.backends.triton.interpreter import sms_of
from tileinfer.backends.triton.linear_gemm import KernelLaunch
from tileinfer.backends.triton.linear_layout import rows_of_fragments
from tileinfer.backends.triton.linear_tiles import INT8_CONVERTS, GemmConfig, balance


def tma_ok(*tensors: torch.Tensor) -> bool:
    """Whether TMA descriptors can be made for these 2-D row-major tensors: 16-byte aligned base
    and row stride (a compiled launch; the interpreter runs descriptors too)."""
    return all(t.data_ptr() % 16 == 0 and (t.stride(0) * t.element_size()) % 16 == 0 and t.stride(1) == 1
               for t in tensors)


def operands(x: torch.Tensor, w: torch.Tensor, cfg: GemmConfig) -> tuple[bool, object, object]:
    """``(tma, x_arg, w_arg)``: whether the launch takes TMA descriptors (``cfg.tma`` where
    :func:`tma_ok`), and the x and weight arguments: descriptors of ``[BLOCK_M | BLOCK_N, BLOCK_K]``
    boxes, or the tensors."""
    tma = cfg.tma and tma_ok(x, w)
    if not tma:
        return False, x, w
    return (True, TensorDescriptor(x, list(x.shape), [x.stride(0), 1], [cfg.block_m, cfg.block_k]),
            TensorDescriptor(w, list(w.shape), [w.stride(0), 1], [cfg.block_n, cfg.block_k]))


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
              TMA: tl.constexpr, FRAG: tl.constexpr):
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
    for kb in tl.range(kb_lo, kb_hi):
        k0 = kb * BLOCK_K
        if TMA:
            a = x_ptr.load([m0, k0])
            b = w_ptr.load([n0 + w_off, k0])
        else:
            a = load_chunk(a_ptrs, k0, offs_k, K, EVEN_K)
            b = load_chunk(b_ptrs, k0, offs_k, K, EVEN_K)
        if FRAG:
            b = rows_of_fragments(b, BLOCK_K)
        acc = dot_chunk(a, b, acc, DOT_F32, INT8, BITS, SWAP_AB)
    if SWAP_AB:
        acc = tl.trans(acc)
    return acc


@triton.jit
def _sum_partials(p_ptrs, mask, stride_ps, pieces):
    """The partials of pieces 0, 1, ..., pieces - 1 added in that order, read past L1 (other
    programs wrote them)."""
    acc = tl.load(p_ptrs, mask=mask, other=0.0, cache_modifier=".cg")
    for s in range(1, pieces):
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
    FLATTEN: tl.constexpr, SPLIT: tl.constexpr, SPLITS: tl.constexpr, FRAG: tl.constexpr,
    SCALED: tl.constexpr,
):
    """y = x w^T (W8A16: ``(x q^T) * scale``) on N output columns (I when SWIGLU: gate rows n, up
    rows I_OFF + n), RESIDUAL adding ``r``. Whole tiles: row blocks [0, DP_ROWS); with SPLIT the
    others in SPLITS ranges of KB_PER_SPLIT chunks (partials ``p``, counters ``c``). ``x_ptr`` and
    ``w_ptr`` are TMA descriptors with TMA. ``s_ptr``: the float32 row scales (SCALED; w int8 where
    INT8). Without SPLIT the loop body has no branch (the gate half's store is masked off): Triton
    3.6 cannot flatten a tile loop whose body holds an ``if``."""
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
                        stride_wn, BLOCK_M, BLOCK_N, BLOCK_K, DOT_F32, EVEN_K, INT8, BITS, SWAP_AB, TMA, FRAG)
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        if SCALED:
            acc = acc * tl.load(s_ptr + offs_n % N + w_off)[None, :]
        if SPLIT:
            if is_dp:
                gate = _finish_tile(acc, gate, half, y_ptr, r_ptr, offs_m, offs_n, M, N, stride_ym, stride_rm, out_ty,
                                   SWIGLU, RESIDUAL)
            else:
                mask = (offs_m < M)[:, None] & (offs_n < N)[None, :]
                p_ptrs = p_ptr + (offs_m - DP_ROWS * BLOCK_M).to(tl.int64)[:, None] * stride_pm + offs_n[None, :]
                _split_unit(acc, p_ptrs, split, SPLITS, stride_ps, c_ptr, band_tile, HALVES * SPLITS, mask, y_ptr,
                            r_ptr, offs_m, offs_n, M, N, I_OFF, w_off, stride_ym, stride_rm, out_ty, SWIGLU, RESIDUAL)
        else:
            gate = _finish_tile(acc, gate, half, y_ptr, r_ptr, offs_m, offs_n, M, N, stride_ym, stride_rm, out_ty,
                               SWIGLU, RESIDUAL)


@triton.jit
def _finish_tile(acc, gate, half, y_ptr, r_ptr, offs_m, offs_n, M, N, stride_ym, stride_rm, out_ty: tl.constexpr,
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
    store_tile(y, y_ptr, r_ptr, offs_m, offs_n, M, N, stride_ym, stride_rm, RESIDUAL)
    return gate


@triton.jit
def _split_unit(acc, p_ptrs, piece, pieces, stride_ps, c_ptr, counter, arrivals, mask, y_ptr, r_ptr, offs_m, offs_n,
                M, N, I_OFF, w_off, stride_ym, stride_rm, out_ty: tl.constexpr, SWIGLU: tl.constexpr,
                RESIDUAL: tl.constexpr):
    """The end of one piece of a tile split in K (a split tail's unit): its float32 partial stored
    at ``p_ptrs + piece * stride_ps + w_off`` (``p_ptrs``: the tile's
    elements in the workspace slot of its first piece; a SwiGLU tile's up partials ``I_OFF``
    columns on), then counted on ``counter``; the tile's last of ``arrivals`` adds its ``pieces``
    partials in piece order, stores the output tile through the epilogue and sets the counter back
    to 0 (the protocol of linear_gemv.py's ``reduce_if_last``)."""
    tl.store(p_ptrs + piece * stride_ps + w_off, acc, mask=mask)
    tl.debug_barrier()  # every thread's partial is written before the count
    if tl.atomic_add(c_ptr + counter, 1, sem="acq_rel", scope="gpu") == arrivals - 1:
        tl.debug_barrier()  # the last piece: every partial is there
        acc = _sum_partials(p_ptrs, mask, stride_ps, pieces)
        if SWIGLU:
            gate = acc.to(out_ty)
            acc = _sum_partials(p_ptrs + I_OFF, mask, stride_ps, pieces)
            acc = silu_mul_f32(gate.to(tl.float32), round_to(acc, out_ty))
        store_tile(acc, y_ptr, r_ptr, offs_m, offs_n, M, N, stride_ym, stride_rm, RESIDUAL)
        tl.atomic_xchg(c_ptr + counter, 0)  # the counters are 0 between launches


def persistent_launch(x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor | None, out: torch.Tensor,
                      residual: torch.Tensor | None, cfg: GemmConfig, n_out: int, i_off: int, swiglu: bool,
                      dot_f32: bool, counters: torch.Tensor | None, frag: bool = False) -> KernelLaunch:
    """The persistent GEMM's launch on checked arguments: ``w`` ``[N_w, K]`` in x's dtype, or int8
    with ``scale`` float32 ``[N_w]`` (``frag``: in the ``fragments`` layout; a scale with a weight in
    x's dtype is applied alike); ``cfg`` with ``persistent``. A split tail uses a float32 workspace
    and ``counters`` (int32 zeros, one per split tile: :func:`split_tiles`; made for the call where
    None)."""
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
        if counters is None:
            counters = torch.zeros(band_tiles, dtype=torch.int32, device=x.device)
        assert counters.dtype == torch.int32 and counters.numel() >= band_tiles and counters.device == x.device, (
            f"the split tail needs {band_tiles} int32 counters on {x.device}, got {counters.numel()} {counters.dtype}")
        counts = counters
    tma, x_arg, w_arg = operands(x, w, cfg)
    int8 = w.dtype == torch.int8
    args = (x_arg, w_arg, w if scale is None else scale, out, r, part, counts, M, n_out, K, i_off, x.stride(0),
            w.stride(0), out.stride(0), r.stride(0), part.stride(0), part.stride(-2), dp_rows, programs, n_lo, n_hi,
            per_split)
    return KernelLaunch(_gemm_persistent_kernel, (programs,), args, dict(
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=cfg.group_m, SWIGLU=swiglu, DOT_F32=dot_f32,
        EVEN_K=K % bk == 0, RESIDUAL=residual is not None, INT8=int8, BITS=INT8_CONVERTS[cfg.int8_convert],
        SWAP_AB=cfg.swap_ab, TMA=tma, FLATTEN=cfg.flatten, SPLIT=split_rows > 0, SPLITS=splits,
        FRAG=frag, SCALED=scale is not None, num_warps=cfg.num_warps,
        num_stages=cfg.num_stages, enable_fp_fusion=True))


def launch_gemm_persistent(x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor | None, out: torch.Tensor,
                           residual: torch.Tensor | None, cfg: GemmConfig, n_out: int, i_off: int, swiglu: bool,
                           dot_f32: bool, counters: torch.Tensor | None, frag: bool = False) -> None:
    """Runs :func:`persistent_launch`'s launch."""
    persistent_launch(x, w, scale, out, residual, cfg, n_out, i_off, swiglu, dot_f32, counters, frag)()


def split_tiles(M: int, n_out: int, cfg: GemmConfig) -> int:
    """The counters a persistent launch with ``cfg`` on ``M`` rows and ``n_out`` output columns
    counts on: one per tile of its split tail (0 without)."""
    return min(cfg.split_rows, triton.cdiv(M, cfg.block_m)) * triton.cdiv(n_out, cfg.block_n)


__all__ = ["launch_gemm_persistent", "operands", "persistent_launch", "split_tiles", "tma_ok"]
