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
them first, since unwritten pages may hold NaN). The decode loop (``tileinfer.decoding``) reads
the records one step behind, as it reads plain decoding's, and does the stops. Greedy only: the
plan (``tileinfer.decode_plan``) sends sampled generations, history-using penalties and logprobs
to host drafting.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Sequence

import torch

from tileinfer.graph_capture import warm_up
from tileinfer.interfaces import DeviceSequence, ForwardPass, KVStore, Proposer, Step
from tileinfer.prefill_graphs import MAX_GRAPH_TOKENS
from tileinfer.sampling_step import SamplingStep
from tileinfer.speculative import finite_or
from tileinfer.strategies import first_record

MAX_DRAFT = MAX_GRAPH_TOKENS - 1  # a step of up to 16 tokens: the attentions' path that reads positions on the device


def drafts_on_device(proposer: Proposer | None) -> bool:
    """Whether ``proposer`` implements device drafting (overrides ``Proposer.draft_on_device``)."""
    return proposer is not None and type(proposer).draft_on_device is not Proposer.draft_on_device


def loop_room(prompt_len: int, max_new: int, k_max: int) -> int:
    """Positions the loop reserves for a generation: its tokens and two steps' worth of run-ahead."""
    return prompt_len + max_new + 2 * (k_max + 1)


class SpeculativeLoop:
    """The device steps of speculative decoding with ``proposer`` over the target's ``forward`` pass
    and ``kv``, for the draft lengths ``k_values`` (one, or 1 .. spec_k with ``spec_adaptive``): a
    decoding strategy (``tileinfer.strategies``).

    ``capture`` (``tileinfer.steps.cuda_graph_capture``, or a stand-in in tests): each step is
    captured once per ``k`` when the loop is built, on a dummy sequence, and replayed; None: run
    eagerly (a CPU, or ``cuda_graphs=false``), the same code.
    """

    def __init__(self, forward: ForwardPass, kv: KVStore, proposer: Proposer, k_values: Collection[int], *,
                 capture: Callable | None = None) -> None:
        assert drafts_on_device(proposer), f"{type(proposer).__name__} does not draft on the device"
        assert max(k_values) <= MAX_DRAFT, f"the device loop drafts at most {MAX_DRAFT} tokens a step"
        self.forward, self.kv, self.proposer = forward, kv, proposer
        self.k_values = sorted(set(k_values))
        self.k_max = max(self.k_values)
        device = forward.device
        self.seq = DeviceSequence.empty(kv.capacity + 2 * (self.k_max + 1), device)
        self.record = torch.zeros(self.k_max + 3, dtype=torch.int64, device=device)
        self._offsets = torch.arange(self.k_max + 1, dtype=torch.int64, device=device)
        self._capture = capture
        self.graphs: dict[int, Callable[[], object]] = {}
        self.capture_ms = 0.0
        self.memory_bytes = 0
        if capture is not None:
            self._capture_all()

    # -- the strategy ---------------------------------------------------------------------------

    def room(self, prompt_len: int, max_new: int) -> int:
        """Positions reserved for a generation (``loop_room``)."""
        return loop_room(prompt_len, max_new, self.k_max)

    @torch.inference_mode()
    def begin(self, ids: Sequence[int], first: torch.Tensor, max_new: int,
              sampling: SamplingStep | None = None) -> torch.Tensor:
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
        return first_record(self.record, first)

    def took(self, tokens: list[int]) -> None:
        pass

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
        logits, hidden = self.forward(inputs, step, self.kv, capture=self.proposer.hidden_layers)
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
        cuda = self.forward.device.type == "cuda"
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


__all__ = ["MAX_DRAFT", "SpeculativeLoop", "drafts_on_device", "loop_room"]
