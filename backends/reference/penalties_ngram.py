"""Reference no-repeat n-grams (Hugging Face's ``no_repeat_ngram_size``): a token that would
complete an n-gram already in the sequence (prompt included) gets a logit of -inf."""

from __future__ import annotations

import torch


def ban_repeated_ngrams(logits: torch.Tensor, tokens: torch.Tensor, length: int, n: int) -> torch.Tensor:
    """``logits`` ``[T, V]`` float32 (a new tensor) with, in row ``i``, every token ``t`` at -inf
    such that ``tokens[:length + i]`` ends with ``n - 1`` tokens that also occur earlier followed by
    ``t`` (with ``n = 1``: every token of the sequence). Rows whose sequence is shorter than ``n``
    are left as they are. On the device, one comparison of all windows per row: no host sync."""
    assert n >= 1
    logits = logits.float().clone()
    vocab = logits.shape[-1]
    for i in range(logits.shape[0]):
        end = length + i
        if end < n:
            continue
        windows = tokens[:end].unfold(0, n, 1)  # [end - n + 1, n]
        match = (windows[:, :-1] == tokens[end - n + 1:end]).all(-1)
        hits = torch.zeros(vocab, dtype=torch.float32, device=logits.device)
        hits.scatter_add_(0, windows[:, -1], match.float())
        logits[i] = logits[i].masked_fill(hits > 0, float("-inf"))
    return logits
