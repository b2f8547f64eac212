"""``SamplerStage``: a Sampler in front of another that changes the logits, then hands them on.

The decoder composes the engine's sampler (any Sampler plugin) with stages of its own, each a
``SamplerStage``: the stop-token ban of ``min_tokens`` (``tileinfer.stops.StopTokenBan``) and the
logit bias (``tileinfer.logit_bias.LogitBias``). A stage has no options, parameters or generator of
its own (the inner sampler's), reads the token history only where it says so (``uses_history``),
and hands the inner sampler the history only where that sampler reads one.
"""

from __future__ import annotations

import torch

from tileinfer.interfaces import Sample, Sampler, SamplingParams, TokenHistory


class SamplerStage(Sampler):
    """``sampler`` with ``adjust`` applied to the logits of every ``probs`` and ``sample`` call."""

    def __init__(self, sampler: Sampler) -> None:  # noqa: D107 - no options of its own: the sampler's
        self.sampler = sampler

    @property
    def params(self) -> SamplingParams:
        return self.sampler.params

    @property
    def device(self) -> torch.device:
        return self.sampler.device

    @property
    def generator(self) -> torch.Generator:
        return self.sampler.generator

    @property
    def uses_history(self) -> bool:
        return self.sampler.uses_history

    def adjust(self, logits: torch.Tensor, history: TokenHistory | None) -> torch.Tensor:
        """The logits ``[T, V]`` the inner sampler gets (row ``i`` follows ``history`` when given)."""
        return logits

    def _inner(self, logits: torch.Tensor, history: TokenHistory | None) -> tuple[torch.Tensor, dict]:
        inner = {"history": history} if history is not None and self.sampler.uses_history else {}
        return self.adjust(logits, history), inner

    def probs(self, logits: torch.Tensor, history: TokenHistory | None = None) -> torch.Tensor:
        logits, inner = self._inner(logits, history)
        return self.sampler.probs(logits, **inner)

    def sample(self, logits: torch.Tensor, history: TokenHistory | None = None, *,
               return_probs: bool = False) -> Sample:
        logits, inner = self._inner(logits, history)
        return self.sampler.sample(logits, return_probs=return_probs, **inner)


__all__ = ["SamplerStage"]
