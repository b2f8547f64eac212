"""Decoding strategies: what one step after the prefill does, as the decode loop sees it.

The loop (``tileinfer.decoding.Decoder``) runs any strategy under either host-sync policy
(``tileinfer.decode_plan``). A strategy has

- ``proposer``: the proposer that reads the prompt's chunks (None for plain decoding);
- ``begin(ids, first, max_new, sampling)``: a generation of at most ``max_new`` new tokens after
  the prompt ``ids`` starts, its prefill done; ``first`` is the prefill's token (``[1]`` int64 on
  the device, not read), ``sampling`` the generation's ``SamplingStep``. Returns record 0,
  ``[1, 0, first]``;
- ``step(k)``: enqueue one step drafting at most ``k`` tokens (plain decoding: none) and return
  its record ``[committed, drafted, t_0 .. t_{committed-1}]`` (``tileinfer.host_records``), which
  the next step may overwrite once it is sent;
- ``took(tokens)``: the host read a record's committed tokens (finite), in order.

``PlainDecoding`` (here) feeds each sampled token to the next step on the device, so that the host
may read a step's token after the next step was enqueued. ``HostDrafting`` (here) verifies drafts
a proposer makes on the host from the committed sequence: its step needs the last record read.
``tileinfer.device_speculation.SpeculativeLoop`` drafts, verifies and accepts on the device.
"""

from __future__ import annotations

from typing import Protocol

import torch

from tileinfer.interfaces import Draft, Proposer
from tileinfer.sampling_step import SamplingStep
from tileinfer.speculative import finite_or, verify_greedy, verify_sampled
from tileinfer.steps import StepRunner


class Strategy(Protocol):
    proposer: Proposer | None

    def begin(self, ids: list[int], first: torch.Tensor, max_new: int,
              sampling: SamplingStep | None = None) -> torch.Tensor: ...

    def step(self, k: int) -> torch.Tensor: ...

    def took(self, tokens: list[int]) -> None: ...


def first_record(record: torch.Tensor, first: torch.Tensor) -> torch.Tensor:
    """Write ``[1, 0, first]`` into ``record[:3]`` (``first``: ``[1]`` int64 on the device; no host
    sync) and return that view."""
    record[:2].copy_(torch.tensor([1, 0]), non_blocking=True)
    record[2:3].copy_(first)
    return record[:3]


class PlainDecoding:
    """One token a step: the last token fed at the next position, the next one sampled, both on
    the device (``tileinfer.sampling_step.SamplingStep``; -1 when the logits are not finite). Its
    record is a static buffer ``[1, 0, token]`` whose token the next step is fed. A step is ``feed``
then ``sample``; the split loop calls them apart (``tileinfer.decode_plan``)."""

    proposer = None

    def __init__(self, steps: StepRunner) -> None:
        self.steps, self.kv = steps, steps.kv
        self.record = torch.zeros(3, dtype=torch.int64, device=steps.device)
        self._not_finite = torch.full((), -1, dtype=torch.int64, device=steps.device)
        self.position = 0
        self.sampling: SamplingStep | None = None
        self.pending: torch.Tensor | None = None  # the logits of a step fed and not yet sampled from

    @torch.inference_mode()
    def begin(self, ids: list[int], first: torch.Tensor, max_new: int,
              sampling: SamplingStep | None = None) -> torch.Tensor:
        self.position, self.sampling, self.pending = len(ids), sampling, None
        return first_record(self.record, first)

    @torch.inference_mode()
    def step(self, k: int = 0) -> torch.Tensor:
        """Feed the record's token at the next position; its record then holds the sampled one."""
        self.feed()
        return self.sample()

    @torch.inference_mode()
    def feed(self) -> None:
        """The first half of ``step``: enqueue the forward pass of the record's token (``pending``
        until ``sample``), so that the host may read the last record while the device runs it."""
        assert self.pending is None, "a forward pass is pending already"
        token = self.record[2:3]
        self.kv.reserve(self.position + 1)
        self.pending, _ = self.steps.forward(token, self.position)
        self.position += 1
        self.sampling.commit(token)

    @torch.inference_mode()
    def sample(self) -> torch.Tensor:
        """The second half of ``step``: sample from the pending forward pass's logits into the record."""
        logits, self.pending = self.pending, None
        sampled = self.sampling.sample(logits).tokens
        torch.where(torch.isfinite(logits).all(-1), sampled, self._not_finite, out=self.record[2:3])  # finite_or
        return self.record

    def took(self, tokens: list[int]) -> None:
        pass


class HostDrafting:
    """Speculative decoding with drafts made on the host (``Proposer.propose``): a step verifies
    ``1 + k`` tokens (the last committed token and the drafts) in one target step, commits the
    accepted drafts and one target token (greedy prefix match, or the p/q rule for a sampled
    generation: ``tileinfer.speculative``), rolls the KV store back over the rest and tells the
    proposer (``Proposer.accept``, with the kept rows' hidden states). Drafts at most
    ``remaining - 1`` tokens, so that a step never commits past ``max_new``."""

    def __init__(self, steps: StepRunner, proposer: Proposer) -> None:
        self.steps, self.kv, self.proposer = steps, steps.kv, proposer
        self.sequence: list[int] = []
        self.prompt_len = self.limit = 0
        self.sampling: SamplingStep | None = None
        self.record = torch.zeros(3, dtype=torch.int64, device=steps.device)

    @torch.inference_mode()
    def begin(self, ids: list[int], first: torch.Tensor, max_new: int,
              sampling: SamplingStep | None = None) -> torch.Tensor:
        self.sequence, self.prompt_len, self.limit = list(ids), len(ids), len(ids) + max_new
        self.sampling = sampling
        return first_record(self.record, first)

    def took(self, tokens: list[int]) -> None:
        self.sequence += tokens
        self.sampling.commit(tokens)
        if len(self.sequence) == self.prompt_len + 1:  # the prefill's token: the proposer starts
            self.proposer.start(list(self.sequence))

    @torch.inference_mode()
    def step(self, k: int) -> torch.Tensor:
        sequence, sampling = list(self.sequence), self.sampling
        remaining, cached = self.limit - len(sequence), len(sequence) - 1
        draft = self.proposer.propose(sequence, min(k, remaining - 1)) if remaining > 1 else Draft([])
        draft, cut = _cut(draft, sampling.admissible(draft.tokens))
        sampling.stage(draft.tokens)
        self.kv.reserve(cached + 1 + len(draft.tokens))
        tokens = torch.tensor([sequence[-1], *draft.tokens], dtype=torch.int64, device=self.steps.device)
        logits, hidden = self.steps.forward(tokens, cached)
        if not draft.tokens and cut is None:
            new = [int(finite_or(sampling.sample(logits).tokens, logits)[0])]
        elif sampling.greedy:
            new = verify_greedy(draft.tokens, logits, sampling)
        else:
            new = verify_sampled(draft.tokens, draft.probs, logits, sampling, cut_q=cut)
        kept = len(new)  # the step's token and the accepted drafts hold valid keys and values
        self.kv.truncate(cached + kept)
        self.proposer.accept(sequence + new, kept - 1, {n: h[:kept] for n, h in hidden.items()})
        return torch.tensor([kept, len(draft.tokens), *new], dtype=torch.int64)


def _cut(draft: Draft, keep: int) -> tuple[Draft, torch.Tensor | None]:
    """``draft`` cut to its first ``keep`` tokens (those the grammar accepts), and the drafter's
    distribution ``q`` of the first token cut when it drew the drafts (None: none cut, or drawn
    deterministically): the verify rule draws the token there from ``max(0, p - q)``, as for a
    rejected draft, so that cutting keeps speculative sampling exact."""
    if keep == len(draft.tokens):
        return draft, None
    probs = draft.probs
    return Draft(draft.tokens[:keep], probs[:keep] if probs is not None else None), \
        probs[keep] if probs is not None else None


__all__ = ["HostDrafting", "PlainDecoding", "Strategy", "first_record"]
