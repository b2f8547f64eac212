"""Where a generation stops, and the text it shows: one implementation for the Python API, the
command line and the server.

``Completion`` takes a generation's tokens as the decoder commits them and returns what the caller
gets: the tokens up to the first stop (an EOS unless ``ignore_eos``, a token of
``stop_token_ids``, or a stop string completed by that token), and their text, piece by piece
(``tileinfer.tokenizer.StreamDecoder``). Text that could be the start of a stop string is held back
until a later token tells, so a stream never shows part of a stop string that then completes. The
first ``min_tokens`` tokens never end the generation: ``StopTokenBan`` keeps the stop tokens from
being sampled there (vLLM's min_tokens), and a stop string completed there is not a stop.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

import torch

from tileinfer.interfaces import Sampler, TokenHistory
from tileinfer.sampler_stage import SamplerStage
from tileinfer.sampling_params import SamplingParams
from tileinfer.tokenizer import Tokenizer


class StopStrings:
    """Finds the first of ``stops`` in text given piece by piece, matched across the pieces."""

    def __init__(self, stops: Sequence[str], *, include: bool = False) -> None:
        self.stops, self.include = tuple(stops), include
        self.held = ""  # the end of the text so far that is the start of a stop string

    def push(self, text: str, *, armed: bool = True) -> tuple[str, str | None]:
        """The text that may be shown now, and the stop string found (None: none). After a find the
        text ends right before the stop string (``include``: right after it) and nothing more may be
        pushed. ``armed`` False: a stop string found is not a stop (text before ``min_tokens``)."""
        buffer = self.held + text
        if not self.stops:
            return buffer, None
        if armed:
            hits = [(at, len(stop), stop) for stop in self.stops if (at := buffer.find(stop)) >= 0]
            if hits:
                at, length, stop = min(hits)
                self.held = ""
                return buffer[:at + length if self.include else at], stop
        keep = max((n for stop in self.stops for n in range(min(len(stop) - 1, len(buffer)), 0, -1)
                    if buffer.endswith(stop[:n])), default=0)
        self.held = buffer[len(buffer) - keep:] if keep else ""
        return buffer[:len(buffer) - keep], None

    def flush(self) -> str:
        """What was held back, at the end of a generation that no stop string ended."""
        held, self.held = self.held, ""
        return held


class Completion:
    """One generation's output as the caller sees it, built token by token.

    ``eos``: the checkpoint's EOS tokens (ignored with ``params.ignore_eos``); ``tokenizer``: None
    for a checkpoint without one (no text; stop strings are then refused by the engine). After
    ``take`` returns ``done`` True, ``finish_reason`` is ``"eos"`` (an EOS token), ``"stop"`` (a
    stop string or a token of ``stop_token_ids``; ``stop_reason`` says which) and the caller stops
    feeding it; a generation the decoder ended is ``"length"``."""

    def __init__(self, params: SamplingParams, eos: Collection[int], tokenizer: Tokenizer | None) -> None:
        self.eos = frozenset(() if params.ignore_eos else eos)
        self.stop_ids = frozenset(params.stop_token_ids)
        self.min_tokens, self.include = params.min_tokens, params.include_stop_str_in_output
        self.text = tokenizer.stream(skip_special_tokens=params.skip_special_tokens) if tokenizer else None
        self.stops = StopStrings(params.stop, include=self.include)
        self.count = 0  # tokens taken
        self.finish_reason: str | None = None
        self.stop_reason: str | int | None = None

    @property
    def stop_tokens(self) -> frozenset[int]:
        """The tokens that end the generation once ``min_tokens`` were generated."""
        return self.eos | self.stop_ids

    def take(self, tokens: Sequence[int]) -> tuple[list[int], str | None, bool]:
        """The ``tokens`` kept (up to the stop), the text that may be shown now (None without a
        tokenizer), and whether the generation is over."""
        kept: list[int] = []
        pieces: list[str] = []
        for token in tokens:
            kept.append(token)
            armed = self.count >= self.min_tokens
            self.count += 1
            if armed and token in self.stop_tokens:
                self.finish_reason = "eos" if token in self.eos else "stop"
                self.stop_reason = None if token in self.eos else token
                if self.include and self.text is not None:
                    pieces.append(self.stops.push(self.text.push(token), armed=False)[0])
                break
            if self.text is None:
                continue
            shown, stop = self.stops.push(self.text.push(token), armed=armed)
            pieces.append(shown)
            if stop is not None:
                self.finish_reason, self.stop_reason = "stop", stop
                break
        return kept, "".join(pieces) if self.text is not None else None, self.finish_reason is not None

    def finish(self) -> str | None:
        """The text left at the end (an incomplete character as its replacement, text held back
        for a stop string that never came); sets ``finish_reason`` to ``"length"`` if no stop
        ended the generation."""
        if self.text is None:
            self.finish_reason = self.finish_reason or "length"
            return None
        if self.finish_reason == "stop" and isinstance(self.stop_reason, str):
            return ""
        shown, stop = self.stops.push(self.text.flush(), armed=self.count > self.min_tokens)
        if stop is not None:
            self.finish_reason, self.stop_reason = "stop", stop
            return shown
        self.finish_reason = self.finish_reason or "length"
        return shown + self.stops.flush()


class StopTokenBan(SamplerStage):
    """``sampler`` (the engine's) with a generation's stop tokens banned, their logits set to
    ``-inf``, at the positions before ``min_tokens`` (``ban``); the rest as ``sampler`` does it. A
    row where nothing but a stop token is left (a structured output that can only end there) is not
    banned: the generation ends before ``min_tokens`` rather than on a token nothing allows.

    The row of each logit is placed by the token history (row ``i`` follows ``history.length + i``
    tokens), which the decoder keeps while a ban is set (``uses_history``): exact for plain,
    pipelined and verify steps alike. A caller with no history (a proposer's draft) is not banned.
    """

    def __init__(self, sampler: Sampler) -> None:  # noqa: D107 - no options of its own: the sampler's
        super().__init__(sampler)
        self.banned = torch.zeros(0, dtype=torch.int64, device=sampler.device)
        self.until = 0

    def ban(self, tokens: Collection[int], until: int) -> None:
        """Ban ``tokens`` from the first ``until`` new tokens of the next generation (0: none)."""
        self.until = until if tokens else 0
        self.banned = torch.tensor(sorted(tokens), dtype=torch.int64, device=self.sampler.device)

    @property
    def uses_history(self) -> bool:
        return self.sampler.uses_history or self.until > 0

    def adjust(self, logits: torch.Tensor, history: TokenHistory | None) -> torch.Tensor:
        """The logits with the ban applied to the rows before ``min_tokens`` (none without a history)."""
        if not self.until or history is None:
            return logits
        rows = min(logits.shape[0], self.until - (history.length - history.prompt_len))
        if rows <= 0:
            return logits
        banned = logits.clone()
        banned[:rows, self.banned] = float("-inf")
        # a row the ban would leave without a token (a grammar that can only end there) keeps its stop tokens
        empty = torch.isneginf(banned[:rows]).all(-1, keepdim=True)
        banned[:rows] = torch.where(empty, logits[:rows], banned[:rows])
        return banned


__all__ = ["Completion", "StopStrings", "StopTokenBan"]
