"""Prompts: what a caller may pass and how it becomes token ids, checked before any step runs.

A prompt is text (a str, valid UTF-8; with ``chat``, wrapped in the checkpoint's chat template) or
token ids (a sequence or 1-D tensor of ints in the vocabulary). ``check_prompt`` checks one from
the resolved config's checkpoint (config.json and the tokenizer) alone, so that the command line
rejects a bad prompt before any weight loads; the engine runs the same checks on each call.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from tileinfer.errors import UsageError
from tileinfer.tokenizer import Tokenizer


def _ids_of(prompt: object) -> list[int] | None:
    """Token ids from a sequence or 1-D tensor of integers; None for a str; UsageError otherwise."""
    if isinstance(prompt, str):
        return None
    if isinstance(prompt, (bytes, bytearray)):
        raise UsageError(f"the prompt is {type(prompt).__name__}: pass text as a str (decoded), or token ids as a "
                         "list of ints")
    if isinstance(prompt, torch.Tensor):
        if prompt.dim() != 1 or prompt.dtype.is_floating_point or prompt.dtype.is_complex or prompt.dtype == torch.bool:
            raise UsageError(f"a tensor prompt must be 1-D integer token ids, got shape {tuple(prompt.shape)} "
                             f"{prompt.dtype}")
        return prompt.tolist()
    if isinstance(prompt, np.ndarray):
        if prompt.ndim != 1 or not np.issubdtype(prompt.dtype, np.integer):
            raise UsageError(f"an array prompt must be 1-D integer token ids, got shape {prompt.shape} {prompt.dtype}")
        return prompt.tolist()
    if not isinstance(prompt, Sequence):
        raise UsageError(f"the prompt must be a str or a sequence of int token ids, got {type(prompt).__name__}")
    for i, token in enumerate(prompt):
        if not isinstance(token, numbers.Integral) or isinstance(token, bool):
            hint = " (pass text as one str)" if isinstance(token, str) else ""
            raise UsageError(f"token ids must be ints, got {type(token).__name__} {token!r} at index {i}{hint}")
    return [int(t) for t in prompt]


def check_flag(name: str, value: object) -> None:
    if not isinstance(value, bool):
        raise UsageError(f"{name} must be True or False, got {type(value).__name__} {value!r}")


def max_new_tokens_of(value: object, default: int) -> int:
    if value is None:
        return default
    if not isinstance(value, numbers.Integral) or isinstance(value, bool):
        raise UsageError(f"max_new_tokens must be an int, got {type(value).__name__} {value!r}")
    if value < 1:
        raise UsageError(f"max_new_tokens must be >= 1, got {value}")
    return int(value)


def _check_text(text: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise UsageError(f"the prompt is not valid UTF-8 (undecodable byte at character {exc.start})") from None


def check_ids(ids: list[int], max_new: int, *, vocab: int, capacity: int, draft: int, max_positions: int) -> None:
    """The prompt fits the vocabulary and, with ``max_new`` tokens and ``draft`` speculative ones,
    the KV capacity (UsageError naming the limit otherwise)."""
    if not ids:
        raise UsageError("the prompt is empty")
    bad = [t for t in ids if not 0 <= t < vocab]
    if bad:
        raise UsageError(f"token id {bad[0]} is outside the vocabulary [0, {vocab})")
    need = len(ids) + max_new + draft
    if need > capacity:
        limit = "the model's context" if capacity == max_positions else "kv_capacity"
        raise UsageError(f"the prompt ({len(ids)} tokens) + max_new_tokens ({max_new})"
                         + (f" + spec_k ({draft})" if draft else "")
                         + f" needs {need} positions, more than {limit} ({capacity})")


def check_prompt(resolved, prompt: str | Sequence[int], *, chat: bool = False,
                 max_new_tokens: int | None = None) -> list[int]:
    """Everything about a prompt that needs no weights, checked from ``resolved`` (a
    ``ResolvedConfig``) and its checkpoint's config and tokenizer alone (so a bad prompt fails
    before a model loads): its token ids. The tokenizer built here is the one the engine uses."""
    config, checkpoint = resolved.config, resolved.checkpoint
    mc = checkpoint.config
    ids = prompt_ids(prompt, chat, checkpoint.tokenizer, checkpoint.folder)
    capacity = min(config.kv_capacity, mc.max_positions)
    check_ids(ids, max_new_tokens_of(max_new_tokens, config.max_new_tokens), vocab=mc.vocab_size, capacity=capacity,
              draft=config.spec_k if config.proposer != "none" else 0, max_positions=mc.max_positions)
    return ids


def prompt_ids(prompt: str | Sequence[int], chat: bool, tokenizer: Tokenizer | None, folder: Path) -> list[int]:
    """The token ids of ``prompt``: text (``chat``: wrapped in the chat template) through the
    tokenizer, or token ids as given (a sequence or 1-D tensor of ints); UsageError otherwise."""
    check_flag("chat", chat)
    ids = _ids_of(prompt)
    if ids is not None:
        if chat:
            raise UsageError("chat=True needs a text prompt, not token ids")
        return ids
    _check_text(prompt)
    if tokenizer is None:
        raise UsageError(f"{folder} has no tokenizer.json: pass token ids instead of text")
    if chat:
        text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}])
        return tokenizer.encode(text, add_special_tokens=False)
    return tokenizer.encode(prompt)
