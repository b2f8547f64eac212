"""ReferenceLinear: torch matmul, then the epilogue as separate ops; INT8 by dequantize + matmul."""

from __future__ import annotations

import torch

from tileinfer.backends.reference.linear import linear, linear_int8, quantize_int8, silu_mul
from tileinfer.interfaces import Linear


class ReferenceLinear(Linear):
    supported_quantize = ("none", "int8")

    def __init__(self, weight: torch.Tensor, *, epilogue="none", out_dtype=None, quantize="none") -> None:
        super().__init__(weight, epilogue=epilogue, out_dtype=out_dtype, quantize=quantize)
        if quantize == "int8":
            self.weight, self.scale = quantize_int8(weight)
        else:
            self.weight, self.scale = weight, None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.scale is None:
            y = linear(x, self.weight, self.out_dtype)
        else:
            y = linear_int8(x, self.weight, self.scale, self.out_dtype)
        return silu_mul(y) if self.epilogue == "swiglu" else y
