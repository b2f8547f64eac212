"""Attention inputs from the fused q/k/v projection in one kernel: q/k RMSNorm, RoPE and the paged
K/V write; twin: backends/reference/attention_inputs.py (split, ``rms_norm`` of q and k heads,
``apply_rope``, ``write_pages``). One launch replaces the chain of per-op kernels (copies of the
qkv slices, ``rms_norm`` twice, ``apply_rope`` twice, ``write_kv``), bit for bit.

Tiling and grid: a program handles ``BLOCK_H`` heads of one token, loaded from
``qkv[T, (H + 2 Hkv) * D]`` as two ``[BLOCK_H, BLOCK_HALF]`` tiles (channels ``i`` and ``i + D/2``,
the pairs RoPE mixes), with ``(BLOCK_H, BLOCK_HALF, num_warps) = norm_launch_config(D, heads)``
(8 heads of 128, 2 warps): exactly the tiles of the per-op ``rms_norm`` on ``[T, heads, D]``, and
the same device functions (:func:`rms_norm_halves`, :func:`rope_rotate`) as ``rms_norm`` and
``apply_rope``. Grid ``(T, cdiv(H, BLOCK_H) + cdiv(Hkv, BLOCK_H))``: program column
``j < cdiv(H, BLOCK_H)`` normalizes and rotates q heads ``j * BLOCK_H ..`` and stores them in q
``[T, H, D]``; the other columns normalize and rotate their k heads and store them, with the v heads
beside them (copied), at the token's page and slot. The normalized value is rounded to the model
dtype after the weight multiply and before RoPE, as the chain stores it, so the kernel equals the
chain bit for bit. One launch serves both parts only where ``norm_launch_config(D, H) ==
norm_launch_config(D, Hkv)`` (e.g. ``D`` = 128 with ``H, Hkv >= 8``: Qwen3), since each head's
``tl.sum`` must keep its per-op tile and warps; otherwise (few heads) :func:`attention_inputs`
launches the same kernel twice, over the kv columns (:func:`k_norm_rope_write`) then the q columns
(:func:`q_norm_rope`), each with its heads' config.

INT8 pages (``k_scale``, ``v_scale``, ``k_smooth``: ``kv_store=paged_int8``): the kv columns divide
the rotated k (rounded to the model dtype, as the chain stores it) by the key smoothing and
quantize it and v with one float32 scale per vector, bit for bit as ``write_quantized`` of
backends/reference/kv_quant.py: ``max(absmax, 1e-12) * float32(1/127)``, IEEE divisions
(``div_rn``), round half to even (``store_kv_int8`` of device_functions.py); the
kernel is compiled without FMA contraction, so nothing is fused differently.

Programmatic dependent launch (``pdl=True``, Hopper; pdl.py): the kernel loads its norm weight (q's
or k's, immutable) before the grid dependency wait; positions, the block table, qkv and the pages
are touched after it. It lets the next kernel (the decode attention) launch only after that wait,
i.e. once the qkv GEMV has completed: launched earlier, the attention's programs (about one per
multiprocessor, with nothing to do before their own wait) were placed beside the GEMV's, unevenly,
and streamed the KV cache slower. Same bits either way.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from tileinfer.backends.triton import FLOAT_DTYPES
from tileinfer.backends.triton.device_functions import (load_weight_halves, page_slot, rms_norm_halves, rope_rotate,
                                                        store_kv_int8)
from tileinfer.backends.triton.kv_write import check_paged_write, check_paged_write_int8
from tileinfer.backends.triton.paged_attention_int8 import Int8Pages, int8_arguments, int8_pages
from tileinfer.backends.triton.pdl import launch_options, use_pdl
from tileinfer.backends.triton.rms_norm import norm_launch_config
from tileinfer.backends.triton.rope import check_rope_tables


@triton.jit
def _norm_rope(src, heads, offs, mask, wa, wb, c, s, eps, DTYPE: tl.constexpr, D: tl.constexpr):
    """Heads ``heads`` ``[BLOCK_H, 1]`` of the vectors at ``src + heads * D``: RMSNorm with the
    weight halves ``wa``, ``wb`` (rounded to DTYPE), then RoPE by ``c``, ``s`` ``[1, BLOCK_HALF]``;
    returns the two rotated halves."""
    x = src + heads * D + offs
    a = tl.load(x, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(x + D // 2, mask=mask, other=0.0).to(tl.float32)
    na, nb = rms_norm_halves(a, b, wa, wb, D, eps, DTYPE)
    return rope_rotate(na.to(tl.float32), nb.to(tl.float32), c, s, DTYPE)


@triton.jit
def _attention_inputs_kernel(
    qkv_ptr, q_w_ptr, k_w_ptr, cos_ptr, sin_ptr, pos_ptr, q_ptr, kp_ptr, vp_ptr, bt_ptr,
    ks_ptr, vs_ptr, smooth_ptr,
    stride_qkv_t, stride_q_t, stride_q_h, stride_cs, stride_p_page, stride_p_h, stride_p_slot,
    stride_s_page, stride_s_h,
    eps, col0,
    H: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr, PAGE_SIZE: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr, KV_INT8: tl.constexpr, SMOOTH: tl.constexpr,
    PDL: tl.constexpr,
):
    """Program ``(t, c)``, column ``j = col0 + c`` of the full grid ``(T, cdiv(H, BLOCK_H) +
    cdiv(HKV, BLOCK_H))``: ``j < cdiv(H, BLOCK_H)``: q heads ``j * BLOCK_H ..`` -> norm, RoPE ->
    ``q``; otherwise kv heads ``(j - cdiv(H, BLOCK_H)) * BLOCK_H ..``: k -> norm, RoPE -> ``kp``,
    v -> ``vp``. The program's norm weight (q's or k's) is loaded before the PDL wait; the next
    kernel may launch only after the wait. KV_INT8: k (divided by the smoothing where SMOOTH) and v
    are quantized, one scale per vector, into int8 pages and float32 scales ``ks``, ``vs``."""
    t = tl.program_id(0).to(tl.int64)
    j = tl.program_id(1) + col0
    q_cols = (H + BLOCK_H - 1) // BLOCK_H
    is_q = j < q_cols
    heads = (tl.where(is_q, j, j - q_cols) * BLOCK_H + tl.arange(0, BLOCK_H))[:, None]
    offs = tl.arange(0, BLOCK_HALF)[None, :]
    wa, wb = load_weight_halves(tl.where(is_q, q_w_ptr, k_w_ptr), offs, D)
    if PDL:
        gdc_wait()  # qkv, positions, block table, pages: all after the kernel before
        gdc_launch_dependents()
    pos = tl.load(pos_ptr + t)
    c = tl.load(cos_ptr + pos * stride_cs + offs, mask=offs < D // 2, other=1.0)
    s = tl.load(sin_ptr + pos * stride_cs + offs, mask=offs < D // 2, other=0.0)
    row = qkv_ptr + t * stride_qkv_t
    if is_q:
        mask = (heads < H) & (offs < D // 2)
        ra, rb = _norm_rope(row, heads, offs, mask, wa, wb, c, s, eps, qkv_ptr.dtype.element_ty, D)
        q = q_ptr + t * stride_q_t + heads * stride_q_h + offs
        tl.store(q, ra, mask=mask)
        tl.store(q + D // 2, rb, mask=mask)
    else:
        mask = (heads < HKV) & (offs < D // 2)
        ra, rb = _norm_rope(row + H * D, heads, offs, mask, wa, wb, c, s, eps, qkv_ptr.dtype.element_ty, D)
        page, slot = page_slot(bt_ptr, pos, PAGE_SIZE)
        dst = page * stride_p_page + heads * stride_p_h + slot * stride_p_slot + offs
        v = row + (H + HKV) * D + heads * D + offs  # v heads: copied as they are, or quantized
        if KV_INT8:
            scale_dst = page * stride_s_page + heads * stride_s_h + slot  # [BLOCK_H, 1]
            va = tl.load(v, mask=mask, other=0.0).to(tl.float32)
            vb = tl.load(v + D // 2, mask=mask, other=0.0).to(tl.float32)
            store_kv_int8(kp_ptr + dst, vp_ptr + dst, ks_ptr + scale_dst, vs_ptr + scale_dst, ra.to(tl.float32),
                          rb.to(tl.float32), va, vb, smooth_ptr, offs, mask, heads < HKV, SMOOTH, D)
        else:
            tl.store(kp_ptr + dst, ra, mask=mask)
            tl.store(kp_ptr + dst + D // 2, rb, mask=mask)
            tl.store(vp_ptr + dst, tl.load(v, mask=mask), mask=mask)
            tl.store(vp_ptr + dst + D // 2, tl.load(v + D // 2, mask=mask), mask=mask)


def _check_qkv(qkv: torch.Tensor, weight: torch.Tensor, num_heads: int, num_kv_heads: int, head_dim: int) -> int:
    assert qkv.dim() == 2 and qkv.shape[1] == (num_heads + 2 * num_kv_heads) * head_dim, (
        f"qkv {tuple(qkv.shape)}, want [T, {(num_heads + 2 * num_kv_heads) * head_dim}]"
    )
    assert qkv.dtype in FLOAT_DTYPES and qkv.stride(1) == 1, "qkv: model dtype, contiguous last dim"
    assert head_dim % 2 == 0 and num_heads % num_kv_heads == 0
    assert weight.shape == (head_dim,) and weight.dtype == qkv.dtype and weight.is_contiguous()
    assert weight.device == qkv.device
    return qkv.shape[0]


def _check_pages(qkv: torch.Tensor, positions: torch.Tensor, k_pages: torch.Tensor, v_pages: torch.Tensor,
                 block_table: torch.Tensor, num_heads: int, num_kv_heads: int, head_dim: int,
                 quant: Int8Pages | None) -> None:
    t = qkv.shape[0]
    k_heads = qkv[:, num_heads * head_dim:(num_heads + num_kv_heads) * head_dim].view(t, num_kv_heads, head_dim)
    if quant is None:
        check_paged_write(k_pages, block_table, positions, k_heads, "k")
    else:
        check_paged_write_int8(k_pages, v_pages, quant, block_table, positions, k_heads, "k")
    assert v_pages.shape == k_pages.shape and v_pages.dtype == k_pages.dtype and v_pages.is_contiguous()


def _launch(
    qkv: torch.Tensor, q_norm_weight: torch.Tensor, k_norm_weight: torch.Tensor,
    cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor,
    q: torch.Tensor, k_pages: torch.Tensor, v_pages: torch.Tensor, block_table: torch.Tensor,
    num_heads: int, num_kv_heads: int, head_dim: int, eps: float,
    config: tuple[int, int, int], with_q: bool, with_kv: bool, pdl: bool, quant: Int8Pages | None = None,
) -> None:
    """One launch of :func:`_attention_inputs_kernel` with ``config`` (a ``norm_launch_config``)
    over the q columns of its grid, the kv columns, or both; int8 pages with ``quant``. The tensors
    of a part not launched are placeholders (never read nor written), any tensor of the right kind
    will do."""
    t = qkv.shape[0]
    if t == 0:
        return
    block_h, block_half, num_warps = config
    q_cols, kv_cols = triton.cdiv(num_heads, block_h), triton.cdiv(num_kv_heads, block_h)
    pdl = use_pdl(pdl, qkv.device)
    ks, vs, smooth = int8_arguments(q, quant)
    _attention_inputs_kernel[(t, q_cols * with_q + kv_cols * with_kv)](
        qkv, q_norm_weight, k_norm_weight, cos, sin, positions, q, k_pages, v_pages, block_table,
        ks, vs, smooth,
        qkv.stride(0), q.stride(0), q.stride(1), cos.stride(0),
        k_pages.stride(0), k_pages.stride(1), k_pages.stride(2),
        ks.stride(0), ks.stride(1),
        eps, 0 if with_q else q_cols,
        H=num_heads, HKV=num_kv_heads, D=head_dim, PAGE_SIZE=k_pages.shape[2],
        BLOCK_H=block_h, BLOCK_HALF=block_half, KV_INT8=quant is not None, SMOOTH=smooth is not q, PDL=pdl,
        num_warps=num_warps, enable_fp_fusion=False, **launch_options(pdl),
    )


def q_norm_rope(
    qkv: torch.Tensor,
    q_norm_weight: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    positions: torch.Tensor,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    eps: float,
    *,
    out: torch.Tensor | None = None,
    pdl: bool = False,
) -> torch.Tensor:
    """One launch (the q columns of :func:`_attention_inputs_kernel`): q heads of ``qkv``
    ``[T, (H + 2 Hkv) * D]`` -> per-head RMSNorm (weight ``[D]``) -> RoPE at ``positions`` ``[T]``
    int64 (``cos``/``sin``: the ``[max_positions, D/2]`` float32 tables) -> ``q`` ``[T, H, D]``
    (``out``, new and contiguous unless given), with ``norm_launch_config(D, H)``. ``pdl``:
    programmatic dependent launch where supported (the weight is read before the wait); same bits."""
    t = _check_qkv(qkv, q_norm_weight, num_heads, num_kv_heads, head_dim)
    check_rope_tables(cos, sin, positions, t, head_dim, qkv.device)
    if out is None:
        out = torch.empty((t, num_heads, head_dim), dtype=qkv.dtype, device=qkv.device)
    assert out.shape == (t, num_heads, head_dim) and out.dtype == qkv.dtype and out.stride(-1) == 1
    pages = out.unsqueeze(2)  # placeholders: pages and block table
    _launch(qkv, q_norm_weight, q_norm_weight, cos, sin, positions, out, pages, pages, positions,
            num_heads, num_kv_heads, head_dim, eps, norm_launch_config(head_dim, num_heads), True, False, pdl)
    return out


def k_norm_rope_write(
    qkv: torch.Tensor,
    k_norm_weight: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    positions: torch.Tensor,
    k_pages: torch.Tensor,
    v_pages: torch.Tensor,
    block_table: torch.Tensor,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    eps: float,
    *,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    k_smooth: torch.Tensor | None = None,
    pdl: bool = False,
) -> None:
    """One launch (the kv columns of :func:`_attention_inputs_kernel`): k heads of ``qkv`` ->
    per-head RMSNorm -> RoPE -> ``k_pages``; v heads -> ``v_pages`` (``[num_pages, Hkv, page_size,
    D]``, model dtype), at ``positions`` through ``block_table`` int32 (page ``block_table[p //
    page_size]``, slot ``p % page_size``), with ``norm_launch_config(D, Hkv)``. ``pdl``: as for
    :func:`q_norm_rope`.

    INT8 pages (``k_scale``, ``v_scale`` given: the layout of ``LayerKV``): the rotated k, divided
    by ``k_smooth`` (``[D]`` float32) when given, and v are quantized with one scale per vector into
    the int8 pages and the float32 scales ``[num_pages, Hkv, page_size]``, bit for bit as
    ``write_quantized`` of backends/reference/kv_quant.py (``quantize_per_vector``) does."""
    quant = int8_pages(k_scale, v_scale, k_smooth)
    t = _check_qkv(qkv, k_norm_weight, num_heads, num_kv_heads, head_dim)
    check_rope_tables(cos, sin, positions, t, head_dim, qkv.device)
    _check_pages(qkv, positions, k_pages, v_pages, block_table, num_heads, num_kv_heads, head_dim, quant)
    q = qkv.unsqueeze(1)  # placeholder
    _launch(qkv, k_norm_weight, k_norm_weight, cos, sin, positions, q, k_pages, v_pages, block_table,
            num_heads, num_kv_heads, head_dim, eps, norm_launch_config(head_dim, num_kv_heads), False, True, pdl,
            quant)


def attention_inputs(
    qkv: torch.Tensor,
    q_norm_weight: torch.Tensor,
    k_norm_weight: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    positions: torch.Tensor,
    k_pages: torch.Tensor,
    v_pages: torch.Tensor,
    block_table: torch.Tensor,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    eps: float,
    *,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    k_smooth: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    pdl: bool = False,
) -> torch.Tensor:
    """Writes k and v into the pages (int8 with ``k_scale``, ``v_scale``, ``k_smooth``: as
    :func:`k_norm_rope_write`) and returns q ``[T, H, D]`` (``out``, new and contiguous unless
    given): one launch of
    :func:`_attention_inputs_kernel` where ``norm_launch_config`` gives the q heads and the kv
    heads the same tiles (e.g. ``D`` = 128 with ``H, Hkv >= 8``: Qwen3), else the two launches
    :func:`k_norm_rope_write` and :func:`q_norm_rope`, each with its heads' tiles (few heads).
    Same bits as the per-op chain either way. ``pdl``: programmatic dependent launch where
    supported; same bits."""
    config = norm_launch_config(head_dim, num_heads)
    if config != norm_launch_config(head_dim, num_kv_heads):
        k_norm_rope_write(qkv, k_norm_weight, cos, sin, positions, k_pages, v_pages, block_table,
                          num_heads, num_kv_heads, head_dim, eps, k_scale=k_scale, v_scale=v_scale,
                          k_smooth=k_smooth, pdl=pdl)
        return q_norm_rope(qkv, q_norm_weight, cos, sin, positions, num_heads, num_kv_heads, head_dim, eps,
                           out=out, pdl=pdl)
    quant = int8_pages(k_scale, v_scale, k_smooth)
    t = _check_qkv(qkv, q_norm_weight, num_heads, num_kv_heads, head_dim)
    _check_qkv(qkv, k_norm_weight, num_heads, num_kv_heads, head_dim)
    check_rope_tables(cos, sin, positions, t, head_dim, qkv.device)
    _check_pages(qkv, positions, k_pages, v_pages, block_table, num_heads, num_kv_heads, head_dim, quant)
    if out is None:
        out = torch.empty((t, num_heads, head_dim), dtype=qkv.dtype, device=qkv.device)
    assert out.shape == (t, num_heads, head_dim) and out.dtype == qkv.dtype and out.stride(-1) == 1
    _launch(qkv, q_norm_weight, k_norm_weight, cos, sin, positions, out, k_pages, v_pages, block_table,
            num_heads, num_kv_heads, head_dim, eps, config, True, True, pdl, quant)
    return out


__all__ = ["attention_inputs", "k_norm_rope_write", "q_norm_rope"]
