"""Logit bias (``SamplingParams.logit_bias``, OpenAI's ``logit_bias``): a value added to chosen
tokens' logits before anything else of sampling, on the device.

``LogitBias`` stands in front of the engine's sampler (any Sampler plugin), a ``SamplerStage`` as
``StopTokenBan`` is (``tileinfer.stops``): it adds a generation's bias to the float32 logits of every row, then
hands them on, so the penalties, temperature, top-k/p, min-p and greedy's argmax all see the
biased logits: +100 makes a token all but certain, -100 all but impossible (OpenAI's scale: a
value of -100 to 100 per token id). Logprobs stay those of the raw logits (``tileinfer.sampling_step``).

The device-resident speculative loop verifies with the raw argmax and takes no bias: a generation
with a bias runs host drafting instead (``tileinfer.decode_plan.DecodePlan.choose``, which says so).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from tileinfer.interfaces import Sampler, TokenHistory
from tileinfer.sampler_stage import SamplerStage
from tileinfer.sampling_params import MAX_BIAS, check_logit_bias

class LogitBias(SamplerStage):
    """``sampler`` with a generation's logit bias (``set``) added to the logits it is given."""

    def __init__(self, sampler: Sampler) -> None:  # noqa: D107 - no options of its own: the sampler's
        super().__init__(sampler)
        self.ids: torch.Tensor | None = None  # [B] int64 on the device
        self.values: torch.Tensor | None = None  # [B] float32

    def set(self, bias: Mapping[int, float] | None) -> None:
        """The bias of the next generation (None or empty: none); ids checked against the
        vocabulary by the caller."""
        if not bias:
            self.ids = self.values = None
            return
        device = self.sampler.device
        self.ids = torch.tensor(list(bias), dtype=torch.int64, device=device)
        self.values = torch.tensor(list(bias.values()), dtype=torch.float32, device=device)

    @property
    def active(self) -> bool:
        return self.ids is not None

    def biased(self, logits: torch.Tensor) -> torch.Tensor:
        """``logits`` ``[T, V]`` with the bias added to its columns (a copy; the same tensor without a bias)."""
        if self.ids is None:
            return logits
        logits = logits.clone()
        logits[:, self.ids] += self.values
        return logits

    def adjust(self, logits: torch.Tensor, history: TokenHistory | None) -> torch.Tensor:
        return self.biased(logits)


__all__ = ["LogitBias", "MAX_BIAS", "check_logit_bias"]
