"""Sampler: the next token(s) from logits and the sequence so far, and the distribution it drew them from.

Its params are ``tileinfer.SamplingParams`` (also named ``tileinfer.interfaces.SamplingParams``),
with every sampling field set.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from tileinfer.interfaces.pluggable import Pluggable
from tileinfer.sampling_params import NEUTRAL, SamplingParams


@dataclass
class Sample:
    """``tokens`` ``[T]`` int64; ``probs`` ``[T, V]`` float32 when asked for, else None."""

    tokens: torch.Tensor
    probs: torch.Tensor | None = None


class TokenHistory:
    """The sequence so far, on the sampler's device, kept up to date by the decoder without host syncs.

    ``tokens`` ``[N]`` int64: ``tokens[:prompt_len]`` is the prompt, ``tokens[prompt_len:length]``
    the generated tokens committed so far. Row ``i`` of the logits a sampler is given follows
    ``tokens[:length + i]``: in a speculative verify step, ``tokens[length:length + T - 1]`` hold
    the draft tokens fed after the last committed one (``stage``). Entries past ``length + T - 1``
    are undefined. ``length`` and ``prompt_len`` are host ints (the host always knows how many
    tokens it fed); token values may exist only on the device (pipelined decoding ``commit``s the
    device tensor a step sampled).
    """

    def __init__(self, prompt: Sequence[int], capacity: int, device: torch.device) -> None:
        self.tokens = torch.zeros(max(capacity, len(prompt)), dtype=torch.int64, device=device)
        self.tokens[:len(prompt)] = torch.tensor(list(prompt), dtype=torch.int64)
        self.prompt_len = self.length = len(prompt)

    def commit(self, tokens: Sequence[int] | torch.Tensor) -> None:
        """Append committed tokens (host ints, or an int64 device tensor: no sync). A negative id (a
        step whose logits were not finite, whose result is never used) is kept as 0."""
        n = len(tokens)
        self.tokens[self.length:self.length + n] = (tokens.clamp(min=0) if isinstance(tokens, torch.Tensor)
                                                    else torch.tensor(list(tokens), dtype=torch.int64).clamp(min=0))
        self.length += n

    def stage(self, drafts: Sequence[int]) -> None:
        """Write draft tokens after the committed ones, for the verify step's rows (``length`` stays)."""
        if drafts:
            self.tokens[self.length:self.length + len(drafts)] = torch.tensor(list(drafts), dtype=torch.int64)

    def rows(self, count: int) -> list[torch.Tensor]:
        """The sequence each of ``count`` rows follows: views ``tokens[:length + i]``."""
        return [self.tokens[:self.length + i] for i in range(count)]


class Sampler(Pluggable, ABC):
    """Draws tokens from float32 logits ``[T, V]``, one per row, with its own seeded generator.

    ``history`` (a ``TokenHistory``, or None) is the sequence each row follows. The decoder keeps it
    (one device copy per step) only while ``uses_history`` is true for the generation's params, and
    then passes it as the keyword ``history``; otherwise it calls ``sample(logits)`` and
    ``probs(logits)`` without it, so a sampler that needs no history costs nothing. A caller with
    no sequence (a draft model's ``q``) passes none either; a sampler without a history applies
    nothing that depends on it.

    ``probs`` is the distribution ``sample`` draws from (after penalties, temperature, top-k,
    top-p, min-p; one-hot at the argmax when greedy): the target's ``p`` in speculative sampling.
    ``generator`` is the only source of randomness, so a seed reproduces a generation.

    ``params`` (a ``tileinfer.SamplingParams``) always has every sampling field set: params given
    with some left None (``SamplingParams(temperature=0.7)``) take ``NEUTRAL``'s for them (off:
    no truncation, no penalty, seed 0); the engine gives each generation's, resolved against its
    defaults.
    """

    def __init__(self, params: SamplingParams, device: torch.device, *,
                 options: Mapping[str, Any] | None = None) -> None:
        self._take_options(options)
        self.params = params
        self.device = torch.device(device)
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(self.params.seed)

    @property
    def params(self) -> SamplingParams:
        return self._params

    @params.setter
    def params(self, params: SamplingParams) -> None:
        if not isinstance(params, SamplingParams):
            raise TypeError(f"a Sampler's params are a tileinfer.SamplingParams, got {type(params).__name__}")
        self._params = params.resolved(NEUTRAL)

    @property
    def greedy(self) -> bool:
        return self.params.greedy

    @property
    def uses_history(self) -> bool:
        """Whether ``sample``/``probs`` read ``history`` with the current ``params`` (default: no;
        asked at the start of each generation)."""
        return False

    @abstractmethod
    def probs(self, logits: torch.Tensor, history: TokenHistory | None = None) -> torch.Tensor:
        """``[T, V]`` float32 logits -> ``[T, V]`` float32 probabilities that sum to 1 per row."""

    @abstractmethod
    def sample(self, logits: torch.Tensor, history: TokenHistory | None = None, *,
               return_probs: bool = False) -> Sample:
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
