"""The residual add, ``round(x + residual)`` in the model dtype; twin: backends/reference/add.py.

Tiling and grid: a flat elementwise kernel over contiguous tensors, ``ADD_BLOCK`` = 1,024 elements a
program, 4 warps, grid ``(cdiv(numel, 1024),)``. Both operands go to float32 and the sum is rounded
once (:func:`add_round`, the arithmetic of the GEMV/GEMM residual epilogue too). Compiled with
contraction off (nothing to contract; as every elementwise kernel). ``pdl=True``: programmatic
dependent launch (pdl.py); the kernel waits for the one before at its start.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tileinfer.backends.triton import FLOAT_DTYPES
from tileinfer.backends.triton.device_functions import add_round, launch_dependents_then_wait
from tileinfer.backends.triton.pdl import launch_options, use_pdl

ADD_BLOCK = 1024  # elements per program


@triton.jit
def _add_kernel(x_ptr, r_ptr, out_ptr, n_elements, BLOCK: tl.constexpr, PDL: tl.constexpr):
    launch_dependents_then_wait(PDL)
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n_elements
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    r = tl.load(r_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + offs, add_round(x, r, out_ptr.dtype.element_ty), mask=mask)


def add(x: torch.Tensor, residual: torch.Tensor, *, out: torch.Tensor | None = None,
        pdl: bool = False) -> torch.Tensor:
    """``round(x + residual)`` in the model dtype (contiguous tensors of one shape and dtype:
    float16, bfloat16 or float32). Returns ``out`` (new unless given; contiguous, x's shape and
    dtype), which may be ``residual`` or ``x`` (each element is read before it is written).
    ``pdl``: programmatic dependent launch where supported; same bits."""
    assert x.dtype in FLOAT_DTYPES and residual.dtype == x.dtype, f"{x.dtype} + {residual.dtype}"
    assert x.shape == residual.shape and x.device == residual.device
    assert x.is_contiguous() and residual.is_contiguous(), "add takes contiguous tensors"
    if out is None:
        out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    assert out.shape == x.shape and out.dtype == x.dtype and out.device == x.device and out.is_contiguous(), (
        f"out: {tuple(out.shape)} {out.dtype} {out.device}, expected {tuple(x.shape)} {x.dtype} {x.device} contiguous"
    )
    n = x.numel()
    if n:
        pdl = use_pdl(pdl, x.device)
        _add_kernel[(triton.cdiv(n, ADD_BLOCK),)](x, residual, out, n, BLOCK=ADD_BLOCK, PDL=pdl, num_warps=4,
                                                 enable_fp_fusion=False, **launch_options(pdl))
    return out


__all__ = ["add"]
