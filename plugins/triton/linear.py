"""TritonLinear (SwiGLU as its own kernel) and TritonFusedLinear (SwiGLU in the epilogue).

Every kernel is launched with programmatic dependent launch where the weight's device supports it
(Hopper and newer, compiled; backends/triton/pdl.py), decided once at construction."""

from __future__ import annotations

import torch

from tileinfer.backends.triton.linear import linear
from tileinfer.backends.triton.pdl import pdl_supported
from tileinfer.backends.triton.swiglu import silu_mul
from tileinfer.interfaces import Linear
from tileinfer.plugins.reference.linear import ReferenceLinear
from tileinfer.plugins.triton.device import kernels_run_on, notice_reference_twin


class TritonLinear(Linear):
    """GEMV for steps of up to 16 tokens, GEMM above; ``epilogue="swiglu"`` runs silu_mul after."""

    fused_epilogue = False
    name = "linear=triton"

    def __init__(self, weight: torch.Tensor, *, epilogue="none", out_dtype=None, quantize="none") -> None:
        super().__init__(weight, epilogue=epilogue, out_dtype=out_dtype, quantize=quantize)
        self.weight = weight.contiguous()
        self._twin = None
        self.pdl = pdl_supported(weight.device)
        if not kernels_run_on(weight.device):
            notice_reference_twin(self.name)
            self._twin = ReferenceLinear(weight, epilogue=epilogue, out_dtype=out_dtype, quantize=quantize)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self._twin is not None:
            return self._twin(x)
        if self.epilogue == "swiglu" and self.fused_epilogue:
            return linear(x, self.weight, out_dtype=self.out_dtype, epilogue="swiglu", pdl=self.pdl)
        y = linear(x, self.weight, out_dtype=self.out_dtype, pdl=self.pdl)
        return silu_mul(y, pdl=self.pdl) if self.epilogue == "swiglu" else y


class TritonFusedLinear(TritonLinear):
    fused_epilogue = True
    name = "linear=triton_fused"
