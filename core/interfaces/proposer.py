"""Proposer: drafts tokens for speculative decoding; the target model verifies them."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from tileinfer.interfaces.pluggable import Pluggable

if TYPE_CHECKING:
    from tileinfer.config import Config
    from tileinfer.interfaces.sampler import Sampler
    from tileinfer.model import Qwen3Model
    from tileinfer.registry import Registry


@dataclass
class Draft:
    """Up to k proposed tokens. ``probs`` (``[len(tokens), V]`` float32) is the distribution each
    token was drawn from, the ``q`` of the p/q rule; None means the tokens were chosen
    deterministically (``q`` is one-hot)."""

    tokens: list[int]
    probs: torch.Tensor | None = None


@dataclass
class ProposerContext:
    """What a proposer may use: the target model (its embedding, lm_head, config), the target's
    sampler, the run's resolved config, the registry (to build a model and KV store of its own) and
    its own options (validated, defaults filled in)."""

    target: "Qwen3Model"
    sampler: "Sampler"
    config: "Config"
    registry: "Registry"
    options: dict[str, Any] = field(default_factory=dict)


class Proposer(Pluggable, ABC):
    """Proposes drafts given the sequence so far, and is told what the target accepted.

    A generation calls, in order: ``prompt_chunk`` once per prefill chunk of the prompt (the
    engine prefills in steps of at most ``prefill_chunk`` tokens), ``start`` once the first token
    is sampled, then ``propose`` and ``accept`` once per verify step.

    Set ``hidden_layers`` to the target decoder layers whose outputs (``[T, hidden]`` per layer,
    before the final norm) the proposer wants: the engine then hands them to ``prompt_chunk`` (the
    chunk's prompt positions) and ``accept`` (the verify step's positions).
    """

    hidden_layers: tuple[int, ...] = ()

    def __init__(self, context: ProposerContext) -> None:
        self.context = context
        self._take_options(context.options)

    def prompt_chunk(self, tokens: list[int], start: int, hidden: dict[int, torch.Tensor]) -> None:
        """The target prefilled one chunk of the prompt: ``tokens`` are the prompt's ids at positions
        ``start .. start + len(tokens) - 1``, ``hidden`` the target's hidden states there
        (``[len(tokens), hidden]`` per layer of ``hidden_layers``; valid during the call only: copy
        what is kept). Called for consecutive chunks in order; ``start == 0`` begins a new
        generation (forget the previous one)."""

    def start(self, tokens: list[int]) -> None:
        """The prompt is prefilled (every chunk was given to ``prompt_chunk``): ``tokens`` is the
        prompt and its first sampled token."""

    @abstractmethod
    def propose(self, tokens: list[int], k: int) -> Draft:
        """Up to ``k`` tokens likely to follow ``tokens`` (the whole sequence, prompt included)."""

    def accept(self, tokens: list[int], num_accepted: int, hidden: dict[int, torch.Tensor]) -> None:
        """After a verify step: ``tokens`` is the sequence now, ``num_accepted`` how many of the last
        draft were kept, ``hidden`` the target's hidden states of the step's kept positions."""
