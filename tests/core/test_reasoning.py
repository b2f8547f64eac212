"""The reasoning parser (tileinfer.reasoning): Qwen3's <think> block split from the answer, fed
whole and fed in pieces cut at every pair of split points (a tag split over deltas must be
recognised, and no part of a tag may reach either side)."""

from __future__ import annotations

import pytest

from tileinfer.reasoning import ANSWER, START, THINKING, ReasoningParser, split_reasoning, thinking_mode

CASES = [  # (mode, reply, reasoning, content)
    (START, "<think>\nLet me add: 2 + 2 = 4.\n</think>\n\nThe answer is 4.", "Let me add: 2 + 2 = 4.",
     "The answer is 4."),
    (START, "<think>\na < b and </b> is no tag\n\nsecond line\n</think>\n\nDone.\n",
     "a < b and </b> is no tag\n\nsecond line", "Done.\n"),
    (START, "def f():\n    return '<think>'", None, "def f():\n    return '<think>'"),
    (START, "<think>\ncut off in the mid", "cut off in the mid", ""),
    (START, "<think>\n\n</think>\n\nNo thought.", "", "No thought."),
    (START, "<thin", None, "<thin"),
    (THINKING, "Already inside.\n</think>\n\nAnswer <think> stays.", "Already inside.", "Answer <think> stays."),
    (THINKING, "never closed </thin", "never closed </thin", ""),
    (ANSWER, "<think>\nnot thinking\n</think>\n\nall text", None, "<think>\nnot thinking\n</think>\n\nall text"),
]


def feed_all(mode: str, pieces: list[str]) -> tuple[str | None, str, list[tuple[str, str]]]:
    parser = ReasoningParser(mode)
    deltas = [parser.feed(p) for p in pieces] + [parser.finish()]
    reasoning = "".join(d.reasoning for d in deltas)
    return (reasoning if parser.thought else None), "".join(d.content for d in deltas), \
        [(d.reasoning, d.content) for d in deltas]


@pytest.mark.parametrize("mode, text, reasoning, content", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_whole(mode, text, reasoning, content):
    assert split_reasoning(text, mode) == (reasoning, content)


@pytest.mark.parametrize("mode, text, reasoning, content", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_every_split(mode, text, reasoning, content):
    for i in range(len(text) + 1):
        for j in range(i, len(text) + 1):
            got_reasoning, got_content, _ = feed_all(mode, [text[:i], text[i:j], text[j:]])
            assert (got_reasoning, got_content) == (reasoning, content), (i, j)


@pytest.mark.parametrize("mode, text, reasoning, content", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_one_character_at_a_time(mode, text, reasoning, content):
    got_reasoning, got_content, deltas = feed_all(mode, list(text))
    assert (got_reasoning, got_content) == (reasoning, content)
    for side in (0, 1):  # no delta holds a piece of a tag
        assert not any(part in d[side] for d in deltas for part in ("<think", "</think", "think>")) \
            or "<think>" in (content or "")


def test_thinking_streams_before_the_end_tag():
    parser = ReasoningParser(START)
    assert parser.feed("<think>\nstep one").reasoning == "step one"
    assert parser.feed(", step two</").reasoning == ", step two"  # "</" waits: it may open </think>
    out = parser.feed("think>\n\nIt is 4")
    assert (out.reasoning, out.content) == ("", "It is 4")


def test_mode_from_the_generation_prompt():
    assert thinking_mode("<|im_start|>assistant\n") == START  # Qwen3, thinking on: the model opens <think>
    assert thinking_mode("<|im_start|>assistant\n<think>\n\n</think>\n\n") == ANSWER  # enable_thinking: false
    assert thinking_mode("<|im_start|>assistant\n<think>\n") == THINKING  # Qwen3.5 / 2507 thinking templates


def test_unknown_mode():
    with pytest.raises(ValueError, match="mode must be"):
        ReasoningParser("maybe")
