"""The decoder's view of its sampler during one generation: the token history and the logprobs.

``SamplingStep`` stands where the decoder used the sampler (prefill, plain steps, verify rules,
pipelined steps): it hands the sampler the ``TokenHistory`` (only when the sampler
``uses_history`` for the generation's params: otherwise nothing is kept and the sampler is
called exactly as before) and, when logprobs were asked for, keeps the last logits sampled from.

Logprobs are of the model's distribution: ``log_softmax`` of the raw float32 logits, before
penalties, temperature and truncation (what vLLM returns by default), for the chosen token and the
``top`` most likely ones.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from tileinfer.errors import UsageError
from tileinfer.interfaces import Sample, Sampler, TokenHistory

MAX_TOP_LOGPROBS = 20


@dataclass
class TokenLogprob:
    """One generated token's log-probability under the model, and the ``top`` most likely tokens of
    its position (``(token_id, logprob)``, most likely first)."""

    token_id: int
    logprob: float
    top: list[tuple[int, float]] = field(default_factory=list)


def check_logprobs(value: object) -> int | None:
    """``None`` (none) or the number of top tokens per position, 0 to ``MAX_TOP_LOGPROBS``."""
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_TOP_LOGPROBS:
        raise UsageError(f"logprobs must be None or an integer in [0, {MAX_TOP_LOGPROBS}] (top tokens per position), "
                         f"got {value!r}")
    return value


class SamplingStep:
    """``sampler`` for one generation of ``prompt``; ``capacity``: tokens the history may hold
    (prompt, reply and one verify step's drafts); ``logprobs``: top tokens per position, or None."""

    def __init__(self, sampler: Sampler, prompt: Sequence[int], capacity: int, logprobs: int | None = None) -> None:
        self.sampler = sampler
        self.history = TokenHistory(prompt, capacity, sampler.device) if sampler.uses_history else None
        self.top = logprobs
        self.logits: torch.Tensor | None = None

    # what the decoding code reads of a sampler
    @property
    def greedy(self) -> bool:
        return self.sampler.greedy

    @property
    def params(self):
        return self.sampler.params

    def draw(self, probs: torch.Tensor) -> torch.Tensor:
        return self.sampler.draw(probs)

    def uniform(self, n: int) -> torch.Tensor:
        return self.sampler.uniform(n)

    def sample(self, logits: torch.Tensor, *, return_probs: bool = False) -> Sample:
        if self.top is not None:
            self.logits = logits
        if self.history is None:
            return self.sampler.sample(logits, return_probs=return_probs)
        return self.sampler.sample(logits, history=self.history, return_probs=return_probs)

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        if self.top is not None:
            self.logits = logits
        if self.history is None:
            return self.sampler.probs(logits)
        return self.sampler.probs(logits, history=self.history)

    # the history
    def commit(self, tokens: Sequence[int] | torch.Tensor) -> None:
        """Tokens committed after the last ones (host ints, or a device tensor: no sync)."""
        if self.history is not None:
            self.history.commit(tokens)

    def stage(self, drafts: Sequence[int]) -> None:
        """The drafts a verify step feeds after the committed tokens."""
        if self.history is not None:
            self.history.stage(drafts)

    # logprobs
    def logprobs_of(self, tokens: Sequence[int]) -> list[TokenLogprob]:
        """The logprobs of ``tokens``, token ``i`` drawn from row ``i`` of the last logits sampled
        from (reads the device: sequential decoding only). Empty when none were asked for."""
        if self.top is None or self.logits is None or not tokens:
            return []
        logprobs = torch.log_softmax(self.logits[:len(tokens)].float(), dim=-1)
        chosen = logprobs[torch.arange(len(tokens), device=logprobs.device),
                          torch.tensor(list(tokens), device=logprobs.device)].tolist()
        top_values, top_ids = logprobs.topk(self.top, dim=-1) if self.top else (None, None)
        out = []
        for i, token in enumerate(tokens):
            top = list(zip(top_ids[i].tolist(), top_values[i].tolist())) if self.top else []
            out.append(TokenLogprob(int(token), chosen[i], top))
        return out


__all__ = ["MAX_TOP_LOGPROBS", "SamplingStep", "TokenLogprob", "check_logprobs"]
