"""The device-resident speculative loop: draft, verify and accept with no host round trip per step.

One step is device work only, with fixed shapes for a draft length ``k``, so that on a GPU with
``cuda_graphs`` it is captured into one CUDA graph per ``k`` and replayed (``SpeculativeLoop``):

1. the proposer drafts ``k`` tokens after the sequence (``Proposer.draft_on_device``; -1: none),
   drafts past the generation's last token masked with -1, as sequential decoding asks for at most
   ``remaining - 1``;
2. the target runs ``[last, d_1 .. d_k]`` at positions ``L - 1 .. L - 1 + k`` (``L``: the
   sequence's length, on the device; ``Step.max_context`` makes the attention take the positions
   from the device), the drafts clamped to valid ids;
3. greedy acceptance: the target's argmax per row (-1 where a row is not finite), the longest
   prefix of non-negative drafts equal to it accepted; the step commits ``accepted + 1`` tokens;
4. all ``k + 1`` argmax tokens are written after the sequence and its length advanced by the
   committed count (the rows after it are garbage the next step overwrites), and the proposer is
   told (``Proposer.accept_on_device``, with the step's hidden states);
5. the record ``[committed, drafted, t_0 .. t_k]`` is left in a static buffer for the host.

The target's KV store is reserved up front for ``prompt + max_new + 2 (k + 1)`` positions and not
truncated inside the loop: a step writes the keys and values of all its positions, the accepted
ones stay valid, and the rest lie past the next step's first position, which rewrites them before
any query reads them (every attention masks keys past a query's position; the reference one zeroes
them first, since unwritten pages may hold NaN). The host reads the records one step behind
(``HostRecords``, as pipelined plain decoding reads tokens) and does the stops
(``tileinfer.decoding``). Greedy only: sampled generations, history-using penalties and logprobs
decode sequentially.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Sequence

import torch

from tileinfer.graph_capture import warm_up
from tileinfer.interfaces import DeviceSequence, KVStore, Proposer, Sampler, Step
from tileinfer.model import Qwen3Model
from tileinfer.speculative import finite_or
from tileinfer.steps import MAX_GRAPH_TOKENS

MAX_DRAFT = MAX_GRAPH_TOKENS - 1  # a step of up to 16 tokens: the attentions' path that reads positions on the device


def drafts_on_device(proposer: Proposer | None) -> bool:
    """Whether ``proposer`` implements device drafting (overrides ``Proposer.draft_on_device``)."""
    return proposer is not None and type(proposer).draft_on_device is not Proposer.draft_on_device


class HostRecords:
    """Step records on their way from the device to the host, without a sync when sent.

    ``send(i, record)`` enqueues the copy of record ``i`` (``[m]`` int64 on the device, ``m <=
    width``) into host slot ``i % depth`` (pinned memory on CUDA) and records a CUDA event after it;
    ``receive(i)`` waits for that event alone and returns the record's committed tokens and its
    draft count. On a CPU the copy is synchronous and there are no events.
    """

    def __init__(self, device: torch.device, width: int, depth: int = 2) -> None:
        cuda = device.type == "cuda"
        self.depth = depth
        self.slots = torch.zeros(depth, width, dtype=torch.int64, pin_memory=cuda)
        self.events = [torch.cuda.Event() for _ in range(depth)] if cuda else None
        self.sent = self.received = 0

    def send(self, i: int, record: torch.Tensor) -> None:
        assert i == self.sent and i - self.received < self.depth, f"record {i} sent out of turn"
        slot = i % self.depth
        self.slots[slot, :record.numel()].copy_(record, non_blocking=True)
        if self.events is not None:
            self.events[slot].record()
        self.sent += 1

    def receive(self, i: int) -> tuple[list[int], int]:
        """Record ``i``: ``(committed tokens, drafts verified)``."""
        assert i == self.received < self.sent, f"record {i} received out of turn"
        slot = i % self.depth
        if self.events is not None:
            self.events[slot].synchronize()
        self.received += 1
        committed, drafted = self.slots[slot, :2].tolist()
        return self.slots[slot, 2:2 + committed].tolist(), drafted

    def reset(self) -> None:
        """Forget records sent and not received (the step after the last one)."""
        self.sent = self.received = 0


class SpeculativeLoop:
    """The device steps of speculative decoding with ``proposer`` over the target ``model`` and
    ``kv``, for the draft lengths ``k_values`` (one, or 1 .. spec_k with ``spec_adaptive``).

    ``capture`` (``tileinfer.steps.cuda_graph_capture``, or a stand-in in tests): each step is
    captured once per ``k`` when the loop is built, on a dummy sequence, and replayed; None: run
    eagerly (a CPU, or ``cuda_graphs=false``), the same code.
    """

    def __init__(self, model: Qwen3Model, kv: KVStore, proposer: Proposer, k_values: Collection[int], *,
                 capture: Callable | None = None) -> None:
        assert drafts_on_device(proposer), f"{type(proposer).__name__} does not draft on the device"
        assert max(k_values) <= MAX_DRAFT, f"the device loop drafts at most {MAX_DRAFT} tokens a step"
        self.model, self.kv, self.proposer = model, kv, proposer
        self.k_values = sorted(set(k_values))
        self.k_max = max(self.k_values)
        device = model.device
        self.seq = DeviceSequence.empty(kv.capacity + 2 * (self.k_max + 1), device)
        self.record = torch.zeros(self.k_max + 3, dtype=torch.int64, device=device)
        self._offsets = torch.arange(self.k_max + 1, dtype=torch.int64, device=device)
        self._capture = capture
        self.graphs: dict[int, Callable[[], object]] = {}
        self.capture_ms = 0.0
        self.memory_bytes = 0
        if capture is not None:
            self._capture_all()

    # -- what the decoder asks ------------------------------------------------------------------

    def room(self, prompt_len: int, max_new: int) -> int:
        """Positions reserved for a generation: its tokens and two steps' worth of run-ahead."""
        return prompt_len + max_new + 2 * (self.k_max + 1)

    def applies(self, sampler: Sampler, prompt_len: int, max_new: int) -> bool:
        """Whether a generation with ``sampler``'s current params can take this loop: greedy, no
        history-using penalty, its room within the KV store and the proposer's reach."""
        room = self.room(prompt_len, max_new)
        return (sampler.greedy and not sampler.uses_history and room <= self.kv.capacity
                and self.proposer.device_drafting(room))

    @torch.inference_mode()
    def begin(self, ids: Sequence[int], first: torch.Tensor, max_new: int) -> torch.Tensor:
        """Start a generation after its prefill: the sequence is ``ids`` and ``first`` (``[1]``
        int64 on the device, not read), pages reserved, the proposer started. Returns the first
        record (``[1, 0, first]``) for the host."""
        seq, p = self.seq, len(ids)
        room = self.room(p, max_new)
        self.kv.reserve(room)
        seq.tokens[:p].copy_(torch.tensor(list(ids), dtype=torch.int64), non_blocking=True)
        seq.tokens[p:p + 1].copy_(first)
        seq.length.fill_(p + 1)
        seq.limit.fill_(p + max_new)
        seq.prompt_len = p
        self.proposer.start_on_device(seq, room)
        self.record[:2].copy_(torch.tensor([1, 0]), non_blocking=True)
        self.record[2:3].copy_(first)
        return self.record[:3]

    @torch.inference_mode()
    def step(self, k: int) -> torch.Tensor:
        """Enqueue one step drafting ``k`` tokens; returns its record ``[k + 3]`` (a static buffer:
        copy it before the next step). No host sync."""
        if self._capture is None:
            self._step(k)
        else:
            assert k in self.graphs, f"no graph for k={k} (captured: {self.k_values})"
            self.graphs[k]()
        return self.record[:k + 3]

    # -- the step -------------------------------------------------------------------------------

    @torch.inference_mode()
    def _step(self, k: int) -> None:
        seq, offsets = self.seq, self._offsets
        start = seq.length.clone()  # L0: tokens[L0 - 1] is the step's first input
        drafts = self.proposer.draft_on_device(seq, k)
        drafts = torch.where(offsets[:k] < seq.limit - start - 1, drafts, -1)  # at most remaining - 1
        inputs = torch.cat([seq.tokens.index_select(0, start - 1), drafts]).clamp(min=0)
        positions = start - 1 + offsets[:k + 1]
        step = Step(0, k + 1, positions, max_context=self.kv.capacity)
        logits, hidden = self.model.forward(inputs, step, self.kv, capture=self.proposer.hidden_layers)
        target = finite_or(logits.argmax(-1), logits)  # [k + 1]
        valid = (drafts >= 0).long().cumprod(0)
        accepted = (valid * (drafts == target[:k]).long()).cumprod(0).sum(0, keepdim=True)
        committed = accepted + 1
        seq.tokens.index_copy_(0, positions + 1, target)
        seq.length.add_(committed)
        self.proposer.accept_on_device(seq, committed, hidden)
        torch.cat([committed, valid.sum(0, keepdim=True), target], out=self.record[:k + 3])

    @torch.inference_mode()
    def _capture_all(self) -> None:
        """Capture a step per ``k`` on a dummy sequence (zeros, length 2), then drop it: the
        warm-up run on a side stream (CUDA) keeps compilation out of the graphs."""
        cuda = self.model.device.type == "cuda"
        began = time.perf_counter()
        before = torch.cuda.memory_allocated() if cuda else 0
        pool = torch.cuda.graph_pool_handle() if cuda else None
        seq, room = self.seq, 2 + 2 * (self.k_max + 1)
        seq.tokens.zero_()
        seq.limit.fill_(room)
        seq.prompt_len = 1
        self.kv.reserve(room)
        self.proposer.start_on_device(seq, room)
        for k in self.k_values:
            seq.length.fill_(2)
            warm_up(lambda k=k: self._step(k), seq.tokens.device)
            seq.length.fill_(2)
            self.graphs[k], _ = self._capture(lambda k=k: self._step(k), pool)
            seq.length.fill_(2)
        if cuda:
            torch.cuda.synchronize()
        self.kv.reset()
        self.capture_ms = (time.perf_counter() - began) * 1e3
        self.memory_bytes = (torch.cuda.memory_allocated() - before) if cuda else 0

    def report(self) -> str:
        if self._capture is None:
            return f"device speculative loop, eager steps (k {self.k_values})"
        return (f"device speculative loop, {len(self.graphs)} CUDA graphs (k {self.k_values}), captured in "
                f"{self.capture_ms:.0f} ms, {self.memory_bytes / 2**20:.1f} MiB")


__all__ = ["MAX_DRAFT", "HostRecords", "SpeculativeLoop", "drafts_on_device"]
