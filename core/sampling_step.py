"""The decoder's view of its sampler during one generation: the token history and the logprobs.

``SamplingStep`` stands where the decoder used the sampler (prefill, plain steps, verify rules,
pipelined steps): it hands the sampler the ``TokenHistory`` (only when the sampler
``uses_history`` for the generation's params: otherwise nothing is kept and the sampler is
called exactly as before) and, when logprobs were asked for, keeps the last logits sampled from.

Logprobs are of the model's distribution: ``log_softmax`` of the raw float32 logits, before
penalties, temperature and truncation (what vLLM returns by default), for the chosen token and the
``top`` most likely ones.

With a grammar (``SamplingParams.structured``), its mask is the first stage: the logits the sampler
gets (so its penalties, temperature and truncations, and the verify rules' ``p``) have the tokens
the grammar does not allow next at ``-inf`` (``tileinfer.grammar_mask``); logprobs stay the raw
model's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from tileinfer.errors import UsageError
from tileinfer.grammar_mask import Matcher, TokenMask
from tileinfer.interfaces import Sample, Sampler, TokenHistory
from tileinfer.sampling_params import MAX_TOP_LOGPROBS


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
    (prompt, reply and one verify step's drafts); ``logprobs``: top tokens per position, or None;
    ``grammar``: the generation's ``tileinfer.grammar_mask.Matcher`` (None: no constraint), whose
    mask is applied to the logits before the sampler sees them and which ``advance`` moves on by
    the committed tokens (the host reads each step before it samples the next)."""

    def __init__(self, sampler: Sampler, prompt: Sequence[int], capacity: int, logprobs: int | None = None,
                 grammar: Matcher | None = None) -> None:
        self.sampler = sampler
        self.history = TokenHistory(prompt, capacity, sampler.device) if sampler.uses_history else None
        self.top = logprobs
        self.logits: torch.Tensor | None = None
        self.grammar = grammar
        self.mask = TokenMask(grammar, sampler.device) if grammar is not None else None
        self.staged: list[int] = []  # the drafts of the next verify step (its rows' masks follow them)

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
        logits = self._masked(logits)
        if self.history is None:
            return self.sampler.sample(logits, return_probs=return_probs)
        return self.sampler.sample(logits, history=self.history, return_probs=return_probs)

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        if self.top is not None:
            self.logits = logits
        logits = self._masked(logits)
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
        self.staged = list(drafts)
        if self.history is not None:
            self.history.stage(drafts)

    # the grammar
    def _masked(self, logits: torch.Tensor) -> torch.Tensor:
        """``logits`` with the grammar's mask of each row (the drafts staged last), or as they are."""
        if self.mask is None:
            return logits
        drafts, self.staged = self.staged, []
        return self.mask.apply(logits, drafts)

    def admissible(self, drafts: Sequence[int]) -> int:
        """How many leading ``drafts`` the grammar accepts after the committed tokens (all: none)."""
        return len(drafts) if self.grammar is None else self.grammar.admissible(drafts)

    def advance(self, tokens: Sequence[int]) -> int:
        """Move the grammar on by committed ``tokens``; returns how many it accepted before the
        first it rejects (all of them without a grammar): the generation ends there."""
        if self.grammar is None:
            return len(tokens)
        for i, token in enumerate(tokens):
            if not self.grammar.accept(token):
                return i
        return len(tokens)

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
