"""Prefill, and pipelined plain decoding: the host one step behind the device.

``PipelinedDecoder`` (config key ``pipelined``) decodes one token per step without a host sync
in a step: the token is sampled on the device and fed to the next step from there, and the
host enqueues step ``t + 1`` before it reads step ``t``'s token, so the device never waits for
the host to read a token and launch the next step. The engine picks it once, when it is built,
on a CUDA device without a proposer; otherwise the engine decodes sequentially (see
``pipelining_applies``).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Collection, Sequence

import torch

from tileinfer.interfaces import KVStore, Sampler, Step
from tileinfer.model import Qwen3Model
from tileinfer.steps import EagerSteps, GraphedSteps

Commit = Callable[[list[int]], bool]  # append tokens to the generation; True when it is over


def prefill(model: Qwen3Model, kv: KVStore, sampler: Sampler, ids: Sequence[int],
            capture: Collection[int] = ()) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
    """Run the prompt ``ids`` as one step from position 0 (the KV store empty) and sample the token
    after it. Returns that token as a ``[1]`` int64 tensor on the device, not read by the host, and
    the hidden states of the layers in ``capture``."""
    step = Step.at(0, len(ids), model.device)
    kv.reserve(step.end)
    tokens = torch.tensor(list(ids), dtype=torch.int64, device=model.device)
    logits, hidden = model.forward(tokens, step, kv, last_only=True, capture=capture)
    return sampler.sample(logits).tokens, hidden


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


class PipelinedDecoder:
    """Plain decoding, one token per step, with the host one step behind the device.

    The prefill's token and each step's token stay on the device: step ``t`` (``t >= 1``) takes
    token ``t - 1`` as a ``[1]`` device tensor (``steps.forward`` copies it into a graph's static
    buffer, or an eager step embeds it directly), and ``sampler.sample`` draws token ``t`` from
    the step's logits on the device, enqueued before the next step can overwrite a graph's static
    logits. Then the host enqueues step ``t + 1`` and only then waits for token ``t`` (an event
    after its copy to the host) and commits it. Nothing in a step reads the device on the host,
    given a sampler and a steps runner that do not (the reference sampler, ``EagerSteps`` and
    ``GraphedSteps`` do not; a page of the KV store is reserved without a sync).

    Stops, as in sequential decoding (the same tokens, and with a seed the same sampled tokens:
    one draw per step in the same order; the discarded step draws after every committed token):

    - length: no step is enqueued for a token past ``max_new``, so nothing is wasted; the KV
      store ends holding the prompt and every emitted token but the last (which no step took
      as input), as after sequential decoding;
    - EOS: the step after the EOS was enqueued before the host read the EOS, and costs one step
      of device time. Its token is discarded: never emitted, never fed to a step. That step
      cached its input, the EOS, so the KV store ends holding the prompt and every emitted
      token (one position more than after sequential decoding, which never feeds the EOS).

    Speculative decoding is sequential: the host needs each verify result before it can draft.
    """

    def __init__(self, model: Qwen3Model, kv: KVStore, sampler: Sampler, steps: EagerSteps | GraphedSteps) -> None:
        self.model, self.kv, self.sampler, self.steps = model, kv, sampler, steps
        self.host = HostTokens(model.device)

    def step(self, token: torch.Tensor, cached: int) -> torch.Tensor:
        """Enqueue the step that feeds ``token`` (``[1]`` int64 on the device) at position
        ``cached``; returns the token it samples, on the device. No host sync."""
        self.kv.reserve(cached + 1)
        logits, _ = self.steps.forward(token, cached)
        return self.sampler.sample(logits).tokens

    def run(self, ids: Sequence[int], max_new: int, commit: Commit) -> tuple[float, int]:
        """Prefill ``ids`` (the KV store empty) and decode after them, passing each token, once on
        the host, to ``commit`` (as ``[token]``) until it returns True; ``commit`` must return True
        at the latest at the ``max_new``-th token. Returns the time (``time.perf_counter``) the
        first token reached the host, which is after step 1 was enqueued, and the number of steps
        whose tokens were committed (a discarded step after an EOS is not counted)."""
        host = self.host
        host.reset()
        token, _ = prefill(self.model, self.kv, self.sampler, ids)
        host.send(0, token)
        first_time, done = 0.0, False
        while not done:
            if host.sent < max_new:  # step t = host.sent, fed with token t - 1
                token = self.step(token, len(ids) + host.sent - 1)
                host.send(host.sent, token)
            new = host.receive(host.received)
            if host.received == 1:
                first_time = time.perf_counter()
            done = commit([new])
        # Keep the prompt and the committed tokens that were fed to steps. With one step of
        # look-ahead the discarded step fed a committed token (the EOS), so this drops nothing;
        # it states what the store holds should the look-ahead grow.
        self.kv.truncate(len(ids) + min(host.sent - 1, host.received))
        return first_time, host.received - 1


def pipelining_applies(device: torch.device, proposer: str) -> bool:
    """Whether ``pipelined=true`` takes effect; if not, prints a one-line notice on stderr.

    On a CPU every op is synchronous, so there is nothing to overlap. With a proposer the host
    needs each verify result to draft the next step, so decoding stays sequential.
    """
    if device.type != "cuda":
        print(f"notice: pipelined has no effect on device {device.type} (it overlaps the host with a GPU)",
              file=sys.stderr)
        return False
    if proposer != "none":
        print(f"notice: pipelined does not apply with proposer={proposer} (the host needs each verify "
              "result before it drafts); decoding sequentially", file=sys.stderr)
        return False
    return True
