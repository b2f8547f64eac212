"""Verification of a draft against the target's logits: greedy prefix match, and the p/q rule.

The target ran ``[last, d_1 .. d_k]`` in one step, so row ``i`` of its logits is the distribution
of the token after ``d_i`` (row 0: after ``last``). Both rules return the tokens to commit: the
accepted drafts and one more token from the target (a correction or the bonus), which is -1 when
the logits it would come from are not finite.
"""

from __future__ import annotations

import torch

from tileinfer.interfaces import Sampler


def finite_or(tokens: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """``tokens`` (one per row of ``logits``), -1 where the row's logits are not all finite: on
    the device, so that the check costs no host sync of its own."""
    return torch.where(torch.isfinite(logits).all(-1), tokens, -1)


def verify_greedy(draft: list[int], logits: torch.Tensor, sampler: Sampler | None = None) -> list[int]:
    """Keep the longest prefix of ``draft`` equal to the target's greedy tokens (the argmax, or
    ``sampler.sample``'s, which may apply penalties from the history), then the target's token (-1
    for a row whose logits are not finite: it rejects any draft and the decoder stops there)."""
    greedy = sampler.sample(logits).tokens if sampler is not None else logits.argmax(-1)
    target = finite_or(greedy, logits).tolist()
    accepted = 0
    while accepted < len(draft) and draft[accepted] == target[accepted]:
        accepted += 1
    return draft[:accepted] + [target[accepted]]


def verify_sampled(draft: list[int], draft_probs: torch.Tensor | None, logits: torch.Tensor,
                   sampler: Sampler, *, cut_q: torch.Tensor | None = None) -> list[int]:
    """Speculative sampling (Leviathan et al. 2023): accept ``d_i`` with probability
    ``min(1, p_i(d_i) / q_i(d_i))``; at the first rejection draw from ``max(0, p_i - q_i)``
    normalized and stop; if all are accepted draw a bonus token from ``p_k``. ``draft_probs`` is
    ``q`` (``[k, V]``); None means the drafts were chosen deterministically (one-hot ``q``).
    ``cut_q`` (``[V]``): the drafter drew a token ``d_{k+1}`` from it that was cut before the step
    (a grammar rejects it, so ``p_k`` of it is 0 and it would have been rejected): the last token
    is then drawn from ``max(0, p_k - cut_q)`` normalized instead of ``p_k``.
    The committed tokens are distributed exactly as tokens sampled from the target one by one."""
    k = len(draft)
    if not bool(torch.isfinite(logits).all()):
        return [-1]
    p = sampler.probs(logits)  # [k + 1, V]
    if k == 0:
        return [int(sampler.draw(_residual(p[0], cut_q)[None]))]
    tokens = torch.tensor(draft, device=p.device)
    if draft_probs is None:
        q = torch.nn.functional.one_hot(tokens, p.shape[-1]).to(p.dtype)
    else:
        q = draft_probs.to(p.dtype)
    rows = torch.arange(k, device=p.device)
    ratio = p[rows, tokens] / q[rows, tokens]
    accept = (sampler.uniform(k) < ratio).tolist()
    accepted = next((i for i, ok in enumerate(accept) if not ok), k)
    if accepted < k:
        residual = (p[accepted] - q[accepted]).clamp(min=0)
        extra = sampler.draw((residual / residual.sum())[None])
    else:
        extra = sampler.draw(_residual(p[k], cut_q)[None])
    return draft[:accepted] + [int(extra)]


def _residual(p: torch.Tensor, q: torch.Tensor | None) -> torch.Tensor:
    """``max(0, p - q)`` normalized (``p`` where ``q`` is None or covers all of ``p``)."""
    if q is None:
        return p
    residual = (p - q.to(p.dtype)).clamp(min=0)
    total = residual.sum()
    return residual / total if bool(total > 0) else p


class DraftLength:
    """How many tokens to draft at each step: ``spec_k`` always (``adaptive=False``), or chosen from
    the last step's acceptance (``adaptive=True``): two more after a step that accepted its whole
    draft, one fewer after a step that rejected part of it, between 1 and ``spec_k`` (the schedule
    transformers' assisted generation calls "heuristic"). It starts at ``spec_k`` each generation."""

    def __init__(self, spec_k: int, adaptive: bool = False) -> None:
        self.spec_k, self.adaptive = spec_k, adaptive
        self.k = spec_k

    def reset(self) -> None:
        self.k = self.spec_k

    def update(self, drafted: int, accepted: int) -> None:
        """After a verify step of ``drafted`` draft tokens, ``accepted`` of them kept."""
        if not self.adaptive or drafted == 0:
            return
        self.k = min(self.spec_k, self.k + 2) if accepted == drafted else max(1, self.k - 1)
