"""Paged KV-cache write; twin: ``write_pages`` in backends/reference/kv_write.py.

Tiling and grid: a program stores ``BLOCK_H`` KV heads of one token (``BLOCK_H = min(16,
next_pow2(Hkv))``), grid ``(T, cdiv(Hkv, BLOCK_H))``, as one ``[BLOCK_H, BLOCK_D]`` tile
(``BLOCK_D = next_pow2(D)``) of k and, in the same program, one of v. The token's position ``p``
(``positions[t]``, int64) goes to page ``block_table[p // page_size]`` at slot ``p % page_size``;
pages are ``[num_pages, Hkv, page_size, D]`` (core/interfaces/kv_store.py). Values are copied bit
for bit (no arithmetic, so no float32 cast: the interpreter copies bfloat16 correctly too). A slot
written twice in one call (repeated positions) keeps one of the writes, unspecified which.
``pdl=True``: programmatic dependent launch (pdl.py); the kernel waits for the one
before at its start.

INT8 pages (:func:`write_kv_int8`; twin: ``write_quantized`` in backends/reference/kv_quant.py):
the same tiles, each vector (divided by ``k_smooth`` for keys) quantized with one float32 scale
(``int8_scale``, ``quantize_int8`` of device_functions.py), bit for bit as ``quantize_per_vector``;
the per-op counterpart of the quantizing write of attention_inputs.py.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tileinfer.backends.triton import FLOAT_DTYPES
from tileinfer.backends.triton.device_functions import int8_scale, launch_dependents_then_wait, page_slot, quantize_int8
from tileinfer.backends.triton.paged_attention_int8 import Int8Pages, check_int8_pages
from tileinfer.backends.triton.pdl import launch_options, use_pdl

MAX_BLOCK_H = 16


@triton.jit
def _token_tile(bt_ptr, pos_ptr, stride_p_page, stride_p_h, stride_p_slot, HKV: tl.constexpr, D: tl.constexpr,
                PAGE_SIZE: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, PDL: tl.constexpr):
    """The program's token and heads (after the grid dependency wait with PDL): ``(t, heads, offs,
    mask, page, slot, dst)``, with ``dst`` the element offsets of its ``[BLOCK_H, BLOCK_D]`` tile
    in the pages."""
    launch_dependents_then_wait(PDL)
    t = tl.program_id(0).to(tl.int64)
    heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    offs = tl.arange(0, BLOCK_D)
    mask = (heads < HKV)[:, None] & (offs < D)[None, :]
    page, slot = page_slot(bt_ptr, tl.load(pos_ptr + t), PAGE_SIZE)
    dst = page * stride_p_page + heads[:, None] * stride_p_h + slot * stride_p_slot + offs[None, :]
    return t, heads, offs, mask, page, slot, dst


@triton.jit
def _write_kv_kernel(
    k_ptr, v_ptr, kp_ptr, vp_ptr, bt_ptr, pos_ptr,
    stride_k_t, stride_k_h, stride_v_t, stride_v_h,
    stride_p_page, stride_p_h, stride_p_slot,
    HKV: tl.constexpr, D: tl.constexpr, PAGE_SIZE: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, HAS_V: tl.constexpr, PDL: tl.constexpr,
):
    t, heads, offs, mask, page, slot, dst = _token_tile(bt_ptr, pos_ptr, stride_p_page, stride_p_h, stride_p_slot,
                                                        HKV, D, PAGE_SIZE, BLOCK_H, BLOCK_D, PDL)
    k = tl.load(k_ptr + t * stride_k_t + heads[:, None] * stride_k_h + offs[None, :], mask=mask)
    tl.store(kp_ptr + dst, k, mask=mask)
    if HAS_V:
        v = tl.load(v_ptr + t * stride_v_t + heads[:, None] * stride_v_h + offs[None, :], mask=mask)
        tl.store(vp_ptr + dst, v, mask=mask)


@triton.jit
def _quantize_store(x_ptr, dst, scale_dst, offs, mask, head_ok, smooth_ptr, SMOOTH: tl.constexpr,
                    D: tl.constexpr):
    x = tl.load(x_ptr, mask=mask, other=0.0).to(tl.float32)
    if SMOOTH:  # 1 in masked lanes: no 0 / 0
        x = tl.math.div_rn(x, tl.load(smooth_ptr + offs, mask=offs < D, other=1.0)[None, :])
    scale = int8_scale(tl.max(tl.abs(x), 1, keep_dims=True))
    tl.store(dst, quantize_int8(x, scale), mask=mask)
    tl.store(scale_dst, scale, mask=head_ok)


@triton.jit
def _write_kv_int8_kernel(
    k_ptr, v_ptr, kp_ptr, vp_ptr, ks_ptr, vs_ptr, smooth_ptr, bt_ptr, pos_ptr,
    stride_k_t, stride_k_h, stride_v_t, stride_v_h,
    stride_p_page, stride_p_h, stride_p_slot, stride_s_page, stride_s_h,
    HKV: tl.constexpr, D: tl.constexpr, PAGE_SIZE: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, SMOOTH: tl.constexpr, PDL: tl.constexpr,
):
    t, heads, offs, mask, page, slot, dst = _token_tile(bt_ptr, pos_ptr, stride_p_page, stride_p_h, stride_p_slot,
                                                        HKV, D, PAGE_SIZE, BLOCK_H, BLOCK_D, PDL)
    scale_dst = page * stride_s_page + heads[:, None] * stride_s_h + slot
    head_ok = (heads < HKV)[:, None]
    _quantize_store(k_ptr + t * stride_k_t + heads[:, None] * stride_k_h + offs[None, :], kp_ptr + dst,
                    ks_ptr + scale_dst, offs, mask, head_ok, smooth_ptr, SMOOTH, D)
    _quantize_store(v_ptr + t * stride_v_t + heads[:, None] * stride_v_h + offs[None, :], vp_ptr + dst,
                    vs_ptr + scale_dst, offs, mask, head_ok, smooth_ptr, False, D)


def _check_table(block_table: torch.Tensor, positions: torch.Tensor) -> None:
    assert positions.dim() == 1 and positions.dtype == torch.int64 and positions.is_contiguous(), "positions: [T] int64"
    assert block_table.dim() == 1 and block_table.dtype == torch.int32 and block_table.is_contiguous(), (
        "block_table: [num_pages] int32")


def check_paged_write(pages: torch.Tensor, block_table: torch.Tensor, positions: torch.Tensor,
                      x: torch.Tensor, name: str = "x") -> None:
    """Assert the layouts of a paged write of ``x`` ``[T, Hkv, D]`` into ``pages``."""
    assert pages.dim() == 4 and pages.is_contiguous(), (
        f"pages must be [P, Hkv, S, D] contiguous, got {tuple(pages.shape)}")
    t = positions.shape[0]
    assert x.shape == (t, pages.shape[1], pages.shape[3]), (
        f"{name} {tuple(x.shape)}, want [{t}, {pages.shape[1]}, {pages.shape[3]}]"
    )
    assert x.dtype == pages.dtype, f"{name} dtype {x.dtype}, pages {pages.dtype} (model-dtype pages only)"
    assert x.stride(-1) == 1, f"{name} must be contiguous in its last dim"
    _check_table(block_table, positions)
    assert pages.device == x.device == positions.device == block_table.device


def _launch(k_pages: torch.Tensor, v_pages: torch.Tensor | None, block_table: torch.Tensor,
            positions: torch.Tensor, k: torch.Tensor, v: torch.Tensor | None, pdl: bool = False) -> None:
    t, hkv, d = k.shape
    if t == 0:
        return
    pdl = use_pdl(pdl, k.device)
    has_v = v is not None
    block_h = min(MAX_BLOCK_H, triton.next_power_of_2(hkv))
    block_d = triton.next_power_of_2(d)
    v_, vp_ = (v, v_pages) if has_v else (k, k_pages)
    _write_kv_kernel[(t, triton.cdiv(hkv, block_h))](
        k, v_, k_pages, vp_, block_table, positions,
        k.stride(0), k.stride(1), v_.stride(0), v_.stride(1),
        k_pages.stride(0), k_pages.stride(1), k_pages.stride(2),
        HKV=hkv, D=d, PAGE_SIZE=k_pages.shape[2], BLOCK_H=block_h, BLOCK_D=block_d, HAS_V=has_v,
        PDL=pdl, num_warps=4, **launch_options(pdl),
    )


def write_kv(
    k_pages: torch.Tensor,
    v_pages: torch.Tensor,
    block_table: torch.Tensor,
    positions: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    pdl: bool = False,
) -> None:
    """Store ``k``, ``v`` ``[T, Hkv, D]`` (model dtype; any strides, contiguous last dim) at
    ``positions`` ``[T]`` int64 into ``k_pages``/``v_pages`` ``[num_pages, Hkv, page_size, D]``
    (same shape and dtype, contiguous) through ``block_table`` int32. One kernel for both. ``pdl``:
    programmatic dependent launch where supported; same bits."""
    check_paged_write(k_pages, block_table, positions, k, "k")
    check_paged_write(v_pages, block_table, positions, v, "v")
    assert v_pages.shape == k_pages.shape
    _launch(k_pages, v_pages, block_table, positions, k, v, pdl)


def write_pages(pages: torch.Tensor, block_table: torch.Tensor, positions: torch.Tensor, x: torch.Tensor,
                *, pdl: bool = False) -> None:
    """Store ``x`` ``[T, Hkv, D]`` at ``positions`` into ``pages`` (one tensor of :func:`write_kv`)."""
    check_paged_write(pages, block_table, positions, x)
    _launch(pages, None, block_table, positions, x, None, pdl)


def check_paged_write_int8(k_pages: torch.Tensor, v_pages: torch.Tensor, quant: Int8Pages, block_table: torch.Tensor,
                           positions: torch.Tensor, x: torch.Tensor, name: str = "x") -> None:
    """Assert the layouts of a quantizing paged write of ``x`` ``[T, Hkv, D]`` (model dtype) into
    contiguous int8 pages with their scales (``Int8Pages``)."""
    assert k_pages.dim() == 4 and k_pages.is_contiguous() and v_pages.is_contiguous(), (
        f"pages must be [P, Hkv, S, D] contiguous, got {tuple(k_pages.shape)}")
    assert v_pages.shape == k_pages.shape, f"v_pages {tuple(v_pages.shape)}, k_pages {tuple(k_pages.shape)}"
    check_int8_pages(quant, k_pages, v_pages)
    t = positions.shape[0]
    assert x.shape == (t, k_pages.shape[1], k_pages.shape[3]), (
        f"{name} {tuple(x.shape)}, want [{t}, {k_pages.shape[1]}, {k_pages.shape[3]}]")
    assert x.dtype in FLOAT_DTYPES and x.stride(-1) == 1, f"{name}: a float dtype, contiguous in its last dim"
    _check_table(block_table, positions)
    assert k_pages.device == x.device == positions.device == block_table.device


def write_kv_int8(
    k_pages: torch.Tensor,
    v_pages: torch.Tensor,
    k_scale: torch.Tensor,
    v_scale: torch.Tensor,
    block_table: torch.Tensor,
    positions: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    k_smooth: torch.Tensor | None = None,
    pdl: bool = False,
) -> None:
    """:func:`write_kv` into INT8 pages: ``k`` (divided by ``k_smooth``, ``[D]`` float32, when
    given) and ``v`` ``[T, Hkv, D]`` (model dtype) quantized with one float32 scale per vector into
    ``k_pages``/``v_pages`` (int8, ``[num_pages, Hkv, page_size, D]``, contiguous) and
    ``k_scale``/``v_scale`` (``[num_pages, Hkv, page_size]``); the bits of ``write_quantized``."""
    quant = Int8Pages(k_scale, v_scale, k_smooth)
    check_paged_write_int8(k_pages, v_pages, quant, block_table, positions, k, "k")
    check_paged_write_int8(k_pages, v_pages, quant, block_table, positions, v, "v")
    t, hkv, d = k.shape
    if t == 0:
        return
    pdl = use_pdl(pdl, k.device)
    block_h = min(MAX_BLOCK_H, triton.next_power_of_2(hkv))
    _write_kv_int8_kernel[(t, triton.cdiv(hkv, block_h))](
        k, v, k_pages, v_pages, k_scale, v_scale, k if k_smooth is None else k_smooth, block_table, positions,
        k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        k_pages.stride(0), k_pages.stride(1), k_pages.stride(2), k_scale.stride(0), k_scale.stride(1),
        HKV=hkv, D=d, PAGE_SIZE=k_pages.shape[2], BLOCK_H=block_h, BLOCK_D=triton.next_power_of_2(d),
        SMOOTH=k_smooth is not None, PDL=pdl, num_warps=4, enable_fp_fusion=False, **launch_options(pdl),
    )


__all__ = ["check_paged_write", "check_paged_write_int8", "write_kv", "write_kv_int8", "write_pages"]
