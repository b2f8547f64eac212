"""ReferenceLinear: torch ops one after the other (RMSNorm, matmul, SwiGLU, residual add) on the
weight as its format stores it (``tileinfer.quantize.WEIGHT_FORMATS``): int8 rows by int8 -> model
dtype (exact), matmul with float32 accumulation, then the per-channel scale."""

from __future__ import annotations

import torch

from tileinfer.backends.reference.linear import linear
from tileinfer.backends.reference.rms_norm import rms_norm
from tileinfer.interfaces import Linear
from tileinfer.quantize import WEIGHT_FORMATS


class ReferenceLinear(Linear):
    supported_quantize = tuple(WEIGHT_FORMATS)

    def __init__(self, weight: torch.Tensor, *, epilogue="none", out_dtype=None, quantize="none", norm=None,
                 options=None) -> None:
        super().__init__(weight, epilogue=epilogue, out_dtype=out_dtype, quantize=quantize, norm=norm,
                         options=options)
        self.weight, self.scale = WEIGHT_FORMATS[quantize](weight)  # int8 ones as stored when pre-quantized

    def __call__(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        if self.norm is not None:
            x = rms_norm(x, self.norm.weight, self.norm.eps)
        return linear(x, self.weight, self.scale, out_dtype=self.out_dtype, swiglu=self.epilogue == "swiglu",
                      residual=residual)
