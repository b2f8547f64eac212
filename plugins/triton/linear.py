"""The Triton Linear: GEMV for steps of up to 16 tokens, GEMM above, with the RMSNorm kernel before
and the SwiGLU / residual-add epilogues after, fused or as kernels of their own (``options.triton``).

A weight format (``quantize``) is what the layer stores for its checkpoint weight
(``tileinfer.quantize.WEIGHT_FORMATS``: the weight as it is, or int8 rows with one float32 scale per
output channel, quantized here or taken as stored from a pre-quantized checkpoint); every format
runs the one ``linear(x, weight, scale)`` of backends/triton/linear.py with the same options and
epilogues. Every combination of options gives the same bits: the fused GEMV/GEMM applies the
epilogues with the arithmetic of the per-op kernels, on the tiles of the per-op call.
``matmul=torch`` swaps the Triton GEMV/GEMM for the reference twin (torch's matmul, cuBLAS; int8
weights converted to the model dtype first, then the scale), the baseline the Triton GEMV is
measured against.

``int8_layout``: int8 weights kept as rows, or reordered once here into the ``fragments`` layout
(backends/triton/linear_layout.py), the one copy that every call reads (GEMM, GEMV, the twin of
``matmul=torch``). A layer in ``fragments`` has no ``weight`` attribute (its ``packed`` holds the
bytes), so that a reader of int8 rows (the persistent step) finds none and says so.

``int8_prefill_dequant``: from that many tokens on (a prefill chunk), an int8 layer writes its
weight's values into a model-dtype scratch buffer shared by every layer (dequant_scratch.py;
backends/triton/int8_dequant.py, either layout) and runs the model-dtype GEMM on them with its
float32 row scales on the accumulator, on the model-dtype rule's tiles: the W8A16 arithmetic (the
same products and scales, summed in the model-dtype tiles' order), in place of the W8A16 GEMM whose
in-register conversion bounds it at prefill. A linear whose output is not in the model dtype (the
lm_head's float32 logits of a 16-bit model: 389 M weights at Qwen3-4B, 778 MB of scratch, for a
prefill that computes one row) keeps the W8A16 GEMM, as do float32 models and ``matmul=torch``. The
default, 1,024 tokens: on an H100 it beat the W8A16 GEMM at 1,024 and 8,192 tokens and lost at 256
(docs/performance-log.md); the scratch is this class's ``workspace_bytes``, which the memory
estimates count.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import torch

from tileinfer.backends.reference.linear import FRAGMENT_K, pack_fragments
from tileinfer.backends.reference.linear import linear as torch_linear
from tileinfer.backends.triton import SMALL_STEP_MAX_TOKENS
from tileinfer.backends.triton.add import add
from tileinfer.backends.triton.int8_dequant import dequantize_int8
from tileinfer.backends.triton.linear import layer_counters, linear, rule_config
from tileinfer.backends.triton.pdl import pdl_supported
from tileinfer.backends.triton.rms_norm import rms_norm
from tileinfer.backends.triton.silu_mul import silu_mul
from tileinfer.interfaces import Linear, RunSpec
from tileinfer.options import Option
from tileinfer.plugins.triton.dequant_scratch import shared
from tileinfer.plugins.triton.kernels_available import device_reasons
from tileinfer.quantize import WEIGHT_FORMATS

DEQUANT_FROM = 1024  # int8_prefill_dequant's default


def dequantizes(options: Mapping, quantize: str, dtype: torch.dtype) -> bool:
    """Whether int8 layers of a run take ``int8_prefill_dequant``'s path at some step: int8 weights,
    a 16-bit model, the Triton GEMM and a threshold."""
    return (bool(options["int8_prefill_dequant"]) and quantize == "int8" and options["matmul"] == "triton"
            and dtype in (torch.bfloat16, torch.float16))


PDL = Option("pdl", bool, True, "programmatic dependent launch on Hopper and newer GPUs: each kernel is placed "
             "while the one before finishes, and prefetches what no kernel writes (same bits)")


class TritonLinear(Linear):
    supported_quantize = tuple(WEIGHT_FORMATS)
    declared_options = (
        Option("fuse_epilogue", bool, True, "SwiGLU and the residual add in the GEMV/GEMM epilogue "
               "(false: a kernel each after the matmul)"),
        Option("matmul", str, "triton", "triton: the Triton GEMV/GEMM; torch: torch's matmul (cuBLAS) between "
               "the Triton RMSNorm, SwiGLU and add kernels (needs fuse_epilogue=false)", choices=("triton", "torch")),
        PDL,
        Option("int8_convert", str, "bits", "how the GEMV/GEMM turn int8 weights into floats (the same values): "
               "bit patterns, byte permutes (inline PTX: a CUDA GPU only), or Triton's cast",
               choices=("bits", "permute", "cast")),
        Option("int8_layout", str, "rows", "how int8 weights are stored, reordered once at load: rows, or fragments "
               "(each row's 64-column groups in the order the tensor cores' register fragments read them: 16-byte "
               "loads in the prefill GEMM, the same bits there; the GEMV sums in another order)",
               choices=("rows", "fragments")),
        Option("int8_prefill_dequant", int, DEQUANT_FROM, "int8 weights at prefill, 16-bit models, matmul=triton: "
               f"from this many tokens on (0: never; else > {SMALL_STEP_MAX_TOKENS}) a call writes its weight's "
               "values into a model-dtype scratch buffer and runs the model-dtype GEMM with the scales (the W8A16 "
               "arithmetic on the BF16 tiles); costs one buffer of the largest decoder weight in the model dtype "
               "(Qwen3-4B: 100 MB, 0.6B: 13 MB), counted by the memory estimates; the lm_head keeps the W8A16 "
               "GEMM", minimum=0),
    )

    @classmethod
    def incompatibilities(cls, run: RunSpec) -> list[str]:
        reasons = super().incompatibilities(run) + device_reasons("linear", run.device)
        if run.options["int8_convert"] == "permute" and run.device.type != "cuda":
            reasons.append(f"options.triton.int8_convert=permute is inline PTX: it needs a CUDA GPU, and device is "
                           f"{run.device.type}")
        if run.options["int8_layout"] == "fragments" and run.quantize != "int8":
            reasons.append(f"options.triton.int8_layout=fragments is a layout of int8 weights, and quantize is "
                           f"{run.quantize}: set quantize=int8")
        dequant = run.options["int8_prefill_dequant"]
        if 0 < dequant <= SMALL_STEP_MAX_TOKENS:
            reasons.append(f"options.triton.int8_prefill_dequant={dequant}: steps of up to {SMALL_STEP_MAX_TOKENS} "
                           f"tokens take the GEMV; set 0 (off) or more than {SMALL_STEP_MAX_TOKENS}")
        if run.options["matmul"] == "torch" and run.options["fuse_epilogue"]:
            reasons.append("options.triton.matmul=torch runs the SwiGLU and residual add as kernels of their own: "
                           "set options.triton.fuse_epilogue=false")
        return reasons

    def __init__(self, weight: torch.Tensor, *, epilogue="none", out_dtype=None, quantize="none", norm=None,
                 options=None) -> None:
        super().__init__(weight, epilogue=epilogue, out_dtype=out_dtype, quantize=quantize, norm=norm,
                         options=options)
        stored, self.scale = WEIGHT_FORMATS[quantize](weight)  # int8 [rows, in] and float32 [rows] scales
        self.int8_layout = self.options["int8_layout"] if self.scale is not None else "rows"
        if self.int8_layout == "fragments":
            if stored.shape[1] % FRAGMENT_K:
                raise ValueError(f"options.triton.int8_layout=fragments takes in_features a multiple of {FRAGMENT_K}, "
                                 f"and this layer has {stored.shape[1]}")
            self.packed = pack_fragments(stored)
        else:
            self.weight = stored
        self.pdl = self.options["pdl"] and pdl_supported(weight.device)
        self.counters = layer_counters(self._stored, self.scale)  # the GEMVs' split-K counters, 0 between launches
        self.dequant_from, self.scratch = 0, None  # tokens from which calls take the dequantized GEMM
        if dequantizes(self.options, self.quantize, self.dtype) and self.out_dtype == self.dtype:
            self.dequant_from, self.scratch = self.options["int8_prefill_dequant"], shared(weight.device, self.dtype)
            self.scratch.reserve(self._stored.numel())

    @classmethod
    def workspace_bytes(cls, run: RunSpec, linear_shapes: Mapping[str, tuple[int, int]]) -> int:
        """The scratch of ``int8_prefill_dequant`` where it applies: the largest Linear but the lm_head
        (which keeps the W8A16 GEMM) in the model dtype."""
        if not dequantizes(run.options, run.quantize, run.dtype):
            return 0
        rows, cols = max((shape for name, shape in linear_shapes.items() if name != "lm_head"),
                         key=lambda shape: shape[0] * shape[1])
        return rows * cols * torch.finfo(run.dtype).bits // 8

    @property
    def _stored(self) -> torch.Tensor:
        """The weight as ``linear`` reads it: ``weight`` (model dtype or int8 rows) or ``packed``."""
        return self.packed if self.int8_layout == "fragments" else self.weight

    def _weight(self, x: torch.Tensor) -> tuple[torch.Tensor, str]:
        """The weight this call's GEMM reads and its int8 layout: the stored one, or from
        ``dequant_from`` tokens on its values written into the scratch (model dtype, rows)."""
        if not self.dequant_from or x.shape[0] < self.dequant_from:
            return self._stored, self.int8_layout
        rows, cols = self._stored.shape
        values = dequantize_int8(self._stored, x.dtype, out=self.scratch.view(rows, cols),
                                 int8_layout=self.int8_layout)
        return values, "rows"

    def _config(self, x: torch.Tensor, w: torch.Tensor, swiglu: bool):
        """The rule's tiles with ``options.triton.int8_convert`` for int8 weights; None (the rule's own
        choice, made by ``linear``) otherwise."""
        if w.dtype != torch.int8 or self.options["int8_convert"] == "bits":
            return None
        cfg = rule_config(x, w, self.scale, swiglu=swiglu, out_dtype=self.out_dtype)
        return dataclasses.replace(cfg, int8_convert=self.options["int8_convert"])

    def __call__(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        o, swiglu = self.options, self.epilogue == "swiglu"
        if self.norm is not None:
            x = rms_norm(x, self.norm.weight, self.norm.eps, pdl=self.pdl)
        w, layout = self._weight(x)
        if o["matmul"] == "torch":
            y = torch_linear(x, w, self.scale, out_dtype=self.out_dtype, int8_layout=layout)
        elif o["fuse_epilogue"]:
            return linear(x, w, self.scale, out_dtype=self.out_dtype, swiglu=swiglu, residual=residual,
                          pdl=self.pdl, counters=self.counters, config=self._config(x, w, swiglu), int8_layout=layout)
        else:  # the fused call's tiles, so that the chain below gives its bits
            config = self._config(x, w, swiglu) or rule_config(x, w, self.scale, swiglu=swiglu,
                                                               out_dtype=self.out_dtype)
            y = linear(x, w, self.scale, out_dtype=self.out_dtype, config=config, pdl=self.pdl,
                       counters=self.counters, int8_layout=layout)
        if swiglu:
            y = silu_mul(y, pdl=self.pdl)
        return y if residual is None else add(y, residual, pdl=self.pdl)
