"""Qwen3's reasoning: the text a reply writes between ``<think>`` and ``</think>``, split from the
answer as it streams (what vLLM's qwen3 reasoning parser returns as ``reasoning_content``).

Where a reply starts depends on the generation prompt the chat template wrote after the history
(``thinking_mode``): a prompt that leaves ``<think>`` open (Qwen3.5 and the 2507 thinking
models' templates) starts the reply inside the thinking (``THINKING``); one that closed it
(``enable_thinking: false``: ``<think>\\n\\n</think>\\n\\n``) has no thinking (``ANSWER``: every
tag is text); otherwise (Qwen3's template with thinking on) a reply that opens with ``<think>``
thinks until ``</think>``, and one that opens with anything else is all answer (``START``).

``ReasoningParser`` works on text deltas: a tag split over two deltas is recognised, and a delta
that may be the start of a tag is held back until the next one decides, so neither side ever
shows part of a tag. As the template strips them when the reply comes back in the history, the
newlines around the thinking and those that open the answer after ``</think>`` are dropped.
"""

from __future__ import annotations

from dataclasses import dataclass

THINK, END_THINK = "<think>", "</think>"
START, THINKING, ANSWER = "start", "thinking", "answer"


def thinking_mode(generation_prompt: str) -> str:
    """The state a reply begins in, from the text the template writes after the history to open
    the assistant's turn: ``THINKING`` (``<think>`` left open), ``ANSWER`` (``</think>`` closed
    it: thinking off) or ``START`` (neither: the reply may open ``<think>`` itself)."""
    opened, closed = generation_prompt.rfind(THINK), generation_prompt.rfind(END_THINK)
    if opened > closed:
        return THINKING
    return ANSWER if closed >= 0 else START


def held_prefix(text: str, tag: str) -> int:
    """The length of the longest end of ``text`` that is a proper start of ``tag`` (what must wait
    for the next delta to tell whether the tag follows)."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


@dataclass
class Split:
    """A piece of a reply: its thinking and its answer (either may be empty)."""

    reasoning: str = ""
    content: str = ""

    def __add__(self, other: "Split") -> "Split":
        return Split(self.reasoning + other.reasoning, self.content + other.content)


class ReasoningParser:
    """Splits a reply's text deltas into thinking and answer; ``feed`` each delta, then
    ``finish`` once (it releases what was held back: a truncated thinking stays thinking, an
    unfinished ``<think>`` prefix at the start is answer)."""

    def __init__(self, mode: str = START) -> None:
        if mode not in (START, THINKING, ANSWER):
            raise ValueError(f"mode must be {START!r}, {THINKING!r} or {ANSWER!r}, got {mode!r}")
        self.state = mode
        self.thought = mode == THINKING  # whether a thinking block was opened (reasoning is then not None)
        self._held = ""  # text not yet given to either side
        self._lead = True  # the thinking has written nothing yet (its leading newlines drop)
        self._strip_answer = False  # the answer follows </think>: its leading newlines drop

    def feed(self, text: str) -> Split:
        out = Split()
        self._held += text
        while True:
            if self.state == START:
                if not self._start():
                    return out
            elif self.state == THINKING:
                piece, done = self._thinking()
                out.reasoning += piece
                if not done:
                    return out
            else:
                out.content += self._answer()
                return out

    def finish(self) -> Split:
        """What was held back, given to its side at the end of the reply."""
        held, self._held = self._held, ""
        if self.state == THINKING:
            return Split(reasoning=held.strip("\n") if self._lead else held.rstrip("\n"))
        if self.state == ANSWER and self._strip_answer:
            held = held.lstrip("\n")
        return Split(content=held)

    def _start(self) -> bool:
        """START: True once the reply has shown whether it opens with <think>."""
        text = self._held.lstrip()
        if text.startswith(THINK):
            self.state, self.thought, self._held, self._lead = THINKING, True, text[len(THINK):], True
            return True
        if THINK.startswith(text):  # nothing but blanks and a start of <think> yet
            return False
        self.state = ANSWER
        return True

    def _thinking(self) -> tuple[str, bool]:
        """THINKING: the reasoning that can be given now, and whether </think> ended it."""
        end = self._held.find(END_THINK)
        if end >= 0:
            piece, self._held = self._held[:end], self._held[end + len(END_THINK):]
            if self._lead:
                piece = piece.lstrip("\n")
            self.state, self._strip_answer = ANSWER, True
            return piece.rstrip("\n"), True
        keep = held_prefix(self._held, END_THINK)
        piece = self._held[:len(self._held) - keep]
        body = piece.rstrip("\n")
        keep += len(piece) - len(body)  # trailing newlines wait: they drop if </think> follows
        if self._lead:
            body = body.lstrip("\n")
        self._held = self._held[len(self._held) - keep:] if keep else ""
        if body:
            self._lead = False
        return body, False

    def _answer(self) -> str:
        text, self._held = self._held, ""
        if self._strip_answer:
            text = text.lstrip("\n")
            if not text:
                return ""
            self._strip_answer = False
        return text


def split_reasoning(text: str, mode: str = START) -> tuple[str | None, str]:
    """A whole reply's (reasoning, answer); reasoning None when the reply did not think."""
    parser = ReasoningParser(mode)
    out = parser.feed(text) + parser.finish()
    return (out.reasoning if parser.thought else None), out.content


__all__ = ["ANSWER", "END_THINK", "ReasoningParser", "START", "Split", "THINK", "THINKING", "held_prefix",
           "split_reasoning", "thinking_mode"]
