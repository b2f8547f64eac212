"""ReferenceSampler: the sampling distribution in torch, drawn with Sampler.draw (as torch.multinomial draws)."""

from __future__ import annotations

import torch

from tileinfer.backends.reference.sampling import sampling_probs
from tileinfer.interfaces import Sample, Sampler


class ReferenceSampler(Sampler):
    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        p = self.params
        return sampling_probs(logits, p.temperature, p.top_k, p.top_p, p.min_p)

    def sample(self, logits: torch.Tensor, *, return_probs: bool = False) -> Sample:
        if self.greedy and not return_probs:
            return Sample(logits.argmax(-1))
        probs = self.probs(logits)
        tokens = probs.argmax(-1) if self.greedy else self.draw(probs)
        return Sample(tokens, probs if return_probs else None)
