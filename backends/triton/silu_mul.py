"""SwiGLU of a fused gate/up projection as its own kernel; twin: backends/reference/silu_mul.py.

Tiling and grid: one program per (token row, BLOCK_I-wide block of output columns), grid
``(T, cdiv(I, BLOCK_I))`` with BLOCK_I = 1024 and 4 warps, so each thread moves 8 contiguous
elements (16 bytes of bf16) of gate, of up and of the output per access. A program loads
``gate[t, j:j+BLOCK_I]`` and ``up[t, I+j:I+j+BLOCK_I]`` in the model dtype, converts them to float32
and applies :func:`silu_mul_f32` (device_functions.py), the one SwiGLU arithmetic of the kernels
(the GEMV/GEMM epilogue of linear.py calls it on its accumulators rounded to the output dtype,
which is what makes ``linear(x, w, swiglu=True)`` bit-identical to ``silu_mul(linear(x, w))`` on the
same tiles); the result is rounded once, to the output dtype, at the store. Compiled with
contraction on, as the GEMV is, so that the two compute silu alike. Memory-bound: 3 I elements moved per row.
``pdl=True``: programmatic dependent launch (pdl.py); the kernel waits for the one before at its
start.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tileinfer.backends.triton.device_functions import launch_dependents_then_wait, silu_mul_f32
from tileinfer.backends.triton.pdl import launch_options, use_pdl

BLOCK_I = 1024
NUM_WARPS = 4


@triton.jit
def _silu_mul_kernel(
    gu_ptr, y_ptr, I, stride_gu_t, stride_y_t,
    BLOCK_I: tl.constexpr, PDL: tl.constexpr,
):
    launch_dependents_then_wait(PDL)
    t = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK_I + tl.arange(0, BLOCK_I)
    mask = offs < I
    row = gu_ptr + t * stride_gu_t
    g = tl.load(row + offs, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(row + I + offs, mask=mask, other=0.0).to(tl.float32)
    y = silu_mul_f32(g, u)
    tl.store(y_ptr + t * stride_y_t + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


def silu_mul(gate_up: torch.Tensor, *, out: torch.Tensor | None = None, pdl: bool = False) -> torch.Tensor:
    """SwiGLU: ``gate_up`` ``[T, 2I]`` (gate = first I columns, up = last I) -> ``silu(gate) * up``.

    Returns ``[T, I]`` in ``gate_up.dtype`` (float16, bfloat16 or float32), contiguous. ``gate_up``
    needs unit column stride; any row stride works (e.g. a row slice of a larger buffer).
    Arithmetic: float32, ``g / (1 + exp(-g)) * u``, one rounding at the store. ``out``, if given,
    must be a ``[T, I]`` tensor of that dtype with unit column stride; it is written and returned.
    ``pdl``: programmatic dependent launch where supported; same bits.
    """
    assert gate_up.dim() == 2, f"gate_up must be [T, 2I], got shape {tuple(gate_up.shape)}"
    T, two_i = gate_up.shape
    assert two_i % 2 == 0, f"gate_up needs an even number of columns, got {two_i}"
    assert gate_up.dtype in (torch.float16, torch.bfloat16, torch.float32), f"unsupported dtype {gate_up.dtype}"
    assert gate_up.stride(1) == 1, "gate_up must have unit column stride"
    I = two_i // 2
    if out is None:
        out = torch.empty((T, I), dtype=gate_up.dtype, device=gate_up.device)
    assert out.shape == (T, I) and out.dtype == gate_up.dtype and out.device == gate_up.device, (
        f"out must be [{T}, {I}] {gate_up.dtype} on {gate_up.device}, got {tuple(out.shape)} {out.dtype}"
    )
    assert out.stride(1) == 1, "out must have unit column stride"
    if T == 0 or I == 0:
        return out
    grid = (T, triton.cdiv(I, BLOCK_I))
    pdl = use_pdl(pdl, gate_up.device)
    _silu_mul_kernel[grid](gate_up, out, I, gate_up.stride(0), out.stride(0), BLOCK_I=BLOCK_I, PDL=pdl,
                           num_warps=NUM_WARPS, enable_fp_fusion=True, **launch_options(pdl))  # as the GEMV
    return out


__all__ = ["silu_mul"]
