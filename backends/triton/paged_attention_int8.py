"""The INT8 KV cache as the paged attention kernels read it (paged_attention.py checks it, the
prefill and decode kernels take it): int8 K/V pages ``[num_pages, Hkv, page_size, D]`` with one
float32 scale per cached vector, ``[num_pages, Hkv, page_size]`` for K and for V, and the keys
divided by ``k_smooth`` ``[D]`` float32 (or not smoothed); the layout of ``LayerKV``
(core/interfaces/kv_store.py). The twin reads the same pages: ``paged_attention`` of
backends/reference/paged_attention.py with the same ``k_scale``, ``v_scale``, ``k_smooth``.
"""

from __future__ import annotations

from typing import NamedTuple

import torch


class Int8Pages(NamedTuple):
    """The scales (and smoothing) that go with int8 K/V pages."""

    k_scale: torch.Tensor
    v_scale: torch.Tensor
    k_smooth: torch.Tensor | None = None


def int8_pages(k_scale: torch.Tensor | None, v_scale: torch.Tensor | None,
               k_smooth: torch.Tensor | None) -> Int8Pages | None:
    """The launchers' keyword arguments as one value: None for pages in the model dtype (no scales
    and no smoothing given), else :class:`Int8Pages` (both scales must be given)."""
    if k_scale is None and v_scale is None:
        assert k_smooth is None, "k_smooth goes with int8 pages (k_scale, v_scale)"
        return None
    assert k_scale is not None and v_scale is not None, "int8 pages need both k_scale and v_scale"
    return Int8Pages(k_scale, v_scale, k_smooth)


def check_int8_pages(quant: Int8Pages, k_pages: torch.Tensor, v_pages: torch.Tensor) -> None:
    """Assert the int8 layout: int8 pages, float32 scales ``[P, Hkv, page_size]`` with contiguous
    slots and the same strides for K and V, a contiguous float32 ``[D]`` smoothing, one device."""
    num_pages, hkv, page_size, d = k_pages.shape
    assert k_pages.dtype == torch.int8 and v_pages.dtype == torch.int8, (
        f"int8 pages expected with scales, got {k_pages.dtype}/{v_pages.dtype}")
    assert k_pages.stride() == v_pages.stride(), "k_pages and v_pages must have the same strides"
    for name, s in (("k_scale", quant.k_scale), ("v_scale", quant.v_scale)):
        assert s.shape == (num_pages, hkv, page_size) and s.dtype == torch.float32, (
            f"{name} must be [{num_pages}, {hkv}, {page_size}] float32, got {tuple(s.shape)} {s.dtype}")
        assert s.stride(2) == 1 and s.device == k_pages.device, f"{name}: contiguous slots, on the pages' device"
    assert quant.k_scale.stride() == quant.v_scale.stride(), "k_scale and v_scale must have the same strides"
    if quant.k_smooth is not None:
        assert quant.k_smooth.shape == (d,) and quant.k_smooth.dtype == torch.float32, (
            f"k_smooth must be [{d}] float32, got {tuple(quant.k_smooth.shape)} {quant.k_smooth.dtype}")
        assert quant.k_smooth.is_contiguous() and quant.k_smooth.device == k_pages.device


def int8_arguments(q: torch.Tensor, quant: Int8Pages | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(k_scale, v_scale, k_smooth)`` for a kernel launch; ``q`` stands in for what is absent
    (never read: the kernels' KV_INT8 and SMOOTH flags are off; SMOOTH is ``k_smooth is not q``)."""
    if quant is None:
        return q, q, q
    return quant.k_scale, quant.v_scale, q if quant.k_smooth is None else quant.k_smooth


__all__ = ["Int8Pages", "check_int8_pages", "int8_arguments", "int8_pages"]
