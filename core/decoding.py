"""Decoding: the prompt's prefill and every step after it, in one loop per mode.

``Decoder.run(ids, max_new, eos)`` yields the tokens of one generation as they are committed (a
list per step) and stops exactly at the first EOS or at ``max_new`` tokens. Its ``counters`` hold
the step and speculation counts, the time the first token reached the host and which loop ran.
The engine builds one Decoder and streams from it.

The loops (``DecodeCounters.loop``), the modes fixed when the engine is built, the loop of a
generation chosen by its settings:

- ``sequential``: each step's tokens are read on the host before the next step is launched.
- ``speculative-sequential``: the same with a proposer: a step verifies ``1 + k`` tokens (drafted
  by the proposer from the sequence so far), commits the accepted drafts plus one target token, and
  rolls the KV store back over the rest.
- ``pipelined`` (config key ``pipelined``, CUDA, no proposer): the host one step behind the device.
  Each token is sampled on the device and fed to the next step from there, and step ``t + 1`` is
  enqueued before step ``t``'s token is read, so the device never waits for the host. An EOS costs
  one extra step of device time, whose token is discarded (never emitted, never fed to a step).
- ``speculative-device`` (``pipelined`` with a proposer that drafts on the device, for a greedy
  generation without history-using penalties or logprobs; the others fall back to
  ``speculative-sequential``): draft, verify and accept on the device
  (``tileinfer.device_speculation``), the host reading each step's committed tokens one step
  behind, as pipelined decoding reads tokens; the step that ran ahead of a stop is discarded.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass

import torch

from tileinfer.device_speculation import HostRecords, SpeculativeLoop
from tileinfer.errors import NumericsError, PluginError
from tileinfer.interfaces import Draft, KVStore, Proposer, Sample, Sampler
from tileinfer.model import Qwen3Model
from tileinfer.prefill import ChunkCallback, chunked_prefill
from tileinfer.sampling_step import SamplingStep, TokenLogprob
from tileinfer.speculative import DraftLength, finite_or, verify_greedy, verify_sampled
from tileinfer.steps import StepRunner


@dataclass
class DecodeCounters:
    """One generation's counts: steps after the prefill whose tokens were committed (a pipelined
    step discarded after a stop is not counted), tokens drafted and accepted, the host time
    (``time.perf_counter``) the first token was out, and the loop that ran (the module's names)."""

    steps: int = 0
    drafted: int = 0
    accepted: int = 0
    first_token_time: float = 0.0
    loop: str = ""


def checked_sample(sampler: Sampler, logits: torch.Tensor, who: str) -> Sample:
    """``sampler.sample(logits)``, with a PluginError naming ``who`` when a plugin's sampler does not
    return a ``Sample`` of ``[T]`` int64 tokens (checked at the prefill, once per generation)."""
    result = sampler.sample(logits)
    tokens = getattr(result, "tokens", None)
    if not isinstance(result, Sample) or not isinstance(tokens, torch.Tensor) or tokens.shape != logits.shape[:1]:
        raise PluginError(f"{who}: sample() returned {result!r}, not a tileinfer.interfaces.Sample with one "
                          f"int64 token per row of the logits")
    return result


@torch.inference_mode()
def prefill(model: Qwen3Model, kv: KVStore, sampler: Sampler, ids: Sequence[int], capture: Collection[int] = (),
            who: str = "sampler", *, chunk: int | None = None, on_chunk: ChunkCallback | None = None,
            progress: bool = False) -> torch.Tensor:
    """Run the prompt ``ids`` from position 0 (the KV store empty) in steps of at most ``chunk``
    tokens (None: one step) and sample the token after it (``tileinfer.prefill.chunked_prefill``:
    ``on_chunk`` gets each chunk's ids, start and hidden states of the layers in ``capture``;
    ``progress`` shows a progress line on a terminal). Returns that token as a ``[1]`` int64 tensor
    on the device, not read by the host (-1 if the logits are not finite)."""
    logits = chunked_prefill(model, kv, ids, chunk=chunk or max(len(ids), 1), capture=capture, on_chunk=on_chunk,
                             progress=progress)
    return finite_or(checked_sample(sampler, logits, who).tokens, logits)


class HostTokens:
    """Sampled tokens on their way from the device to the host, without a sync when sent.

    ``send(i, token)`` enqueues the copy of token ``i`` (``[1]`` int64 on the device) into host
    slot ``i % depth`` (pinned memory on CUDA) and records a CUDA event after it; ``receive(i)``
    waits for that event alone and returns the token. A slot is reused ``depth`` tokens later, so
    at most ``depth`` tokens may be sent and not yet received. On a CPU the copy is synchronous
    and there are no events.
    """

    def __init__(self, device: torch.device, depth: int = 2) -> None:
        cuda = device.type == "cuda"
        self.depth = depth
        self.slots = torch.zeros(depth, dtype=torch.int64, pin_memory=cuda)
        self.events = [torch.cuda.Event() for _ in range(depth)] if cuda else None
        self.sent = self.received = 0

    def send(self, i: int, token: torch.Tensor) -> None:
        assert i == self.sent and i - self.received < self.depth, f"token {i} sent out of turn"
        slot = i % self.depth
        self.slots[slot:slot + 1].copy_(token, non_blocking=True)
        if self.events is not None:
            self.events[slot].record()
        self.sent += 1

    def receive(self, i: int) -> int:
        assert i == self.received < self.sent, f"token {i} received out of turn"
        slot = i % self.depth
        if self.events is not None:
            self.events[slot].synchronize()
        self.received += 1
        return int(self.slots[slot])

    def reset(self) -> None:
        """Forget tokens sent and not received (the step after an EOS)."""
        self.sent = self.received = 0


class Decoder:
    """One generation at a time over the engine's model, KV store, sampler and step runner.

    ``proposer`` (with ``spec_k`` tokens drafted per step, or with ``spec_adaptive`` between 1 and
    ``spec_k`` from the last step's acceptance: ``speculative.DraftLength``) makes the steps verify
    drafts: sequentially, or in ``loop`` (``device_speculation.SpeculativeLoop``, for the
    generations it applies to). ``pipelined`` selects the pipelined mode of plain decoding (a CUDA
    device: the engine decides). ``who`` names the sampler's plugin in errors. The prompt is
    prefilled in steps of at most ``prefill_chunk`` tokens (None: one step), the proposer fed each
    chunk; ``progress`` shows a long prefill's progress on a terminal.
    """

    def __init__(self, model: Qwen3Model, kv: KVStore, sampler: Sampler, steps: StepRunner, *,
                 proposer: Proposer | None = None, spec_k: int = 0, spec_adaptive: bool = False,
                 pipelined: bool = False, loop: SpeculativeLoop | None = None, who: str = "sampler",
                 prefill_chunk: int | None = None, progress: bool = False) -> None:
        assert loop is None or loop.proposer is proposer, "the loop drafts with the decoder's proposer"
        self.model, self.kv, self.sampler, self.steps, self.loop = model, kv, sampler, steps, loop
        self.proposer, self.spec_k, self.pipelined, self.who = proposer, spec_k, pipelined, who
        self.prefill_chunk, self.progress = prefill_chunk, progress
        self.draft_length = DraftLength(spec_k, spec_adaptive)
        self.host = HostTokens(model.device) if pipelined else None
        self.records = HostRecords(model.device, loop.k_max + 3) if loop else None
        self.counters = DecodeCounters()
        self.sampling = SamplingStep(sampler, [], 0)
        self.logprobs: list[TokenLogprob] = []  # of the tokens yielded last, when asked for

    def run(self, ids: Sequence[int], max_new: int, eos: Collection[int],
            logprobs: int | None = None) -> Iterator[list[int]]:
        """Prefill ``ids`` and decode after them; yields each step's committed tokens, the last
        list ending at the first token in ``eos`` or at the ``max_new``-th token. ``logprobs`` (top
        tokens per position): after each yield, ``self.logprobs`` holds the yielded tokens'
        (``sampling_step.TokenLogprob``); decoding is then sequential (the host reads them each step)."""
        assert max_new >= 1
        self.counters = DecodeCounters()
        self.draft_length.reset()
        self.sampler.generator.manual_seed(self.sampler.params.seed)
        self.kv.reset()
        self.sampling = SamplingStep(self.sampler, ids, len(ids) + max_new + self.spec_k + 2, logprobs)
        self.logprobs = []
        loop = "speculative-sequential" if self.proposer else "sequential"
        if logprobs is None and self.proposer is None and self.pipelined:
            loop = "pipelined"
        elif logprobs is None and self.loop is not None and self.loop.applies(self.sampler, len(ids), max_new):
            loop = "speculative-device"
        self.counters.loop = loop
        runs = {"pipelined": self._pipelined, "speculative-device": self._device_speculative}
        return runs.get(loop, self._sequential)(list(ids), max_new, frozenset(eos))

    # -- sequential ------------------------------------------------------------------------------

    def _sequential(self, ids: list[int], max_new: int, eos: frozenset[int]) -> Iterator[list[int]]:
        capture = self.proposer.hidden_layers if self.proposer else ()
        first = prefill(self.model, self.kv, self.sampling, ids, capture, self.who, chunk=self.prefill_chunk,
                        on_chunk=self.proposer.prompt_chunk if self.proposer else None, progress=self.progress)
        out = [_finite(int(first[0]), len(ids))]
        self.sampling.commit(out)
        self.logprobs = self.sampling.logprobs_of(out)
        self.counters.first_token_time = time.perf_counter()
        if self.proposer:
            self.proposer.start(ids + out)
        done = out[0] in eos or max_new == 1
        yield out[:]
        while not done:
            new = self.step(ids + out, max_new - len(out))
            _finite(min(new), len(ids) + len(out))
            self.counters.steps += 1
            keep, done = _until_stop(new, eos, max_new - len(out))
            self.logprobs = self.sampling.logprobs_of(keep)
            out += keep
            yield keep

    @torch.inference_mode()
    def step(self, sequence: list[int], remaining: int) -> list[int]:
        """One step after ``sequence`` (whose last token is not cached yet); the tokens to commit."""
        cached = len(sequence) - 1
        draft = Draft([])
        if self.proposer and remaining > 1:
            draft = self.proposer.propose(sequence, min(self.draft_length.k, remaining - 1))
        self.sampling.stage(draft.tokens)
        self.kv.reserve(cached + 1 + len(draft.tokens))
        tokens = torch.tensor([sequence[-1], *draft.tokens], dtype=torch.int64, device=self.model.device)
        logits, hidden = self.steps.forward(tokens, cached)
        if not draft.tokens:
            new = [int(finite_or(self.sampling.sample(logits).tokens, logits)[0])]
        elif self.sampler.greedy:
            new = verify_greedy(draft.tokens, logits, self.sampling)
        else:
            new = verify_sampled(draft.tokens, draft.probs, logits, self.sampling)
        self.sampling.commit(new)
        kept = len(new)  # the step's token and the accepted drafts hold valid keys and values
        self.counters.drafted += len(draft.tokens)
        self.counters.accepted += kept - 1
        self.draft_length.update(len(draft.tokens), kept - 1)
        self.kv.truncate(cached + kept)
        if self.proposer:
            self.proposer.accept(sequence + new, kept - 1, {n: h[:kept] for n, h in hidden.items()})
        return new

    # -- pipelined -------------------------------------------------------------------------------

    def _pipelined(self, ids: list[int], max_new: int, eos: frozenset[int]) -> Iterator[list[int]]:
        """Step ``t`` (``t >= 1``) takes token ``t - 1`` as a ``[1]`` device tensor and samples token
        ``t`` on the device; the host enqueues step ``t + 1`` and only then waits for token ``t``.

        Stops as sequential decoding does, with the same tokens (with a seed, the same sampled
        tokens: one draw per step in the same order). At the length limit no step is enqueued for
        a token past ``max_new``. At an EOS the step after it was already enqueued: it caches its
        input, the EOS, and its token is discarded, so the KV store ends holding the prompt and
        every emitted token (one position more than after sequential decoding)."""
        host = self.host
        host.reset()
        token = prefill(self.model, self.kv, self.sampling, ids, who=self.who, chunk=self.prefill_chunk,
                        progress=self.progress)
        host.send(0, token)
        done = False
        while not done:
            if host.sent < max_new:  # step t = host.sent, fed with token t - 1
                token = self.device_step(token, len(ids) + host.sent - 1)
                host.send(host.sent, token)
            new = _finite(host.receive(host.received), len(ids) + host.received - 1)
            if host.received == 1:
                self.counters.first_token_time = time.perf_counter()
            else:
                self.counters.steps += 1
            done = new in eos or host.received >= max_new
            if done:  # what the store holds: the prompt and the committed tokens fed to steps
                self.kv.truncate(len(ids) + min(host.sent - 1, host.received))
            yield [new]

    @torch.inference_mode()
    def device_step(self, token: torch.Tensor, cached: int) -> torch.Tensor:
        """Enqueue the step that feeds ``token`` (``[1]`` int64 on the device) at position
        ``cached``; returns the token it samples, on the device. No host sync."""
        self.kv.reserve(cached + 1)
        logits, _ = self.steps.forward(token, cached)
        self.sampling.commit(token)
        return finite_or(self.sampling.sample(logits).tokens, logits)

    # -- speculative, on the device --------------------------------------------------------------

    def _device_speculative(self, ids: list[int], max_new: int, eos: frozenset[int]) -> Iterator[list[int]]:
        """Record ``r`` (``r >= 1``) is step ``r``'s: its committed tokens and draft count; record
        0 the prefill's token. The host enqueues step ``r + 1`` (drafting the current
        ``draft_length.k``, set from the records read so far) and only then waits for record ``r``,
        unless the tokens known and the steps in flight (one token each at least) already reach
        ``max_new``.

        Same tokens and counts as speculative-sequential decoding with the same drafts (a step
        drafts at most ``remaining - 1`` tokens here too); with ``spec_adaptive`` the draft length
        follows the acceptance one step later. At a stop the step enqueued after it is discarded,
        and the KV store is cut to the prompt and the emitted tokens that were fed to a step."""
        loop, host, counters = self.loop, self.records, self.counters
        host.reset()
        first = prefill(self.model, self.kv, self.sampling, ids, self.proposer.hidden_layers, self.who,
                        chunk=self.prefill_chunk, on_chunk=self.proposer.prompt_chunk, progress=self.progress)
        host.send(0, loop.begin(ids, first, max_new))
        emitted, committed, done = 0, 0, False  # new tokens yielded; committed by the records read
        while not done:
            if committed + host.sent - host.received < max_new:
                host.send(host.sent, loop.step(self.draft_length.k))
            new, drafted = host.receive(host.received)
            _finite(min(new), len(ids) + committed)
            committed += len(new)
            if host.received == 1:
                counters.first_token_time = time.perf_counter()
            else:
                counters.steps += 1
                counters.drafted += drafted
                counters.accepted += len(new) - 1
                self.draft_length.update(drafted, len(new) - 1)
            keep, done = _until_stop(new, eos, max_new - emitted)
            emitted += len(keep)
            if done:  # valid keys and values: the committed tokens, the last one once a step fed it
                fed = committed - (0 if host.sent > host.received else 1)
                self.kv.truncate(len(ids) + min(emitted, fed))
            yield keep


def _finite(token: int, position: int) -> int:
    """``token``, or NumericsError when the step found its logits not finite (token -1)."""
    if token < 0:
        raise NumericsError(f"the logits for position {position} are not finite (NaN or inf): the model's "
                            "weights or activations overflow; nothing was sampled from them")
    return token


def _until_stop(tokens: list[int], eos: frozenset[int], remaining: int) -> tuple[list[int], bool]:
    """The tokens to commit (up to the first EOS and at most ``remaining``) and whether the
    generation is over."""
    for i, token in enumerate(tokens[:remaining]):
        if token in eos:
            return tokens[:i + 1], True
    keep = tokens[:remaining]
    return keep, len(keep) == remaining


__all__ = ["DecodeCounters", "Decoder", "HostTokens", "checked_sample", "prefill"]
