"""Sampler: the next token(s) from logits, and the distribution it drew them from."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from tileinfer.config import check_sampling
from tileinfer.interfaces.pluggable import Pluggable


@dataclass(frozen=True)
class SamplingParams:
    """``temperature = 0`` is greedy; ``top_k = 0``, ``top_p = 1`` and ``min_p = 0`` are off.

    Checked as the config checks them (``config.check_sampling``, a ConfigError naming the value):
    finite floats, ``temperature >= 0``, ``0 < top_p <= 1``, ``0 <= min_p < 1``, ``top_k >= 0``,
    a seed in ``[0, 2**63 - 1]``."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int = 0

    def __post_init__(self) -> None:
        check_sampling(self.temperature, self.top_k, self.top_p, self.min_p, self.seed)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclass
class Sample:
    """``tokens`` ``[T]`` int64; ``probs`` ``[T, V]`` float32 when asked for, else None."""

    tokens: torch.Tensor
    probs: torch.Tensor | None = None


class Sampler(Pluggable, ABC):
    """Draws tokens from float32 logits ``[T, V]``, one per row, with its own seeded generator.

    ``probs`` is the distribution ``sample`` draws from (after temperature, top-k, top-p, min-p;
    one-hot at the argmax when greedy): the target's ``p`` in speculative sampling. ``generator``
    is the only source of randomness, so a seed reproduces a generation.
    """

    def __init__(self, params: SamplingParams, device: torch.device, *,
                 options: Mapping[str, Any] | None = None) -> None:
        self._take_options(options)
        self.params = params
        self.device = torch.device(device)
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(params.seed)

    @property
    def greedy(self) -> bool:
        return self.params.greedy

    @abstractmethod
    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """``[T, V]`` float32 logits -> ``[T, V]`` float32 probabilities that sum to 1 per row."""

    @abstractmethod
    def sample(self, logits: torch.Tensor, *, return_probs: bool = False) -> Sample:
        """One token per row of ``logits``; with ``return_probs`` also the rows' ``probs``."""

    def draw(self, probs: torch.Tensor) -> torch.Tensor:
        """One token per row of a given distribution ``[T, V]``, with this sampler's generator.

        ``argmax(probs / E)`` with ``E ~ Exp(1)`` per entry: exactly what ``torch.multinomial(probs,
        1)`` computes (same draws from the generator, same tokens), without its validity checks,
        which read the device on the host (two syncs per call) and so would stall pipelined
        decoding. ``probs`` must be a distribution (non-negative, finite, a positive sum per row).
        """
        noise = torch.empty_like(probs).exponential_(1, generator=self.generator)
        return (probs / noise).argmax(-1)

    def uniform(self, n: int) -> torch.Tensor:
        """``n`` draws from U[0, 1) with this sampler's generator, float32 on its device."""
        return torch.rand(n, generator=self.generator, device=self.device)
