"""Linear: y = x W^T for one projection of the model, with the RMSNorm before it and the epilogues
after it (SwiGLU, the residual add) that an implementation may fuse."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from tileinfer.errors import ConfigError
from tileinfer.interfaces.pluggable import Pluggable, RunSpec

EPILOGUES = ("none", "swiglu")


@dataclass(frozen=True)
class RMSNorm:
    """An RMSNorm applied to a Linear's input: ``weight`` ``[in_features]`` in the model dtype,
    ``eps`` inside the root (Hugging Face Qwen3's arithmetic: normalize in float32, round to the
    model dtype, multiply by the weight, round)."""

    weight: torch.Tensor
    eps: float


class Linear(Pluggable, ABC):
    """One bias-free linear layer, built once at load and called every step.

    Construction takes the checkpoint weight, ``[rows, in_features]`` in the model dtype and already
    on the target device; the implementation decides how it stores it (as is, quantized, repacked)
    and may free the original.

    - ``epilogue="none"``: ``y = x W^T``, ``[T, rows]``.
    - ``epilogue="swiglu"``: ``W`` is the fused ``[gate; up]`` projection (``rows = 2 I``) and
      ``y = silu(x Wg^T) * (x Wu^T)``, ``[T, I]``. Whether this is one kernel or two is the
      implementation's business.
    - ``out_dtype``: dtype of ``y``; the model dtype by default, ``torch.float32`` for the lm_head
      logits (accumulated and written in float32).
    - ``quantize="int8"``: weight-only, symmetric, one int8 row and one float32 scale per output
      channel, quantized here at construction. An implementation lists what it supports in
      ``supported_quantize`` (checked by ``incompatibilities`` before any weight loads).
    - ``norm``: the input is RMS-normalized first, ``y = rms_norm(x) W^T`` (the model's
      input_layernorm before qkv, post_attention_layernorm before gate_up, the final norm before
      the lm_head), so that an implementation may fuse the norm into its kernel.
    - A call with ``residual`` (``[T, out_features]``, model dtype; only with model-dtype output)
      returns ``residual + y``, rounded once (the decoder's residual stream after o_proj and down).
    - ``options``: this implementation's ``declared_options`` values (defaults where not given).
    """

    supported_quantize: ClassVar[tuple[str, ...]] = ("none",)

    def __init__(
        self,
        weight: torch.Tensor,
        *,
        epilogue: str = "none",
        out_dtype: torch.dtype | None = None,
        quantize: str = "none",
        norm: RMSNorm | None = None,
        options: Mapping[str, Any] | None = None,
    ) -> None:
        self._take_options(options)
        if epilogue not in EPILOGUES:
            raise ConfigError(f"unknown linear epilogue {epilogue!r}; valid: {', '.join(EPILOGUES)}")
        if quantize not in self.supported_quantize:
            raise ConfigError(
                f"linear implementation {type(self).__name__} does not support quantize={quantize}; "
                f"it supports: {', '.join(self.supported_quantize)}"
            )
        if weight.dim() != 2:
            raise ValueError(f"linear weight must be 2-D, got shape {tuple(weight.shape)}")
        rows, self.in_features = weight.shape
        if epilogue == "swiglu" and rows % 2:
            raise ValueError(f"swiglu epilogue needs an even number of rows, got {rows}")
        self.out_features = rows // 2 if epilogue == "swiglu" else rows
        self.epilogue = epilogue
        self.quantize = quantize
        self.dtype = weight.dtype
        self.out_dtype = out_dtype or weight.dtype
        if norm is not None and norm.weight.shape != (self.in_features,):
            raise ValueError(f"norm weight must be [{self.in_features}], got {tuple(norm.weight.shape)}")
        self.norm = norm

    @classmethod
    def incompatibilities(cls, run: RunSpec) -> list[str]:
        if run.quantize not in cls.supported_quantize:
            return [f"quantize={run.quantize} is not supported (supported: {', '.join(cls.supported_quantize)})"]
        return []

    @classmethod
    def workspace_bytes(cls, run: RunSpec, linear_shapes: Mapping[str, tuple[int, int]]) -> int:
        """Bytes the implementation allocates at load beside the weights, for a model whose Linears
        have ``linear_shapes`` (``ModelConfig.linear_shapes``: name -> ``[rows, in_features]``)
        under ``run`` (a buffer its layers share, say). The memory estimates (``check_fits``,
        ``kv_capacity=auto``) count it with the weights. None here: 0."""
        return 0

    @abstractmethod
    def __call__(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        """``x``: ``[T, in_features]`` in the model dtype -> ``[T, out_features]`` in ``out_dtype``
        (plus ``residual`` when given)."""

