"""The order of a constrained generation's host work against its device work, through the real decode
loop (a tiny checkpoint, the reference config on the CPU) with a recording matcher in place of
xgrammar's: each step's mask is filled after the step that produces its logits was enqueued and
before anything of that step is read on the host (so on a GPU the host fills it while the step runs),
and the matcher is advanced by the tokens read before the next step is enqueued. A loop that filled
the mask once the step's token or logits were read would record a read between the step and its
mask, and fail here."""

from __future__ import annotations

import pytest
import torch

from conftest import reference_engine, repetitive_prompt
from tileinfer.sampling_step import SamplingStep

WORDS_OF = lambda vocab: (vocab + 31) // 32  # noqa: E731


class RecordingMatcher:
    """Allows every token; records each mask it fills and each committed token it is advanced by."""

    def __init__(self, vocab_size: int, events: list[str]) -> None:
        self.vocab_size, self.words, self.events = vocab_size, WORDS_OF(vocab_size), events
        self.accepted = 0

    def accept(self, token: int) -> bool:
        self.accepted += 1
        return True

    def rollback(self, n: int) -> None:
        self.accepted -= n

    def is_terminated(self) -> bool:
        return False

    def mask(self, bitmask: torch.Tensor, row: int = 0) -> bool:
        self.events.append("mask")
        bitmask[row].fill_(-1)
        return True

    def admissible(self, tokens) -> int:
        return len(tokens)


def record(monkeypatch, engine) -> list[str]:
    """The events of the engine's next generation: "step" (a forward pass or the prefill enqueued),
    "mask", "read" (any device value read on the host) and "advance" (committed tokens given to
    the grammar)."""
    events: list[str] = []
    steps = engine.decoder.steps
    for name in ("forward", "prefill"):
        def enqueue(*args, _call=getattr(steps, name), **kw):
            events.append("step")
            return _call(*args, **kw)
        monkeypatch.setattr(steps, name, enqueue)
    for name in ("tolist", "item", "__bool__", "__int__", "__float__"):
        def read(self, *args, _call=getattr(torch.Tensor, name), **kw):
            events.append("read")
            return _call(self, *args, **kw)
        monkeypatch.setattr(torch.Tensor, name, read)
    advance = SamplingStep.advance

    def advanced(self, tokens):
        if self.grammar is not None:
            events.append("advance")
        return advance(self, tokens)
    monkeypatch.setattr(SamplingStep, "advance", advanced)
    return events


def check_order(events: list[str], steps: int) -> None:
    """Every step's mask comes after the step and before any read; the reads of a step come before
    the grammar is advanced, which comes before the next step."""
    assert events.count("step") == steps, events
    assert events[0] == "step"
    for i, event in enumerate(events):
        if event == "step":
            rest = [e for e in events[i + 1:] if e in ("mask", "read")]
            assert rest and rest[0] == "mask", f"a read before the mask of the step at event {i}: {events}"
        if event == "step" and i:
            before = [e for e in events[:i] if e != "mask"]
            assert before[-1] == "advance", f"the step at event {i} was enqueued before the grammar saw the last " \
                                            f"tokens: {events}"


@pytest.mark.parametrize("proposer", ["none", "ngram"])
def test_the_mask_is_filled_while_the_step_runs(tiny_checkpoint, monkeypatch, proposer):
    keys = {"proposer": "ngram", "spec_k": 3} if proposer == "ngram" else {}
    engine = reference_engine(tiny_checkpoint, **keys)
    prompt = repetitive_prompt()
    expected = list(engine.decoder.run(prompt, 12, ()))
    events = record(monkeypatch, engine)
    matcher = RecordingMatcher(engine.model_config.vocab_size, events)
    out = list(engine.decoder.run(prompt, 12, (), grammar=matcher))
    monkeypatch.undo()
    assert sum(out, []) == sum(expected, [])  # a grammar that allows everything changes nothing
    assert engine.decoder.counters.loop == ("sequential" if proposer == "none" else "speculative-sequential")
    check_order(events, steps=1 + engine.decoder.counters.steps)
    if proposer == "ngram":
        assert engine.decoder.counters.accepted > 0  # verify steps ran: their rows were masked
