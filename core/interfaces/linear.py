"""Linear: y = x W^T for one projection of the model, with an optional fused epilogue."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

import torch

from tileinfer.errors import ConfigError

EPILOGUES = ("none", "swiglu")
QUANTIZE_MODES = ("none", "int8")


class Linear(ABC):
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
      ``supported_quantize``.
    """

    supported_quantize: ClassVar[tuple[str, ...]] = ("none",)

    def __init__(
        self,
        weight: torch.Tensor,
        *,
        epilogue: str = "none",
        out_dtype: torch.dtype | None = None,
        quantize: str = "none",
    ) -> None:
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

    @abstractmethod
    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """``x``: ``[T, in_features]`` in the model dtype -> ``[T, out_features]`` in ``out_dtype``."""

