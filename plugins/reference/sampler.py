"""ReferenceSampler: penalties and no-repeat n-grams from the token history, then the sampling
distribution, in torch; drawn with Sampler.draw (as torch.multinomial draws)."""

from __future__ import annotations

import torch

from tileinfer.backends.reference.penalties import penalize
from tileinfer.backends.reference.penalties_ngram import ban_repeated_ngrams
from tileinfer.backends.reference.sampling import sampling_probs
from tileinfer.interfaces import Sample, Sampler, TokenHistory
from tileinfer.options import Option


class ReferenceSampler(Sampler):
    """Penalties (``SamplingParams``) and ``options.reference.no_repeat_ngram`` on the logits, then
    temperature, top-k, top-p and min-p (``backends/reference/sampling.py``). With no penalty and no
    n-gram ban it reads no history (``uses_history`` is false), and greedy sampling is one argmax."""

    declared_options = (Option("no_repeat_ngram", int, 0, "n > 0: never sample a token that repeats an n-gram "
                               "of the prompt or the reply (Hugging Face's no_repeat_ngram_size); 0 is off",
                               minimum=0),)

    @property
    def uses_history(self) -> bool:
        return self.params.penalized or self.options["no_repeat_ngram"] > 0

    def logits(self, logits: torch.Tensor, history: TokenHistory | None) -> torch.Tensor:
        """``logits`` with the penalties and the n-gram ban that ``history`` calls for."""
        if history is None:
            return logits
        p, n = self.params, self.options["no_repeat_ngram"]
        if p.penalized:
            logits = penalize(logits, history.tokens, history.prompt_len, history.length,
                              presence=p.presence_penalty, frequency=p.frequency_penalty,
                              repetition=p.repetition_penalty)
        if n:
            logits = ban_repeated_ngrams(logits, history.tokens, history.length, n)
        return logits

    def probs(self, logits: torch.Tensor, history: TokenHistory | None = None) -> torch.Tensor:
        p = self.params
        return sampling_probs(self.logits(logits, history), p.temperature, p.top_k, p.top_p, p.min_p)

    def sample(self, logits: torch.Tensor, history: TokenHistory | None = None, *,
               return_probs: bool = False) -> Sample:
        if self.greedy and not return_probs:
            return Sample(self.logits(logits, history).argmax(-1))
        probs = self.probs(logits, history)
        tokens = probs.argmax(-1) if self.greedy else self.draw(probs)
        return Sample(tokens, probs if return_probs else None)
