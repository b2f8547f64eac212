"""Reference penalties on float32 logits from the token history: OpenAI's presence and frequency
penalties on the generated tokens, and the repetition penalty of Hugging Face and vLLM on the
prompt and the generated tokens. No Triton twin: a few broadcasts per step, only when a penalty is on."""

from __future__ import annotations

import torch


def generated_counts(tokens: torch.Tensor, prompt_len: int, length: int, rows: int, vocab: int) -> torch.Tensor:
    """``[rows, vocab]`` float32: how often each token occurs in ``tokens[prompt_len:length + i]``
    for row ``i`` (row ``i`` follows ``tokens[:length + i]``; ``tokens[length:]`` are the drafts of a
    verify step). Scatters on the device: no host sync."""
    base = torch.zeros(vocab, dtype=torch.float32, device=tokens.device)
    generated = tokens[prompt_len:length]
    base.scatter_add_(0, generated, torch.ones_like(generated, dtype=torch.float32))
    if rows == 1:
        return base[None]
    drafts = torch.nn.functional.one_hot(tokens[length:length + rows - 1], vocab).float().cumsum(0)
    return torch.cat([base[None], base + drafts])


def penalize(logits: torch.Tensor, tokens: torch.Tensor, prompt_len: int, length: int, *, presence: float = 0.0,
             frequency: float = 0.0, repetition: float = 1.0) -> torch.Tensor:
    """``logits`` ``[T, V]`` with the penalties applied, float32 (a new tensor).

    Row ``i`` follows ``tokens[:length + i]`` (int64, on the logits' device), of which the first
    ``prompt_len`` are the prompt. ``repetition`` (> 0, 1 is off): a logit of a token that occurs in
    the row's sequence, prompt included, is divided by it when positive and multiplied by it when
    not. Then, with ``c`` the token's count among the generated tokens alone, the logit minus
    ``frequency * c + presence * (c > 0)``."""
    logits = logits.float()
    rows, vocab = logits.shape
    counts = generated_counts(tokens, prompt_len, length, rows, vocab)
    if repetition != 1.0:
        seen = counts > 0
        if prompt_len:
            prompt = torch.zeros(vocab, dtype=torch.float32, device=logits.device)
            prompt.scatter_add_(0, tokens[:prompt_len], torch.ones(prompt_len, device=logits.device))
            seen = seen | (prompt > 0)
        logits = torch.where(seen, torch.where(logits > 0, logits / repetition, logits * repetition), logits)
    if presence or frequency:
        logits = logits - frequency * counts - presence * (counts > 0).float()
    return logits
