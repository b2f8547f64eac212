"""Structured outputs: what a generation's text must match, and its grammar compiled for a tokenizer.

``StructuredOutput`` (``tileinfer.SamplingParams.structured``) names one constraint: a JSON schema
(``json``), any JSON object (``json_object``), a regular expression (``regex``), one of a list of
strings (``choice``) or an EBNF grammar (``grammar``, llama.cpp's GBNF as xgrammar reads it). With
``after`` (e.g. ``"</think>"``) the constraint starts once that text has appeared in the output.

The grammar engine is xgrammar (``pip install 'tileinfer[structured]'``; why not llguidance:
docs/performance-log.md). ``GrammarCompiler`` compiles a constraint against a checkpoint's
tokenizer (the lm_head's vocabulary size; special tokens are never allowed inside the constraint)
and keeps the last ``CACHE_SIZE`` compiled grammars by ``StructuredOutput.key``; its ``matcher``
makes one ``tileinfer.grammar_mask.Matcher`` per generation. A constraint that does not compile is
a ``StructuredOutputError`` (a UsageError) naming the field.
"""

from __future__ import annotations

import json
import re
import warnings
from collections import OrderedDict
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tileinfer.errors import UsageError

if TYPE_CHECKING:
    from tileinfer.grammar_mask import Matcher
    from tileinfer.tokenizer import Tokenizer

KINDS = ("json", "json_object", "regex", "choice", "grammar")
CACHE_SIZE = 64  # compiled grammars kept per compiler
MAX_WHITESPACE = 16  # whitespace characters between two JSON tokens (no endless runs of blanks)


class StructuredOutputError(UsageError):
    """A constraint that is not valid or does not compile; ``field`` is the StructuredOutput field."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"structured output {field}: {message}")
        self.field = field


@dataclass(frozen=True)
class StructuredOutput:
    """Exactly one of: ``json``, a JSON schema (a dict, or its JSON text); ``json_object=True``,
    any JSON object; ``regex``, a regular expression the whole text matches; ``choice``, a list of
    strings the text is one of; ``grammar``, an EBNF grammar whose rule ``root`` the text matches.
    ``after``: a text marker after which the constraint starts (None: from the first token).

    Checked when made: one kind set, a schema that is a JSON object, a regex Python compiles,
    non-empty choice strings, a non-empty grammar and marker; otherwise a ``StructuredOutputError``
    naming the field. Whether the engine can compile it is checked when a generation asks for it."""

    json: dict[str, Any] | str | None = None
    json_object: bool = False
    regex: str | None = None
    choice: Sequence[str] | None = None
    grammar: str | None = None
    after: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.json_object, bool):
            raise StructuredOutputError("json_object", f"must be True or False, got {self.json_object!r}")
        given = [kind for kind in KINDS if getattr(self, kind) not in (None, False)]
        if len(given) != 1:
            raise StructuredOutputError(given[1] if given else "json",
                                        f"give exactly one of {', '.join(KINDS)}; got {', '.join(given) or 'none'}")
        if self.json is not None:
            object.__setattr__(self, "json", _schema(self.json))
        if self.regex is not None:
            _text("regex", self.regex)
            try:
                re.compile(self.regex)
            except re.error as exc:
                raise StructuredOutputError("regex", f"not a valid regular expression: {exc}") from None
        if self.choice is not None:
            if isinstance(self.choice, str) or not isinstance(self.choice, Sequence) or not self.choice \
                    or not all(isinstance(c, str) and c for c in self.choice):
                raise StructuredOutputError("choice", f"must be a non-empty list of non-empty strings, "
                                            f"got {self.choice!r}")
            object.__setattr__(self, "choice", tuple(self.choice))
        if self.grammar is not None:
            _text("grammar", self.grammar)
        if self.after is not None:
            _text("after", self.after)

    @property
    def kind(self) -> str:
        """The field that holds the constraint."""
        return next(kind for kind in KINDS if getattr(self, kind) not in (None, False))

    @property
    def key(self) -> tuple[str, str]:
        """What a compiled grammar is cached by: the kind and its canonical text (``after`` apart)."""
        value = getattr(self, self.kind)
        if self.kind == "json":
            return "json", json.dumps(value, sort_keys=True, separators=(",", ":"))
        if self.kind == "choice":
            return "choice", json.dumps(list(value))
        return self.kind, "" if value is True else value

    def __hash__(self) -> int:
        return hash((self.key, self.after))

    def ebnf(self) -> str | None:
        """``choice`` as an EBNF grammar (each string a quoted literal); None for the other kinds."""
        if self.choice is None:
            return None
        return "root ::= " + " | ".join(json.dumps(c) for c in self.choice)


def _text(field: str, value: object) -> None:
    if not isinstance(value, str) or not value:
        raise StructuredOutputError(field, f"must be a non-empty string, got {value!r}")


def _schema(value: object) -> dict[str, Any]:
    """A JSON schema: a dict, or JSON text that decodes to an object."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as exc:
            raise StructuredOutputError("json", f"not valid JSON text: {exc}") from None
    if not isinstance(value, dict):
        raise StructuredOutputError("json", f"a JSON schema must be a JSON object, got {type(value).__name__}")
    try:
        json.dumps(value)
    except (TypeError, ValueError) as exc:
        raise StructuredOutputError("json", f"not JSON-serializable: {exc}") from None
    return value


def tokenizer_info(tokenizer: "Tokenizer", vocab_size: int, stop_token_ids: Collection[int], *,
                   special: bool = False):
    """xgrammar's ``TokenizerInfo`` of ``tokenizer`` for an lm_head of ``vocab_size`` rows: its
    vocabulary type and prefix space as xgrammar detects them (``from_huggingface``), special
    tokens (and ids past the tokenizer's) left empty, so that no constraint ever allows them, unless
    ``special`` (their text kept: what the ``after`` marker is looked for in)."""
    import xgrammar as xgr
    from transformers import PreTrainedTokenizerFast

    with warnings.catch_warnings():  # a checkpoint without an EOS: no stop tokens to detect, none needed here
        warnings.simplefilter("ignore", UserWarning)
        detected = xgr.TokenizerInfo.from_huggingface(PreTrainedTokenizerFast(tokenizer_object=tokenizer._tok),
                                                      vocab_size=vocab_size, stop_token_ids=list(stop_token_ids) or None)
    if special:
        return detected
    added = tokenizer._tok.get_added_tokens_decoder()
    vocab = [""] * vocab_size
    for text, index in tokenizer.vocab().items():
        if index < vocab_size and not (index in added and added[index].special):
            vocab[index] = text
    return xgr.TokenizerInfo(vocab, detected.vocab_type, vocab_size=vocab_size,
                             stop_token_ids=list(stop_token_ids) or None, add_prefix_space=detected.add_prefix_space)


class GrammarCompiler:
    """Compiles ``StructuredOutput``s for ``tokenizer`` and an lm_head of ``vocab_size`` rows
    (``eos``: the checkpoint's EOS tokens, the matchers' default stop tokens). Building one
    imports xgrammar (a UsageError saying how to install it when it is missing)."""

    def __init__(self, tokenizer: "Tokenizer", vocab_size: int, eos: Collection[int]) -> None:
        try:
            import xgrammar as xgr
        except ImportError:
            raise UsageError("structured outputs need xgrammar: pip install 'tileinfer[structured]'") from None
        self.tokenizer, self.vocab_size, self.eos = tokenizer, vocab_size, tuple(eos)
        self.info = tokenizer_info(tokenizer, vocab_size, self.eos)
        self._compiler = xgr.GrammarCompiler(self.info, cache_enabled=False)
        self._cache: OrderedDict[tuple[str, str], Any] = OrderedDict()
        self._token_bytes: list[bytes] | None = None

    def compile(self, structured: StructuredOutput):
        """The xgrammar ``CompiledGrammar`` of ``structured`` (cached by its key);
        ``StructuredOutputError`` naming the field when xgrammar refuses it."""
        key = structured.key
        if key in self._cache:
            self._cache.move_to_end(key)
            return self._cache[key]
        kind, compiler = structured.kind, self._compiler
        try:
            if kind in ("json", "json_object"):
                schema = key[1] if kind == "json" else '{"type": "object"}'
                compiled = compiler.compile_json_schema(schema, any_whitespace=True, max_whitespace_cnt=MAX_WHITESPACE)
            elif kind == "regex":
                compiled = compiler.compile_regex(structured.regex)
            else:
                compiled = compiler.compile_grammar(structured.ebnf() or structured.grammar)
        except (RuntimeError, ValueError, TypeError) as exc:
            raise StructuredOutputError(kind, _engine_message(exc)) from None
        self._cache[key] = compiled
        if len(self._cache) > CACHE_SIZE:
            self._cache.popitem(last=False)
        return compiled

    def token_bytes(self) -> list[bytes]:
        """Each token's bytes, special tokens' text included (what ``after`` is looked for in)."""
        if self._token_bytes is None:
            self._token_bytes = list(tokenizer_info(self.tokenizer, self.vocab_size, self.eos,
                                                    special=True).decoded_vocab)
        return self._token_bytes

    def matcher(self, structured: StructuredOutput, stop_tokens: Collection[int]) -> "Matcher":
        """A matcher of ``structured`` for one generation that ends at ``stop_tokens`` (allowed
        only where the constraint is complete; none: a complete constraint ends the generation)."""
        from tileinfer.grammar_mask import Matcher

        return Matcher(self.compile(structured), stop_tokens, self.vocab_size, after=structured.after,
                       token_bytes=self.token_bytes() if structured.after else None)


def _engine_message(exc: Exception) -> str:
    """xgrammar's message without its C++ source location (``[time] file.cc:line: message``)."""
    text = " ".join(str(exc).split())
    return re.sub(r"^\[[\d:]+\] \S+:\d+: ", "", text) or type(exc).__name__


__all__ = ["CACHE_SIZE", "GrammarCompiler", "KINDS", "StructuredOutput", "StructuredOutputError", "tokenizer_info"]
