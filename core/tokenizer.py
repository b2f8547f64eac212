"""Tokenizer: tokenizer.json through the `tokenizers` library, and the chat template of
tokenizer_config.json (or chat_template.jinja) rendered with jinja2 as transformers renders it."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer as HFTokenizer
from tokenizers.decoders import DecodeStream

from tileinfer.errors import CheckpointError, UsageError
from tileinfer.model_config import one_line, read_json


class Tokenizer:
    def __init__(self, tokenizer: HFTokenizer, chat_template: str | None, special: dict[str, str]) -> None:
        self._tok = tokenizer
        self.chat_template = chat_template
        self.special = special  # bos_token / eos_token strings, for templates that use them

    @classmethod
    def from_folder(cls, folder: Path) -> "Tokenizer":
        """tokenizer.json, and the chat template and special tokens of tokenizer_config.json (or
        chat_template.jinja); CheckpointError naming the file (and key) if one is unreadable."""
        path = folder / "tokenizer.json"
        try:
            tok = HFTokenizer.from_file(str(path))
        except Exception as exc:  # the tokenizers library raises a bare Exception
            raise CheckpointError(f"{path}: cannot load tokenizer: {one_line(exc)}") from None
        config: dict = {}
        config_path = folder / "tokenizer_config.json"
        if config_path.is_file():
            config = read_json(config_path)
            if not isinstance(config, dict):
                raise CheckpointError(f"{config_path}: expected a JSON object, got {type(config).__name__}")
        template = _chat_template(config.get("chat_template"), config_path)
        jinja_file = folder / "chat_template.jinja"
        if template is None and jinja_file.is_file():
            try:
                template = jinja_file.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as exc:
                raise CheckpointError(f"{jinja_file}: cannot read: {one_line(exc)}") from None
        special = {k: _token_text(config.get(k), k, config_path) for k in ("bos_token", "eos_token")}
        return cls(tok, template, special)

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    def vocab(self) -> dict[str, int]:
        """Every token's string and id, added tokens included."""
        return self._tok.get_vocab(with_added_tokens=True)

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        return self._tok.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: list[int], *, skip_special_tokens: bool = True) -> str:
        return self._tok.decode(ids, skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, messages: list[dict], *, add_generation_prompt: bool = True, **kwargs) -> str:
        """Render ``messages`` with the checkpoint's chat template (transformers' jinja conventions)."""
        if not self.chat_template:
            raise UsageError("this checkpoint has no chat template (tokenizer_config.json has no chat_template)")
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
        env.filters["tojson"] = lambda x, ensure_ascii=False, indent=None, separators=None, sort_keys=False: json.dumps(
            x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)
        env.globals["raise_exception"] = _raise_template_error
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        try:
            return env.from_string(self.chat_template).render(
                messages=messages, add_generation_prompt=add_generation_prompt, **self.special, **kwargs)
        except jinja2.TemplateError as exc:
            raise UsageError(f"chat template failed: {exc}") from None

    def stream(self, *, skip_special_tokens: bool = True) -> "StreamDecoder":
        """A decoder of a generation's text, piece by piece as its tokens come."""
        return StreamDecoder(self, skip_special_tokens=skip_special_tokens)


class StreamDecoder:
    """Turns a growing list of token ids into text pieces with tokenizers' ``DecodeStream`` (which
    holds back an incomplete UTF-8 tail and keeps the left context a decoder needs, such as
    SentencePiece's leading space; a token costs the same however long the generation is). The
    pieces and :meth:`flush` add up to ``tokenizer.decode(ids, skip_special_tokens=...)``."""

    def __init__(self, tokenizer: Tokenizer, *, skip_special_tokens: bool = True) -> None:
        self.tokenizer, self.skip_special_tokens = tokenizer, skip_special_tokens
        self._stream = DecodeStream(skip_special_tokens=skip_special_tokens)
        self.ids: list[int] = []
        self.emitted = 0  # characters emitted so far

    def push(self, token: int) -> str:
        self.ids.append(token)
        piece = self._stream.step(self.tokenizer._tok, token) or ""
        self.emitted += len(piece)
        return piece

    def flush(self) -> str:
        """What is left at the end, an incomplete character included (as its replacement): the
        whole decode past the pieces emitted (one decode of every id, once per generation)."""
        piece = self.tokenizer.decode(self.ids, skip_special_tokens=self.skip_special_tokens)[self.emitted:]
        self.emitted += len(piece)
        return piece


def _chat_template(value, source: Path) -> str | None:
    """chat_template of tokenizer_config.json: a string, or a list of named templates (the one named
    ``default`` is used), or absent."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(t, dict) and isinstance(t.get("name"), str)
                                       and isinstance(t.get("template"), str) for t in value):
        return next((t["template"] for t in value if t["name"] == "default"), None)
    raise CheckpointError(f"{source}: chat_template must be a string or a list of {{\"name\", \"template\"}} "
                          f"objects, got {type(value).__name__}")


def _token_text(value, key: str, source: Path) -> str:
    """bos_token / eos_token: a string, an AddedToken serialized as a dict, or null."""
    if isinstance(value, dict):  # AddedToken serialized as a dict
        value = value.get("content", "")
    if value is None or isinstance(value, str):
        return value or ""
    raise CheckpointError(f"{source}: {key} must be a string or an object with a string content, "
                          f"got {type(value).__name__}")


def _raise_template_error(message: str):
    raise jinja2.TemplateError(message)
