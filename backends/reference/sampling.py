"""Reference sampling distribution: temperature, then top-k, top-p and min-p, over float32 logits."""

from __future__ import annotations

import torch


def sampling_probs(
    logits: torch.Tensor, temperature: float, top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0
) -> torch.Tensor:
    """The distribution to draw from, ``[T, V]`` float32, rows summing to 1.

    ``temperature == 0`` is greedy: one-hot at the argmax. Otherwise softmax of ``logits /
    temperature`` restricted to the ``top_k`` largest, then to the smallest set whose mass reaches
    ``top_p``, then to tokens with at least ``min_p`` times the top probability; renormalized.

    Any finite ``temperature > 0`` gives a distribution: the row max is subtracted before the
    division, so the largest logit scales to exactly 0 (never ``0 / 0`` when a temperature below
    float32's range, e.g. 1e-300, rounds to 0; the others overflow to -inf: the greedy limit, ties
    shared), and a huge temperature (1e30, or one beyond float32 that rounds to inf) flattens the
    row towards uniform over the finite logits.
    """
    logits = logits.float()
    if temperature == 0:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
    if 0 < top_k < logits.shape[-1]:  # before the division, which keeps the order but may round ties together
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    shifted = logits - logits.amax(-1, keepdim=True)  # <= 0; 0 at the max; -inf stays -inf
    scaled = shifted / temperature
    # the two quotients float32 cannot form: 0 / 0 (temperature rounded to 0) and -inf / inf
    logits = torch.where(shifted == 0, 0.0, torch.where(shifted == float("-inf"), float("-inf"), scaled))
    probs = torch.softmax(logits, dim=-1)
    if top_p < 1.0:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        before = sorted_probs.cumsum(-1) - sorted_probs  # mass of the tokens ranked above
        drop_sorted = before >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        probs = probs.masked_fill(drop, 0.0)
    if min_p > 0:
        probs = probs.masked_fill(probs < min_p * probs.amax(-1, keepdim=True), 0.0)
    return probs / probs.sum(-1, keepdim=True)
