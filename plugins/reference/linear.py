"""ReferenceLinear: torch ops one after the other (RMSNorm, matmul, SwiGLU, residual add); INT8 by
int8 -> model dtype (exact), matmul with float32 accumulation, then the per-channel scale."""

from __future__ import annotations

import torch

from tileinfer.backends.reference.linear import linear
from tileinfer.backends.reference.linear_int8 import linear_int8
from tileinfer.backends.reference.rms_norm import rms_norm
from tileinfer.backends.reference.silu_mul import silu_mul
from tileinfer.interfaces import Linear
from tileinfer.quantize import int8_of


class ReferenceLinear(Linear):
    supported_quantize = ("none", "int8")

    def __init__(self, weight: torch.Tensor, *, epilogue="none", out_dtype=None, quantize="none", norm=None,
                 options=None) -> None:
        super().__init__(weight, epilogue=epilogue, out_dtype=out_dtype, quantize=quantize, norm=norm,
                         options=options)
        if quantize == "int8":
            self.weight, self.scale = int8_of(weight)  # as stored when pre-quantized
        else:
            self.weight, self.scale = weight, None

    def __call__(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        if self.norm is not None:
            x = rms_norm(x, self.norm.weight, self.norm.eps)
        if self.scale is None:
            y = linear(x, self.weight, self.out_dtype)
        else:
            y = linear_int8(x, self.weight, self.scale, self.out_dtype)
        if self.epilogue == "swiglu":
            y = silu_mul(y)
        return y if residual is None else y + residual
