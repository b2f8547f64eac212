"""Rotary position embedding, rotate-half convention; twin: backends/reference/rope.py.

Tiling and grid: a program rotates ``BLOCK_H`` heads of one token (``BLOCK_H = min(16,
next_pow2(heads))``), grid ``(T, cdiv(heads, BLOCK_H))``. It gathers the token's cos and sin rows
(``[BLOCK_HALF]`` float32, ``BLOCK_HALF = next_pow2(D / 2)``) from the tables by ``positions[t]``
once, and loads the heads as two ``[BLOCK_H, BLOCK_HALF]`` tiles: channels ``i`` and ``i + D/2``,
the pairs the rotation mixes. The rotation (:func:`rope_rotate` of device_functions.py, shared with
the fused q/k kernel of attention_inputs.py) is elementwise, so the tile shape does not change its result; it computes
``(a cos - b sin, b cos + a sin)`` in float32 as separate multiplies and adds (contraction off,
as the twin's torch ops) and rounds to x's dtype. ``pdl=True``: programmatic dependent launch
(pdl.py); the kernel waits for the one before at its start (everything it reads is
gathered through the positions or may be an earlier kernel's output).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tileinfer.backends.triton import FLOAT_DTYPES
from tileinfer.backends.triton.device_functions import launch_dependents_then_wait, rope_rotate
from tileinfer.backends.triton.pdl import launch_options, use_pdl

MAX_BLOCK_H = 16


@triton.jit
def _rope_kernel(
    x_ptr, cos_ptr, sin_ptr, pos_ptr, out_ptr,
    stride_x_t, stride_x_h, stride_o_t, stride_o_h, stride_cs,
    HEADS: tl.constexpr, D: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr,
    PDL: tl.constexpr,
):
    launch_dependents_then_wait(PDL)
    t = tl.program_id(0).to(tl.int64)
    heads = (tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H))[:, None]
    offs = tl.arange(0, BLOCK_HALF)[None, :]
    mask = (heads < HEADS) & (offs < D // 2)
    pos = tl.load(pos_ptr + t)
    c = tl.load(cos_ptr + pos * stride_cs + offs, mask=offs < D // 2, other=1.0)
    s = tl.load(sin_ptr + pos * stride_cs + offs, mask=offs < D // 2, other=0.0)
    x = x_ptr + t * stride_x_t + heads * stride_x_h + offs
    a = tl.load(x, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(x + D // 2, mask=mask, other=0.0).to(tl.float32)
    ra, rb = rope_rotate(a, b, c, s, out_ptr.dtype.element_ty)
    o = out_ptr + t * stride_o_t + heads * stride_o_h + offs
    tl.store(o, ra, mask=mask)
    tl.store(o + D // 2, rb, mask=mask)


def check_rope_tables(cos_table: torch.Tensor, sin_table: torch.Tensor, positions: torch.Tensor,
                      t: int, head_dim: int, device: torch.device) -> None:
    """Assert the cos/sin tables (``[max_positions, D/2]`` float32, one layout) and positions
    (``[T]`` int64) that the RoPE kernels gather from."""
    half = head_dim // 2
    assert cos_table.dtype == torch.float32 and sin_table.dtype == torch.float32, "cos/sin tables are float32"
    assert cos_table.dim() == 2 and cos_table.shape[1] == half, f"cos table {tuple(cos_table.shape)}, want [P, {half}]"
    assert sin_table.shape == cos_table.shape and sin_table.stride() == cos_table.stride()
    assert cos_table.stride(1) == 1, "cos/sin tables must be contiguous in their last dim"
    assert positions.shape == (t,) and positions.dtype == torch.int64, (
        f"positions {tuple(positions.shape)} {positions.dtype}")
    assert positions.is_contiguous()
    assert cos_table.device == sin_table.device == positions.device == device


def apply_rope(
    x: torch.Tensor,
    cos_table: torch.Tensor,
    sin_table: torch.Tensor,
    positions: torch.Tensor,
    *,
    out: torch.Tensor | None = None,
    pdl: bool = False,
) -> torch.Tensor:
    """Rotate ``x`` ``[T, heads, D]`` (any strides, contiguous last dim) by the angles of
    ``positions`` ``[T]`` int64, gathered in the kernel from ``cos_table``/``sin_table``
    ``[max_positions, D/2]`` float32. Channel ``i`` pairs with ``i + D/2``. Returns ``out`` (new and
    contiguous unless given), x's shape and dtype. ``out`` may be ``x`` (in place). ``pdl``:
    programmatic dependent launch where supported; same bits."""
    assert x.dim() == 3, f"x must be [T, heads, D], got {tuple(x.shape)}"
    assert x.dtype in FLOAT_DTYPES, f"x dtype {x.dtype}"
    t, heads, d = x.shape
    assert d % 2 == 0, f"head_dim must be even, got {d}"
    assert x.stride(-1) == 1, "x must be contiguous in its last dim"
    check_rope_tables(cos_table, sin_table, positions, t, d, x.device)
    if out is None:
        out = torch.empty_like(x, memory_format=torch.contiguous_format)
    assert out.shape == x.shape and out.dtype == x.dtype and out.device == x.device and out.stride(-1) == 1
    if t * heads == 0:
        return out
    block_h = min(MAX_BLOCK_H, triton.next_power_of_2(heads))
    block_half = triton.next_power_of_2(d // 2)
    pdl = use_pdl(pdl, x.device)
    _rope_kernel[(t, triton.cdiv(heads, block_h))](
        x, cos_table, sin_table, positions, out,
        x.stride(0), x.stride(1), out.stride(0), out.stride(1), cos_table.stride(0),
        HEADS=heads, D=d, BLOCK_H=block_h, BLOCK_HALF=block_half, PDL=pdl,
        num_warps=4, enable_fp_fusion=False, **launch_options(pdl),
    )
    return out


__all__ = ["apply_rope", "check_rope_tables"]
