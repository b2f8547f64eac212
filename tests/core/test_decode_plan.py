"""The decoding plan (core/decode_plan.py): which strategy and host-sync policy the config gives on
each device, with a notice for each key that cannot apply; which one each generation takes from its
own settings, with the reason when it falls back; and the one class that carries step records to
the host (core/host_records.py), read eagerly or one step behind. No model runs here."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from tileinfer.decode_plan import LOOPS, Choice, DecodePlan
from tileinfer.host_records import HostRecords
from tileinfer.interfaces import Draft, Proposer

CPU, CUDA = torch.device("cpu"), torch.device("cuda")


class HostOnly(Proposer):
    def __init__(self) -> None:
        self.options = {}

    def propose(self, tokens, k):
        return Draft([])


class OnDevice(HostOnly):
    """Drafts on the device up to ``reach`` positions."""

    def __init__(self, reach: int = 10**6) -> None:
        super().__init__()
        self.reach = reach

    def device_drafting(self, positions):
        return positions <= self.reach

    def draft_on_device(self, seq, k):
        raise AssertionError("not called by the plan")


def config(**keys) -> SimpleNamespace:
    base = dict(pipelined=True, cuda_graphs=True, spec_k=3, spec_adaptive=False, proposer="p")
    return SimpleNamespace(**{**base, **keys})


def notices(caplog) -> list[str]:
    found = [r.getMessage() for r in caplog.records if r.name == "tileinfer"]
    caplog.clear()
    return found


# (device, config keys, proposer) -> (strategy, ahead, graphs, what the one notice says or None)
FROM_CONFIG = {
    "plain-cuda": (CUDA, {}, None, ("plain", True, True, None)),
    "plain-cuda-eager": (CUDA, dict(pipelined=False, cuda_graphs=False), None, ("plain", False, False, None)),
    "plain-cpu": (CPU, {}, None, ("plain", False, False, "cuda_graphs and pipelined have no effect on device cpu")),
    "plain-cpu-graphs": (CPU, dict(pipelined=False), None, ("plain", False, False, "cuda_graphs has no effect")),
    "plain-cpu-off": (CPU, dict(pipelined=False, cuda_graphs=False), None, ("plain", False, False, None)),
    "device-loop": (CUDA, {}, OnDevice(), ("device", True, True, None)),
    "device-loop-k15": (CUDA, dict(spec_k=15), OnDevice(), ("device", True, True, None)),
    "device-loop-k16": (CUDA, dict(spec_k=16), OnDevice(), ("host", False, True, "pipelined does not apply with spec_k=16")),
    "host-only-proposer": (CUDA, {}, HostOnly(), ("host", False, True, "pipelined does not apply with proposer=p")),
    "not-pipelined": (CUDA, dict(pipelined=False), OnDevice(), ("host", False, True, None)),
    "device-proposer-cpu": (CPU, {}, OnDevice(), ("host", False, False, "have no effect on device cpu")),
}


@pytest.mark.parametrize("case", FROM_CONFIG)
def test_the_config_gives_one_plan_per_device(case, caplog):
    device, keys, proposer, (strategy, ahead, graphs, notice) = FROM_CONFIG[case]
    caplog.clear()
    plan = DecodePlan.from_config(config(**keys), proposer, device)
    assert (plan.strategy, plan.ahead, plan.graphs) == (strategy, ahead, graphs)
    assert plan.proposer is proposer and plan.spec_k == config(**keys).spec_k
    found = notices(caplog)
    if notice is None:
        assert found == []
    else:
        assert len(found) == 1 and notice in found[0], found


def test_adaptive_plans_capture_every_draft_length():
    assert DecodePlan.from_config(config(spec_adaptive=True, spec_k=4), OnDevice(), CUDA).k_values == [1, 2, 3, 4]
    assert DecodePlan.from_config(config(spec_k=4), OnDevice(), CUDA).k_values == [4]


def test_only_the_four_loops_are_plans():
    """Four plans; the fifth loop, a grammar's split plain steps, is chosen per generation."""
    assert set(LOOPS.values()) == {"sequential", "pipelined", "pipelined-grammar", "speculative-sequential",
                                   "speculative-device"}
    for strategy, ahead in (("host", True), ("device", False)):
        with pytest.raises(ValueError, match="no decode loop runs"):
            DecodePlan(strategy, ahead, proposer=OnDevice())
    with pytest.raises(ValueError, match="proposer"):
        DecodePlan("plain", proposer=OnDevice())
    with pytest.raises(ValueError, match="proposer"):
        DecodePlan("host")


def sampler(greedy: bool = True, history: bool = False) -> SimpleNamespace:
    return SimpleNamespace(greedy=greedy, uses_history=history)


# A generation of 40 new tokens after 47 prompt tokens, spec_k 3: the device loop reserves 47 + 40 + 8
# = 95 positions. (sampler, logprobs, KV capacity, the proposer's reach) -> strategy, ahead, reason words
DEVICE_PLAN = DecodePlan("device", True, spec_k=3, proposer=OnDevice())
CHOOSE = {
    "greedy": (sampler(), None, 95, 95, ("device", True, "")),
    "sampled": (sampler(greedy=False), None, 512, 10**6, ("host", False, "sampled")),
    "penalty": (sampler(history=True), None, 512, 10**6, ("host", False, "history")),
    "logprobs": (sampler(), 2, 512, 10**6, ("host", False, "logprobs")),
    "past-the-store": (sampler(), None, 94, 10**6, ("host", False, "95 positions, the KV store holds 94")),
    "past-the-proposer": (sampler(), None, 512, 94, ("host", False, "cannot draft on the device up to position 95")),
    "every-reason": (sampler(greedy=False, history=True), 0, 94, 10**6, ("host", False, "sampled")),
}


@pytest.mark.parametrize("case", CHOOSE)
def test_each_generation_takes_the_device_loop_or_host_drafting_with_its_reason(case):
    sampled, logprobs, capacity, reach, (strategy, ahead, reason) = CHOOSE[case]
    plan = DecodePlan("device", True, spec_k=3, proposer=OnDevice(reach))
    choice = plan.choose(sampled, 47, 40, logprobs, capacity)
    assert (choice.strategy, choice.ahead) == (strategy, ahead)
    assert reason in choice.reason and bool(choice.reason) == bool(reason)
    assert choice.loop == ("speculative-device" if strategy == "device" else "speculative-sequential")
    if case == "every-reason":
        assert choice.reason.count("; ") == 3  # sampled, history, logprobs, room: all named


def test_plain_and_host_plans_per_generation():
    ahead, eager, host = DecodePlan("plain", True), DecodePlan("plain"), DecodePlan("host", proposer=HostOnly())
    assert ahead.choose(sampler(greedy=False, history=True), 47, 40, None, 10) == Choice("plain", True)
    read = ahead.choose(sampler(), 47, 40, 0, 10)
    assert (read.strategy, read.ahead, read.loop) == ("plain", False, "sequential") and "logprobs" in read.reason
    assert eager.choose(sampler(), 47, 40, 3, 10) == Choice("plain", False)
    assert host.choose(sampler(greedy=False), 47, 40, 2, 10) == Choice("host", False)
    assert [c.loop for c in (Choice("plain", True), Choice("host", False), Choice("device", True))] == [
        "pipelined", "speculative-sequential", "speculative-device"]


# -- HostRecords ----------------------------------------------------------------------------------


def test_records_are_read_in_order_one_step_behind():
    records = HostRecords(CPU, width=6)
    buffer = torch.tensor([3, 4, 11, 12, 13, 0])  # a static record buffer, rewritten by the next step
    records.send(buffer[:5])
    buffer.copy_(torch.tensor([1, 0, 21, -5, -5, -5]))
    records.send(buffer[:3])
    assert records.in_flight == 2
    with pytest.raises(AssertionError, match="in flight already"):
        records.send(buffer[:3])
    buffer.fill_(-7)  # a copy was taken at each send
    assert records.receive() == ([11, 12, 13], 4)
    records.send(torch.tensor([2, 1, 31, 32]))  # a host record, in the slot just read
    assert records.receive() == ([21], 0) and records.receive() == ([31, 32], 1)
    assert (records.sent, records.received, records.in_flight) == (3, 3, 0)
    with pytest.raises(AssertionError, match="no record in flight"):
        records.receive()


def test_records_read_eagerly_and_reset():
    records = HostRecords(CPU, width=3, depth=1)
    for token in (5, 6, 7):
        records.send(torch.tensor([1, 0, token]))
        assert records.receive() == ([token], 0)
    records.send(torch.tensor([1, 0, 8]))  # a step enqueued after the stop, never read
    records.reset()
    assert records.in_flight == 0
    records.send(torch.tensor([1, 0, 9]))
    assert records.receive() == ([9], 0)
    with pytest.raises(AssertionError, match="slots of 3"):
        records.send(torch.tensor([2, 1, 1, 2]))


@pytest.mark.gpu
def test_a_record_is_sent_without_a_sync_on_the_gpu():
    records = HostRecords(CUDA, width=4)
    buffer = torch.tensor([2, 1, 7, 8], device="cuda")
    torch.cuda.set_sync_debug_mode("error")
    try:
        records.send(buffer)
        buffer[2:].add_(100)  # stream-ordered after the copy
        records.send(buffer)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert records.receive() == ([7, 8], 1) and records.receive() == ([107, 108], 1)
