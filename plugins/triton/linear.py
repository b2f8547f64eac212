"""Triton Linears: one kernel per op (``triton``), the fused GEMV/GEMM (``triton_fused``,
``triton_fused_prologue``), and cuBLAS matmuls between the same per-op Triton kernels (``cublas``).

- ``TritonLinear``: ``linear_unfused``: the RMSNorm, the GEMV/GEMM, SwiGLU and the residual add
  each a kernel of their own.
- ``TritonFusedLinear``: the RMSNorm kernel (with the GEMV's warps), then one GEMV/GEMM kernel with
  SwiGLU and the residual add in its epilogue.
- ``TritonPrologueLinear``: ``linear``: for steps of up to 16 tokens one GEMV kernel, the RMSNorm
  in its prologue too. Measured slower in the engine on the H200 (bench/NOTES.md, session 3: every
  program re-reduces the row after the dependency wait, where the separate norm kernel overlaps
  the GEMV's weight prefetch), so it is not the default; kept as the ``norm-prologue`` variant.
  All three are bit-identical.
- ``CublasLinear``: ``TritonLinear`` with torch's matmul (cuBLAS) in place of the Triton GEMV/GEMM:
  the default engine with only its linears swapped, the baseline the Triton GEMV is measured
  against.

Every Triton kernel is launched with programmatic dependent launch where the weight's device
supports it (Hopper and newer, compiled; backends/triton/pdl.py), decided once at construction.
"""

from __future__ import annotations

import torch

from tileinfer.backends.reference.linear import linear as torch_linear
from tileinfer.backends.triton.linear import linear, linear_unfused, norm_warps, num_sms
from tileinfer.backends.triton.norm import add, rms_norm
from tileinfer.backends.triton.pdl import pdl_supported
from tileinfer.backends.triton.swiglu import silu_mul
from tileinfer.interfaces import Linear
from tileinfer.plugins.reference.linear import ReferenceLinear
from tileinfer.plugins.triton.device import kernels_run_on, notice_reference_twin


class TritonLinear(Linear):
    """GEMV for steps of up to 16 tokens, GEMM above; norm, SwiGLU and residual add as kernels of
    their own."""

    name = "linear=triton"

    def __init__(self, weight: torch.Tensor, *, epilogue="none", out_dtype=None, quantize="none", norm=None) -> None:
        super().__init__(weight, epilogue=epilogue, out_dtype=out_dtype, quantize=quantize, norm=norm)
        self.weight = weight.contiguous()
        self._twin = None
        self.pdl = pdl_supported(weight.device)
        if not kernels_run_on(weight.device):
            notice_reference_twin(self.name)
            self._twin = ReferenceLinear(weight, epilogue=epilogue, out_dtype=out_dtype, quantize=quantize, norm=norm)

    def _norm_args(self) -> dict:
        if self.norm is None:
            return {}
        return dict(norm_weight=self.norm.weight, eps=self.norm.eps)

    def __call__(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        if self._twin is not None:
            return self._twin(x, residual)
        return linear_unfused(x, self.weight, out_dtype=self.out_dtype, epilogue=self.epilogue,
                              residual=residual, pdl=self.pdl, **self._norm_args())


class TritonFusedLinear(TritonLinear):
    name = "linear=triton_fused"

    def __call__(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        if self._twin is not None:
            return self._twin(x, residual)
        if self.norm is not None:
            warps = norm_warps(x.shape[0], self.weight.shape[0], self.in_features, sms=num_sms(x.device.index))
            x = rms_norm(x, self.norm.weight, self.norm.eps, pdl=self.pdl, num_warps=warps)
        return linear(x, self.weight, out_dtype=self.out_dtype, epilogue=self.epilogue, residual=residual,
                      pdl=self.pdl)


class TritonPrologueLinear(TritonLinear):
    name = "linear=triton_fused_prologue"

    def __call__(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        if self._twin is not None:
            return self._twin(x, residual)
        return linear(x, self.weight, out_dtype=self.out_dtype, epilogue=self.epilogue, residual=residual,
                      pdl=self.pdl, **self._norm_args())


class CublasLinear(TritonLinear):
    name = "linear=cublas"

    def __call__(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        if self._twin is not None:
            return self._twin(x, residual)
        if self.norm is not None:
            x = rms_norm(x, self.norm.weight, self.norm.eps, pdl=self.pdl)
        y = torch_linear(x, self.weight, self.out_dtype)
        if self.epilogue == "swiglu":
            y = silu_mul(y, pdl=self.pdl)
        return y if residual is None else add(y, residual, pdl=self.pdl)
