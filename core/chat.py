"""``tileinfer chat``: a multi-turn chat in the terminal, rendered with the model's chat template.

Each turn renders the whole history (an optional system prompt, then the user and assistant
messages) with the checkpoint's chat template and streams the reply (``tileinfer.SamplingParams``:
its length, stop strings, ...). When the next prompt and the reply's ``max_tokens`` would not fit
the KV capacity, the oldest turns are dropped (a notice says so). ``/reset`` clears the history
(the system prompt stays), ``/exit`` or end of input (Ctrl-D) ends the session with status 0,
Ctrl-C stops the reply being written (what was written stays in the history) without ending the
session, and a line that is not valid UTF-8 is skipped with a notice.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable, Mapping, Sequence

from tileinfer.errors import UsageError
from tileinfer.sampling_params import SamplingParams

HELP = "/reset clears the history, /exit or Ctrl-D quits, Ctrl-C stops a reply"
ROLES = ("system", "user", "assistant", "tool")
Messages = Sequence[Mapping[str, object]]  # [{"role": ..., "content": ...}, ...]


def check_messages(messages: object) -> list[dict]:
    """``messages`` as the chat template takes them: a non-empty list of mappings, each with a
    ``role`` of ``ROLES`` and a ``content`` string (other keys, e.g. ``tool_calls``, passed on);
    a UsageError naming the first bad one."""
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence) or not messages:
        raise UsageError(f"messages must be a non-empty list of {{'role', 'content'}} mappings, got "
                         f"{type(messages).__name__}")
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise UsageError(f"messages[{i}] must be a mapping with 'role' and 'content', got {type(message).__name__}")
        if message.get("role") not in ROLES:
            raise UsageError(f"messages[{i}]: role must be one of {', '.join(ROLES)}, got {message.get('role')!r}")
        if not isinstance(message.get("content"), str):
            raise UsageError(f"messages[{i}]: content must be a string, got {type(message.get('content')).__name__}")
    return [dict(message) for message in messages]


def check_tools(tools: object) -> list[dict] | None:
    """``tools`` as the chat template takes them: None, or a list of OpenAI's function tools
    (``{"type": "function", "function": {"name": str, ...}}``); a UsageError naming the first bad one."""
    if tools is None:
        return None
    if isinstance(tools, (str, bytes, Mapping)) or not isinstance(tools, Sequence):
        raise UsageError(f"tools must be a list of {{'type': 'function', 'function': {{...}}}} mappings, got "
                         f"{type(tools).__name__}")
    for i, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, Mapping) else None
        if not (isinstance(tool, Mapping) and tool.get("type") == "function" and isinstance(function, Mapping)
                and isinstance(function.get("name"), str) and function["name"]):
            raise UsageError(f"tools[{i}] must be {{'type': 'function', 'function': {{'name': str, 'description', "
                             f"'parameters'}}}}, got {tool!r}")
    return [dict(tool) for tool in tools]


def check_template_kwargs(kwargs: object) -> dict:
    """``chat_template_kwargs``: None or a mapping of variables other than those the chat itself sets."""
    if kwargs is None:
        return {}
    if not isinstance(kwargs, Mapping) or not all(isinstance(k, str) for k in kwargs):
        raise UsageError(f"chat_template_kwargs must be a mapping of names to values, got {type(kwargs).__name__}")
    reserved = sorted({"messages", "tools", "add_generation_prompt", "bos_token", "eos_token"} & set(kwargs))
    if reserved:
        raise UsageError(f"chat_template_kwargs may not set {', '.join(reserved)}")
    return dict(kwargs)


def is_conversation_batch(messages: object) -> bool:
    """Whether ``messages`` is a list of conversations rather than one conversation."""
    return (isinstance(messages, Sequence) and not isinstance(messages, (str, bytes)) and bool(messages)
            and all(isinstance(m, Sequence) and not isinstance(m, (str, bytes)) for m in messages))


class ChatSession:
    """The history of one conversation with ``engine`` and the turns that extend it."""

    def __init__(self, engine, params: SamplingParams | None = None, *, system: str | None = None,
                 notify: Callable[[str], None] = lambda line: None) -> None:
        if engine.tokenizer is None or not engine.tokenizer.chat_template:
            raise UsageError(f"chat needs a checkpoint with a tokenizer and a chat template ({engine.folder} has "
                             "none)")
        self.engine = engine
        self.system = [{"role": "system", "content": system}] if system else []
        self.turns: list[dict] = []  # user and assistant messages, oldest first
        params = params or SamplingParams()
        self.max_new_tokens = params.max_tokens or engine.config.max_new_tokens
        self.params = dataclasses.replace(params, max_tokens=self.max_new_tokens)
        self.notify = notify

    def reset(self) -> None:
        self.turns = []

    def prompt_ids(self, user: str) -> list[int] | None:
        """The token ids of the history and ``user``'s message, dropping the oldest turns until
        they and the reply fit the context; None (history kept) when the message alone does not."""
        engine = self.engine
        draft = engine.config.spec_k if engine.proposer is not None else 0
        budget = engine.capacity - self.max_new_tokens - draft
        turns = [*self.turns, {"role": "user", "content": user}]
        dropped = 0
        while True:
            text = engine.tokenizer.apply_chat_template([*self.system, *turns], add_generation_prompt=True)
            ids = engine.tokenizer.encode(text, add_special_tokens=False)
            if len(ids) <= budget:
                break
            if len(turns) == 1:
                self.notify(f"this message needs {len(ids)} tokens with the system prompt, and the reply "
                            f"{self.max_new_tokens} more: more than the context holds ({engine.capacity}); "
                            "shorten it or lower --max-new-tokens")
                return None
            turns = turns[2:] if len(turns) > 2 else turns[1:]  # the oldest user message and its reply
            dropped += 1
        if dropped:
            self.notify(f"dropped the {dropped} oldest turn{'s' if dropped > 1 else ''} to fit the context "
                        f"({engine.capacity} tokens)")
        self.turns = turns
        return ids

    def reply(self, user: str, write: Callable[[str], None]) -> str | None:
        """Stream the reply to ``user`` through ``write`` and keep it in the history; Ctrl-C
        (KeyboardInterrupt) stops it and keeps what was written. None if the message does not fit."""
        ids = self.prompt_ids(user)
        if ids is None:
            return None
        stream = self.engine.stream(ids, self.params)
        pieces: list[str] = []
        try:
            for chunk in stream:
                if chunk.text:
                    pieces.append(chunk.text)
                    write(chunk.text)
        except KeyboardInterrupt:
            self.notify("stopped")
        finally:
            stream.close()  # frees the engine for the next turn
        text = "".join(pieces)
        self.turns.append({"role": "assistant", "content": text})
        return text


def run(engine, params: SamplingParams | None = None, *, system: str | None = None) -> int:
    """The read-reply loop on standard input and output; returns the exit status (0)."""
    try:
        import readline  # noqa: F401 - line editing and history for input()
    except ImportError:
        pass
    if hasattr(sys.stdout, "reconfigure"):
        sys.stdout.reconfigure(errors="replace")  # a reply's text on any terminal

    def notify(line: str) -> None:
        print(f"[{line}]", file=sys.stderr, flush=True)

    def write(text: str) -> None:
        sys.stdout.write(text)
        sys.stdout.flush()

    session = ChatSession(engine, params, system=system, notify=notify)
    print(f"tileinfer chat with {engine.folder.name} ({HELP})", file=sys.stderr, flush=True)
    while True:
        try:
            line = input("> ")
        except EOFError:
            print(file=sys.stderr)
            return 0
        except KeyboardInterrupt:
            print(file=sys.stderr)
            notify("Ctrl-D or /exit quits")
            continue
        except UnicodeDecodeError as exc:
            notify(f"that line is not valid UTF-8 (byte {exc.object[exc.start]:#04x}): skipped")
            continue
        try:
            line.encode("utf-8")
        except UnicodeEncodeError as exc:  # undecodable bytes kept as surrogates (a C locale's stdin)
            notify(f"that line is not valid UTF-8 (at character {exc.start}): skipped")
            continue
        command = line.strip()
        if command in ("/exit", "/quit"):
            return 0
        if command == "/reset":
            session.reset()
            notify("history cleared")
            continue
        if command.startswith("/"):
            notify(f"unknown command {command.split()[0]}: {HELP}")
            continue
        if not command:
            continue
        session.reply(line, write)
        write("\n")
