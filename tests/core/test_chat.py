"""tileinfer chat: the REPL driven through a pseudo-terminal, and its history and Ctrl-C in process."""

from __future__ import annotations

import os
import pty
import select
import subprocess
import sys
import time

import pytest

import tileinfer
from tileinfer import SamplingParams
from tileinfer.chat import ChatSession
from conftest import REFERENCE_CPU as BASE

SYSTEM = "You write Python."


@pytest.fixture(scope="module")
def engine(tiny_checkpoint):
    return tileinfer.Engine.from_config(model=str(tiny_checkpoint), overrides=BASE, progress=False)


def reply_to(engine, messages, max_new_tokens) -> str:
    text = engine.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    return engine.generate(engine.tokenizer.encode(text, add_special_tokens=False), max_new_tokens=max_new_tokens).text


class Terminal:
    """A child process on a pseudo-terminal, read until an expected output appears."""

    def __init__(self, argv: list[str]) -> None:
        master, slave = pty.openpty()
        env = {**os.environ, "TERM": "dumb", "PYTHONIOENCODING": "utf-8"}
        self.proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, env=env, close_fds=True)
        os.close(slave)
        self.master = master
        self.output = b""

    def expect(self, needle: bytes, timeout: float = 60) -> bytes:
        """The output up to and including the first ``needle`` after what was already read."""
        deadline = time.monotonic() + timeout
        while needle not in self.output:
            left = deadline - time.monotonic()
            assert left > 0, f"timed out waiting for {needle!r}; output so far: {self.output[-2000:]!r}"
            ready, _, _ = select.select([self.master], [], [], left)
            if ready:
                try:
                    data = os.read(self.master, 65536)
                except OSError:  # EIO: the child closed the terminal
                    data = b""
                assert data, f"the process ended before {needle!r}; output: {self.output[-2000:]!r}"
                self.output += data
        seen, _, self.output = self.output.partition(needle)
        return seen + needle

    def send(self, text: str | bytes) -> None:
        os.write(self.master, text if isinstance(text, bytes) else text.encode())

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        os.close(self.master)


def test_two_turns_reset_and_eof_through_a_terminal(tiny_checkpoint, engine):
    tokens = 8
    term = Terminal([sys.executable, "-m", "tileinfer.cli", "chat", "--model", str(tiny_checkpoint), "--system",
                     SYSTEM, "--max-new-tokens", str(tokens), *BASE])
    try:
        term.expect(b"/reset clears the history")
        term.expect(b"> ")
        term.send(b"caf\xe9 \xff\n")  # Latin-1, not UTF-8: skipped with a notice, the session goes on
        term.expect(b"not valid UTF-8")
        term.expect(b"> ")
        first = reply_to(engine, [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "hello"}], tokens)
        assert first  # something to look for
        term.send("hello\n")
        shown = term.expect(b"\n> ")
        assert first.replace("\n", "\r\n").encode() in shown
        history = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "hello"},
                   {"role": "assistant", "content": first}, {"role": "user", "content": "and then?"}]
        second = reply_to(engine, history, tokens)
        term.send("and then?\n")
        assert second.replace("\n", "\r\n").encode() in term.expect(b"\n> ")
        term.send("/reset\n")
        term.expect(b"history cleared")
        term.expect(b"> ")
        term.send("hello\n")  # a fresh history: the first reply again
        assert first.replace("\n", "\r\n").encode() in term.expect(b"\n> ")
        term.send("\x04")  # Ctrl-D on an empty line: end of input
        assert term.proc.wait(timeout=30) == 0
    finally:
        term.close()


def test_the_oldest_turns_are_dropped_to_fit_the_context(engine):
    notes = []
    session = ChatSession(engine, SamplingParams(max_tokens=8), system=SYSTEM, notify=notes.append)
    budget = engine.capacity - 8
    long = "def add(a, b): return a + b " * 8
    while True:
        session.reply(long, lambda text: None)
        if notes:
            break
        assert len(session.turns) < 200
    assert "dropped the" in notes[0] and "oldest turn" in notes[0]
    ids = session.prompt_ids("hi")
    assert len(ids) <= budget and session.turns[-1] == {"role": "user", "content": "hi"}
    assert session.turns[0]["role"] == "user"  # whole turns are dropped
    assert session.reply("x " * engine.capacity, lambda text: None) is None  # alone too long: refused, said so
    assert "more than the context holds" in notes[-1]


def test_ctrl_c_stops_the_reply_not_the_session(engine):
    notes, written = [], []

    def write(text):
        written.append(text)
        if len(written) == 3:
            raise KeyboardInterrupt

    session = ChatSession(engine, SamplingParams(max_tokens=32), notify=notes.append)
    partial = session.reply("hello", write)
    assert notes == ["stopped"] and partial == "".join(written)
    assert session.turns[-1] == {"role": "assistant", "content": partial}
    # the engine was freed: the next turn runs, with the partial reply in its history
    expected = reply_to(engine, [*session.turns, {"role": "user", "content": "more"}], 32)
    assert session.reply("more", lambda text: None) == expected
