"""A tileinfer plugin: sampler ``argmin``, the least likely token (easy to recognise in a test)."""

import torch

import tileinfer
from tileinfer.interfaces import Sample, Sampler, TokenHistory


class ArgminSampler(Sampler):
    """The least likely token; with ``options.argmin.rank=r``, the (r + 1)-th least likely."""

    declared_options = (tileinfer.Option("rank", int, 0, "0: the least likely token; r: the (r + 1)-th",
                                         minimum=0),)

    def probs(self, logits: torch.Tensor, history: TokenHistory | None = None) -> torch.Tensor:
        token = logits.argsort(-1)[:, self.options["rank"]]
        return torch.nn.functional.one_hot(token, logits.shape[-1]).float()

    def sample(self, logits: torch.Tensor, history: TokenHistory | None = None, *,
               return_probs: bool = False) -> Sample:
        probs = self.probs(logits, history)
        return Sample(probs.argmax(-1), probs if return_probs else None)


@tileinfer.hookimpl
def tileinfer_implementations():
    return [tileinfer.Implementation("sampler", "argmin", ArgminSampler, "the least likely token")]
