"""Proposer: drafts tokens for speculative decoding; the target model verifies them."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from tileinfer.interfaces.pluggable import Pluggable

if TYPE_CHECKING:
    from tileinfer.checkpoint import Checkpoint
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
class DeviceSequence:
    """One generation's sequence on the device, for the device-resident speculative loop
    (``tileinfer.device_speculation``), which owns it and updates it in place; proposers read it.

    ``tokens`` ``[capacity]`` int64: ``tokens[:length]`` is the prompt and the committed tokens; the
    last of them has not been run by the target yet (the next verify step's first input). Rows from
    ``length`` on are garbage (a step writes all its candidates and advances by the committed
    count). ``length`` and ``limit`` (prompt + max_new) are ``[1]`` int64 on the device; a committed
    token may be -1 (logits not finite: the host stops there), so clamp ids before embedding them.
    """

    tokens: torch.Tensor
    length: torch.Tensor
    limit: torch.Tensor
    prompt_len: int = 0

    @classmethod
    def empty(cls, capacity: int, device: torch.device) -> "DeviceSequence":
        zeros = dict(dtype=torch.int64, device=device)
        return cls(torch.zeros(capacity, **zeros), torch.zeros(1, **zeros), torch.zeros(1, **zeros))

    @property
    def capacity(self) -> int:
        return self.tokens.numel()


@dataclass
class ProposerContext:
    """What a proposer may use: the target model (its embedding, lm_head, config), the target's
    sampler, the run's resolved config, the registry (to build a model and KV store of its own:
    ``tileinfer.Implementations.of(config, registry)``, ``tileinfer.load_model``), its own options
    (validated, defaults filled in) and the target's checkpoint (its folder, tokenizer and
    tensors, read once; None when a caller builds a proposer without one)."""

    target: "Qwen3Model"
    sampler: "Sampler"
    config: "Config"
    registry: "Registry"
    options: dict[str, Any] = field(default_factory=dict)
    checkpoint: "Checkpoint | None" = None


class Proposer(Pluggable, ABC):
    """Proposes drafts given the sequence so far, and is told what the target accepted.

    A generation calls, in order: ``begin`` before the prefill, ``prompt_chunk`` once per prefill
    chunk of the prompt (the engine prefills in steps of at most ``prefill_chunk`` tokens, from the
    positions ``begin`` kept), ``start`` once the first token is sampled, then ``propose`` and
    ``accept`` once per verify step.

    Device drafting (optional; the default is unsupported): a proposer whose ``device_drafting``
    is true serves the device-resident loop (``tileinfer.device_speculation``), which replays
    draft, verify and accept from one CUDA graph per draft length. Such a generation calls
    ``begin``, ``prompt_chunk`` per chunk, ``start_on_device`` once, then ``draft_on_device`` and
    ``accept_on_device`` once per step, captured: they must be device work only (no host sync, no
    shape that depends on a value, state in device tensors updated in place), since Python code in
    them runs once, at the capture. ``propose``, ``accept`` and ``start`` are not called then.

    Set ``hidden_layers`` to the target decoder layers whose outputs (``[T, hidden]`` per layer,
    before the final norm) the proposer wants: the engine then hands them to ``prompt_chunk`` (the
    chunk's prompt positions) and ``accept`` (the verify step's positions).

    Prefix reuse (``tileinfer.prefix_cache``): the target may keep the first positions of a prompt
    from the previous generation (the same tokens there). ``begin`` says how many of them the
    proposer keeps too: its state of the prompt (a KV cache of its own, context from hidden states)
    must then hold exactly what a cold prefill of those positions gives it, since ``prompt_chunk``
    gets the prompt from there only. Every proposer is asked, as only it knows what its state holds
    (it may lag the target, stop at a shorter context, or have been written by the device loop).
    The default ``begin`` keeps them all when ``reuses_prefix`` is set (a proposer that keeps
    nothing of ``prompt_chunk``: it reads the whole sequence in ``start``/``propose``, or ``seq`` on
    the device) and none otherwise, so a proposer that does not know about reuse prefills cold.
    """

    hidden_layers: tuple[int, ...] = ()
    reuses_prefix: bool = False

    def __init__(self, context: ProposerContext) -> None:
        self.context = context
        self._take_options(context.options)

    def begin(self, ids: list[int], cached: int) -> int:
        """A generation of the prompt ``ids`` begins (before its prefill): the target's KV store
        holds ``ids[:cached]`` (``0 <= cached < len(ids)``), left by the previous generation.
        Returns how many of those positions to keep (``0 .. cached``); the target prefills the
        prompt from there and ``prompt_chunk`` gets the chunks from there, so the proposer's state
        of the positions before it must be what a cold prefill of ``ids`` leaves. Default:
        ``cached`` when ``reuses_prefix``, else 0 (a cold prefill)."""
        return cached if self.reuses_prefix else 0

    def prompt_chunk(self, tokens: list[int], start: int, hidden: dict[int, torch.Tensor]) -> None:
        """The target prefilled one chunk of the prompt: ``tokens`` are the prompt's ids at positions
        ``start .. start + len(tokens) - 1``, ``hidden`` the target's hidden states there
        (``[len(tokens), hidden]`` per layer of ``hidden_layers``; valid during the call only: copy
        what is kept). Called for consecutive chunks in order, the first at the position ``begin``
        kept; ``start == 0`` begins a new generation (forget the previous one)."""

    def start(self, tokens: list[int]) -> None:
        """The prompt is prefilled (every chunk was given to ``prompt_chunk``): ``tokens`` is the
        prompt and its first sampled token."""

    @abstractmethod
    def propose(self, tokens: list[int], k: int) -> Draft:
        """Up to ``k`` tokens likely to follow ``tokens`` (the whole sequence, prompt included)."""

    def accept(self, tokens: list[int], num_accepted: int, hidden: dict[int, torch.Tensor]) -> None:
        """After a verify step: ``tokens`` is the sequence now, ``num_accepted`` how many of the last
        draft were kept, ``hidden`` the target's hidden states of the step's kept positions."""

    # -- device drafting (optional) ------------------------------------------------------------

    def device_drafting(self, positions: int) -> bool:
        """Whether ``draft_on_device``/``accept_on_device`` can serve a generation whose sequence
        (prompt, new tokens and the loop's run-ahead) reaches ``positions`` tokens; asked before
        each generation's prefill. Default: False (such generations decode sequentially)."""
        return False

    def start_on_device(self, seq: DeviceSequence, positions: int) -> None:
        """A device-loop generation's prompt is prefilled (every chunk went to ``prompt_chunk``):
        ``seq`` holds the prompt and the first token (its value on the device only). Host code, not
        captured: reset device state and reserve room (a KV store of its own) for ``positions``
        positions; nothing may allocate or reserve inside the captured step. Also called on a
        dummy sequence (zeros, length 2) before the loop's graphs are captured."""
        raise NotImplementedError(f"{type(self).__name__} does not draft on the device")

    def draft_on_device(self, seq: DeviceSequence, k: int) -> torch.Tensor:
        """``[k]`` int64 drafts to follow ``seq.tokens[:seq.length]``, on the device; -1 where there
        is none (nothing from the first -1 on is verified). Captured once per ``k``: device work
        only, fixed shapes; a model forward inside it takes a ``Step`` with device positions and
        ``max_context`` (as ``tileinfer.steps.StepRunner._step``)."""
        raise NotImplementedError(f"{type(self).__name__} does not draft on the device")

    def accept_on_device(self, seq: DeviceSequence, committed: torch.Tensor,
                         hidden: dict[int, torch.Tensor]) -> None:
        """After a verify step (captured, as ``draft_on_device``): ``committed`` (``[1]`` int64) is 1
        plus the accepted drafts, ``seq.length`` already advanced by it. The step ran ``k + 1``
        positions from ``L0 - 1`` (``L0 = length - committed``); ``hidden`` holds the target's
        outputs of ``hidden_layers`` there (``[k + 1, hidden]`` per layer, static: copy what is
        kept), of which the first ``committed`` rows are kept. Default: nothing."""
