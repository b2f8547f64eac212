"""Registers sampler ``argmin``: always the least likely token, easy to recognise in a test."""

import torch

import tileinfer
from tileinfer.interfaces import Sample, Sampler


class ArgminSampler(Sampler):
    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.one_hot(logits.argmin(-1), logits.shape[-1]).float()

    def sample(self, logits: torch.Tensor, *, return_probs: bool = False) -> Sample:
        probs = self.probs(logits)
        return Sample(probs.argmax(-1), probs if return_probs else None)


@tileinfer.hookimpl
def tileinfer_implementations():
    return [tileinfer.Implementation("sampler", "argmin", ArgminSampler, "the least likely token (demo)")]
