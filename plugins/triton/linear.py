"""The Triton Linear: GEMV for steps of up to 16 tokens, GEMM above, with the RMSNorm before and
the SwiGLU / residual-add epilogues after, fused or as kernels of their own (``options.triton``).

Every combination of options gives the same bits: the fused GEMV/GEMM applies the epilogues with
the arithmetic of the per-op kernels (backends/triton/linear.py), and the separate RMSNorm kernel
runs with the warps of the GEMV's prologue. ``matmul=torch`` swaps the Triton GEMV/GEMM for
torch's matmul (cuBLAS), the baseline the Triton GEMV is measured against.

``quantize=int8``: weight-only INT8 (one int8 row and one float32 scale per output channel, the
weight quantized here, or taken as stored from a pre-quantized checkpoint) on the W8A16 GEMV/GEMM
of backends/triton/linear_int8.py, with the same options, prologue and epilogues; ``matmul=torch``
then runs the reference twin (int8 -> model dtype, torch's matmul, the scale).
"""

from __future__ import annotations

import torch

from tileinfer.backends.reference.linear import linear as torch_linear
from tileinfer.backends.reference.linear_int8 import linear_int8 as torch_linear_int8
from tileinfer.backends.triton.add import add
from tileinfer.backends.triton.linear import linear, norm_warps, num_sms
from tileinfer.backends.triton.linear_int8 import linear_int8, norm_warps_int8
from tileinfer.backends.triton.pdl import pdl_supported
from tileinfer.backends.triton.rms_norm import rms_norm
from tileinfer.backends.triton.silu_mul import silu_mul
from tileinfer.interfaces import Linear, RunSpec
from tileinfer.options import Option
from tileinfer.plugins.triton.kernels_available import device_reasons
from tileinfer.quantize import int8_of

PDL = Option("pdl", bool, True, "programmatic dependent launch on Hopper and newer GPUs: each kernel is placed "
             "while the one before finishes, and prefetches what no kernel writes (same bits)")


class TritonLinear(Linear):
    supported_quantize = ("none", "int8")
    declared_options = (
        Option("fuse_epilogue", bool, True, "SwiGLU and the residual add in the GEMV/GEMM epilogue "
               "(false: a kernel each after the matmul)"),
        Option("norm_prologue", bool, False, "the RMSNorm inside the GEMV (steps of up to 16 tokens; each "
               "program re-reduces the row) instead of a kernel of its own before it"),
        Option("matmul", str, "triton", "triton: the Triton GEMV/GEMM; torch: torch's matmul (cuBLAS) between "
               "the Triton RMSNorm, SwiGLU and add kernels (needs fuse_epilogue=false, norm_prologue=false)",
               choices=("triton", "torch")),
        PDL,
    )

    @classmethod
    def incompatibilities(cls, run: RunSpec) -> list[str]:
        reasons = super().incompatibilities(run) + device_reasons("linear", run.device)
        o = run.options
        if o["matmul"] == "torch" and (o["fuse_epilogue"] or o["norm_prologue"]):
            reasons.append("options.triton.matmul=torch runs the norm, SwiGLU and residual add as kernels of their "
                           "own: set options.triton.fuse_epilogue=false and options.triton.norm_prologue=false")
        return reasons

    def __init__(self, weight: torch.Tensor, *, epilogue="none", out_dtype=None, quantize="none", norm=None,
                 options=None) -> None:
        super().__init__(weight, epilogue=epilogue, out_dtype=out_dtype, quantize=quantize, norm=norm,
                         options=options)
        if quantize == "int8":
            self.weight, self.scale = int8_of(weight)  # int8 [rows, in], float32 [rows]
        else:
            self.weight, self.scale = weight.contiguous(), None
        self.pdl = self.options["pdl"] and pdl_supported(weight.device)

    def __call__(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        o, swiglu = self.options, self.epilogue == "swiglu"
        prologue = {}
        if self.norm is not None and o["norm_prologue"]:
            prologue = dict(norm_weight=self.norm.weight, eps=self.norm.eps)
        elif self.norm is not None:
            rule = norm_warps if self.scale is None else norm_warps_int8
            warps = None if o["matmul"] == "torch" else rule(
                x.shape[0], self.weight.shape[0], self.in_features, sms=num_sms(x.device.index))
            x = rms_norm(x, self.norm.weight, self.norm.eps, pdl=self.pdl, num_warps=warps)
        if o["matmul"] == "torch":
            y = (torch_linear(x, self.weight, self.out_dtype) if self.scale is None
                 else torch_linear_int8(x, self.weight, self.scale, self.out_dtype))
        elif o["fuse_epilogue"]:
            return self._matmul(x, out_dtype=self.out_dtype, swiglu=swiglu, residual=residual, pdl=self.pdl,
                                **prologue)
        else:
            y = self._matmul(x, out_dtype=self.out_dtype, pdl=self.pdl, **prologue)
        if swiglu:
            y = silu_mul(y, pdl=self.pdl)
        return y if residual is None else add(y, residual, pdl=self.pdl)

    def _matmul(self, x: torch.Tensor, **kw) -> torch.Tensor:
        """The Triton GEMV/GEMM of the stored weight: model dtype, or int8 with its scales."""
        if self.scale is None:
            return linear(x, self.weight, **kw)
        return linear_int8(x, self.weight, self.scale, **kw)
