"""Ops: the small model ops that are not one of the five interfaces (embedding, norms, adds).

An implementation is a named set, chosen by the config key ``ops`` together with the other
backends. ``add_rms_norm`` is one call so that a backend may fuse the residual add into the norm.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch


class Ops(ABC):
    """Embedding lookup, RMSNorm and residual add + RMSNorm, all in the model dtype."""

    @abstractmethod
    def embedding(self, token_ids: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """``token_ids`` ``[T]`` int64, ``weight`` ``[V, H]`` -> ``[T, H]``."""

    @abstractmethod
    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        """``x`` ``[T, H]`` -> ``weight * x / rms(x)``, computed in float32, ``[T, H]``."""

    @abstractmethod
    def add_rms_norm(
        self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``s = x + residual`` (rounded to the model dtype), returns ``(rms_norm(s), s)``."""
