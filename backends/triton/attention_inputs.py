"""Attention inputs from the fused q/k/v projection: q/k RMSNorm, RoPE and the paged K/V write.

Twin: the first half of plugins/reference/attention.py (split, ``rms_norm`` of q and k heads,
``apply_rope``, ``write_pages``). Two kernels replace the unfused chain of eight
(:func:`attention_inputs_unfused`: 3 copies of the qkv slices, 2 norms, 2 RoPE, 1 KV write).

Tiling and grid: a program handles ``BLOCK_H`` heads of one token, loaded from
``qkv[T, (H + 2 Hkv) * D]`` as two ``[BLOCK_H, BLOCK_HALF]`` tiles (channels ``i`` and ``i + D/2``,
the pairs RoPE mixes), with ``(BLOCK_H, BLOCK_HALF, num_warps) = norm_launch_config(D, heads)``
(8 heads of 128, 2 warps): exactly the tiles of the per-op ``rms_norm`` on ``[T, heads, D]``, and
the same helpers (:func:`_rms_norm_halves`, :func:`_rope_rotate`) as ``rms_norm`` and
``apply_rope``. ``_q_norm_rope_kernel``: grid ``(T, cdiv(H, BLOCK_H))``, stores q ``[T, H, D]``.
``_k_norm_rope_write_kernel``: grid ``(T, cdiv(Hkv, BLOCK_H))``, normalizes and rotates the k heads
and stores them, with the v heads beside them (copied), at the token's page and slot. The
normalized value is rounded to the model dtype after the weight multiply and before RoPE, as the
chain stores it, so the fused pair equals the unfused chain bit for bit.

Programmatic dependent launch (``pdl=True``, Hopper; backends/triton/pdl.py): both kernels let the
next kernel launch at their start and load the norm weight (immutable) before the grid dependency
wait; positions, the block table, qkv and the pages are touched after it. Same bits either way.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from tileinfer.backends.triton.kv_write import _page_slot, check_paged_write, write_kv
from tileinfer.backends.triton.norm import (
    FLOAT_DTYPES,
    _load_weight_halves,
    _rms_norm_halves,
    norm_launch_config,
    rms_norm,
)
from tileinfer.backends.triton.pdl import launch_options, use_pdl
from tileinfer.backends.triton.rope import _rope_rotate, apply_rope, check_rope_tables


@triton.jit
def _norm_rope(src, heads, offs, mask, wa, wb, c, s, eps, DTYPE: tl.constexpr, D: tl.constexpr):
    """Heads ``heads`` ``[BLOCK_H, 1]`` of the vectors at ``src + heads * D``: RMSNorm with the
    weight halves ``wa``, ``wb`` (rounded to DTYPE), then RoPE by ``c``, ``s`` ``[1, BLOCK_HALF]``;
    returns the two rotated halves."""
    x = src + heads * D + offs
    a = tl.load(x, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(x + D // 2, mask=mask, other=0.0).to(tl.float32)
    na, nb = _rms_norm_halves(a, b, wa, wb, D, eps, DTYPE)
    return _rope_rotate(na.to(tl.float32), nb.to(tl.float32), c, s, DTYPE)


@triton.jit
def _q_norm_rope_kernel(
    qkv_ptr, w_ptr, cos_ptr, sin_ptr, pos_ptr, q_ptr,
    stride_qkv_t, stride_q_t, stride_q_h, stride_cs,
    eps,
    H: tl.constexpr, D: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr,
    PDL: tl.constexpr,
):
    if PDL:
        gdc_launch_dependents()
    t = tl.program_id(0).to(tl.int64)
    heads = (tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H))[:, None]
    offs = tl.arange(0, BLOCK_HALF)[None, :]
    mask = (heads < H) & (offs < D // 2)
    wa, wb = _load_weight_halves(w_ptr, offs, D)
    if PDL:
        gdc_wait()  # qkv and the positions come from earlier kernels or copies
    pos = tl.load(pos_ptr + t)
    c = tl.load(cos_ptr + pos * stride_cs + offs, mask=offs < D // 2, other=1.0)
    s = tl.load(sin_ptr + pos * stride_cs + offs, mask=offs < D // 2, other=0.0)
    ra, rb = _norm_rope(qkv_ptr + t * stride_qkv_t, heads, offs, mask, wa, wb, c, s, eps,
                        q_ptr.dtype.element_ty, D)
    q = q_ptr + t * stride_q_t + heads * stride_q_h + offs
    tl.store(q, ra, mask=mask)
    tl.store(q + D // 2, rb, mask=mask)


@triton.jit
def _k_norm_rope_write_kernel(
    qkv_ptr, w_ptr, cos_ptr, sin_ptr, pos_ptr, kp_ptr, vp_ptr, bt_ptr,
    stride_qkv_t, stride_cs, stride_p_page, stride_p_h, stride_p_slot,
    eps,
    H: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr, PAGE_SIZE: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr, PDL: tl.constexpr,
):
    if PDL:
        gdc_launch_dependents()
    t = tl.program_id(0).to(tl.int64)
    heads = (tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H))[:, None]
    offs = tl.arange(0, BLOCK_HALF)[None, :]
    mask = (heads < HKV) & (offs < D // 2)
    wa, wb = _load_weight_halves(w_ptr, offs, D)
    if PDL:
        gdc_wait()  # qkv, positions, block table, pages: all after the kernel before
    pos = tl.load(pos_ptr + t)
    c = tl.load(cos_ptr + pos * stride_cs + offs, mask=offs < D // 2, other=1.0)
    s = tl.load(sin_ptr + pos * stride_cs + offs, mask=offs < D // 2, other=0.0)
    row = qkv_ptr + t * stride_qkv_t
    ra, rb = _norm_rope(row + H * D, heads, offs, mask, wa, wb, c, s, eps, kp_ptr.dtype.element_ty, D)
    page, slot = _page_slot(bt_ptr, pos, PAGE_SIZE)
    dst = page * stride_p_page + heads * stride_p_h + slot * stride_p_slot + offs
    tl.store(kp_ptr + dst, ra, mask=mask)
    tl.store(kp_ptr + dst + D // 2, rb, mask=mask)
    v = row + (H + HKV) * D + heads * D + offs  # v heads: copied as they are
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
    """One kernel: q heads of ``qkv`` ``[T, (H + 2 Hkv) * D]`` -> per-head RMSNorm (weight
    ``[D]``) -> RoPE at ``positions`` ``[T]`` int64 (``cos``/``sin``: the ``[max_positions, D/2]``
    float32 tables) -> ``q`` ``[T, H, D]`` (``out``, new and contiguous unless given). ``pdl``:
    programmatic dependent launch where supported (the weight is read before the wait); same bits."""
    t = _check_qkv(qkv, q_norm_weight, num_heads, num_kv_heads, head_dim)
    check_rope_tables(cos, sin, positions, t, head_dim, qkv.device)
    if out is None:
        out = torch.empty((t, num_heads, head_dim), dtype=qkv.dtype, device=qkv.device)
    assert out.shape == (t, num_heads, head_dim) and out.dtype == qkv.dtype and out.stride(-1) == 1
    if t == 0:
        return out
    block_h, block_half, num_warps = norm_launch_config(head_dim, num_heads)
    pdl = use_pdl(pdl, qkv.device)
    _q_norm_rope_kernel[(t, triton.cdiv(num_heads, block_h))](
        qkv, q_norm_weight, cos, sin, positions, out,
        qkv.stride(0), out.stride(0), out.stride(1), cos.stride(0),
        eps,
        H=num_heads, D=head_dim, BLOCK_H=block_h, BLOCK_HALF=block_half, PDL=pdl,
        num_warps=num_warps, enable_fp_fusion=False, **launch_options(pdl),
    )
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
    pdl: bool = False,
) -> None:
    """One kernel: k heads of ``qkv`` -> per-head RMSNorm -> RoPE -> ``k_pages``; v heads ->
    ``v_pages`` (``[num_pages, Hkv, page_size, D]``, model dtype), at ``positions`` through
    ``block_table`` int32 (page ``block_table[p // page_size]``, slot ``p % page_size``). ``pdl``:
    as for :func:`q_norm_rope`."""
    t = _check_qkv(qkv, k_norm_weight, num_heads, num_kv_heads, head_dim)
    check_rope_tables(cos, sin, positions, t, head_dim, qkv.device)
    k_heads = qkv[:, num_heads * head_dim:(num_heads + num_kv_heads) * head_dim].view(t, num_kv_heads, head_dim)
    check_paged_write(k_pages, block_table, positions, k_heads, "k")
    assert v_pages.shape == k_pages.shape and v_pages.dtype == k_pages.dtype and v_pages.is_contiguous()
    if t == 0:
        return
    block_h, block_half, num_warps = norm_launch_config(head_dim, num_kv_heads)
    pdl = use_pdl(pdl, qkv.device)
    _k_norm_rope_write_kernel[(t, triton.cdiv(num_kv_heads, block_h))](
        qkv, k_norm_weight, cos, sin, positions, k_pages, v_pages, block_table,
        qkv.stride(0), cos.stride(0), k_pages.stride(0), k_pages.stride(1), k_pages.stride(2),
        eps,
        H=num_heads, HKV=num_kv_heads, D=head_dim, PAGE_SIZE=k_pages.shape[2],
        BLOCK_H=block_h, BLOCK_HALF=block_half, PDL=pdl,
        num_warps=num_warps, enable_fp_fusion=False, **launch_options(pdl),
    )


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
    pdl: bool = False,
) -> torch.Tensor:
    """The fused pair: writes k and v into the pages and returns q ``[T, H, D]`` (2 kernels).
    ``pdl``: programmatic dependent launch of both where supported; same bits."""
    k_norm_rope_write(qkv, k_norm_weight, cos, sin, positions, k_pages, v_pages, block_table,
                      num_heads, num_kv_heads, head_dim, eps, pdl=pdl)
    return q_norm_rope(qkv, q_norm_weight, cos, sin, positions, num_heads, num_kv_heads, head_dim, eps,
                       pdl=pdl)


def attention_inputs_unfused(
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
    pdl: bool = False,
) -> torch.Tensor:
    """:func:`attention_inputs` as the chain of per-op kernels (8 launches): copy the q, k, v slices
    of ``qkv`` to contiguous tensors, ``rms_norm`` q and k heads, ``apply_rope`` to both, ``write_kv``.
    Same outputs, bit for bit; the baseline the fused pair is measured against. ``pdl``: for the
    Triton kernels of the chain (the copies are torch's, launched as usual)."""
    t = _check_qkv(qkv, q_norm_weight, num_heads, num_kv_heads, head_dim)
    d = head_dim
    q, k, v = qkv.split([num_heads * d, num_kv_heads * d, num_kv_heads * d], dim=-1)
    q = q.contiguous().view(t, num_heads, d)
    k = k.contiguous().view(t, num_kv_heads, d)
    v = v.contiguous().view(t, num_kv_heads, d)
    q = apply_rope(rms_norm(q, q_norm_weight, eps, pdl=pdl), cos, sin, positions, pdl=pdl)
    k = apply_rope(rms_norm(k, k_norm_weight, eps, pdl=pdl), cos, sin, positions, pdl=pdl)
    write_kv(k_pages, v_pages, block_table, positions, k, v, pdl=pdl)
    return q
