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
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from tileinfer.backends.triton.device_functions import page_slot
from tileinfer.backends.triton.pdl import launch_options, use_pdl

MAX_BLOCK_H = 16


@triton.jit
def _write_kv_kernel(
    k_ptr, v_ptr, kp_ptr, vp_ptr, bt_ptr, pos_ptr,
    stride_k_t, stride_k_h, stride_v_t, stride_v_h,
    stride_p_page, stride_p_h, stride_p_slot,
    HKV: tl.constexpr, D: tl.constexpr, PAGE_SIZE: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, HAS_V: tl.constexpr, PDL: tl.constexpr,
):
    if PDL:
        gdc_launch_dependents()
        gdc_wait()
    t = tl.program_id(0).to(tl.int64)
    heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    offs = tl.arange(0, BLOCK_D)
    mask = (heads < HKV)[:, None] & (offs < D)[None, :]
    page, slot = page_slot(bt_ptr, tl.load(pos_ptr + t), PAGE_SIZE)
    dst = page * stride_p_page + heads[:, None] * stride_p_h + slot * stride_p_slot + offs[None, :]
    k = tl.load(k_ptr + t * stride_k_t + heads[:, None] * stride_k_h + offs[None, :], mask=mask)
    tl.store(kp_ptr + dst, k, mask=mask)
    if HAS_V:
        v = tl.load(v_ptr + t * stride_v_t + heads[:, None] * stride_v_h + offs[None, :], mask=mask)
        tl.store(vp_ptr + dst, v, mask=mask)


def check_paged_write(pages: torch.Tensor, block_table: torch.Tensor, positions: torch.Tensor,
                      x: torch.Tensor, name: str = "x") -> None:
    """Assert the layouts of a paged write of ``x`` ``[T, Hkv, D]`` into ``pages``."""
    assert pages.dim() == 4 and pages.is_contiguous(), f"pages must be [P, Hkv, S, D] contiguous, got {tuple(pages.shape)}"
    t = positions.shape[0]
    assert x.shape == (t, pages.shape[1], pages.shape[3]), (
        f"{name} {tuple(x.shape)}, want [{t}, {pages.shape[1]}, {pages.shape[3]}]"
    )
    assert x.dtype == pages.dtype, f"{name} dtype {x.dtype}, pages {pages.dtype} (model-dtype pages only)"
    assert x.stride(-1) == 1, f"{name} must be contiguous in its last dim"
    assert positions.dim() == 1 and positions.dtype == torch.int64 and positions.is_contiguous(), "positions: [T] int64"
    assert block_table.dim() == 1 and block_table.dtype == torch.int32 and block_table.is_contiguous(), (
        "block_table: [num_pages] int32"
    )
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


__all__ = ["check_paged_write", "write_kv", "write_pages"]
