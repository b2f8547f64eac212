"""Prompt log-probabilities: each prompt token's logprob under the model and its position's top N,
computed in the prefill chunk by chunk.

A generation that asks for them (``SamplingParams.prompt_logprobs``) prefills its prompt in chunks
of at most ``SCORING_CHUNK`` tokens, every row's logits computed (``ForwardPass`` with neither
``last_only`` nor ``rows``) and reduced by ``PromptScores.add`` to the chosen token's logprob and
the top N before the next chunk runs, so the memory they take is bounded by one chunk's float32
logits (512 x vocabulary x 4 bytes: 311 MB at Qwen3's 151,936 tokens) whatever the prompt's length,
plus ``1 + N`` numbers per prompt token. Row ``i`` of a chunk at ``first`` predicts the token at
``first + i + 1``; the first prompt token has no logprob (None), as in vLLM.

The values are ``log_softmax`` of the raw float32 logits (what ``logprobs`` gives for the generated
tokens, ``tileinfer.sampling_step``): logit minus the row's logsumexp, taken ``ROWS`` rows at a time
so that no second copy of a chunk's logits is made.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from tileinfer.sampling_step import TokenLogprob

SCORING_CHUNK = 512  # prompt tokens per prefill step while scoring (their float32 logits: 512 x vocab x 4 bytes)
ROWS = 64  # logits rows reduced at a time (logsumexp's exp is one temporary of ROWS x vocab)


class PromptScores:
    """The prompt ``ids``' logprobs with ``top`` alternatives per position (0 to 20), filled by the
    chunks of a prefill (``add``) and read once it is done (``results``)."""

    def __init__(self, ids: Sequence[int], top: int, device: torch.device) -> None:
        self.ids = torch.tensor(list(ids), dtype=torch.int64, device=device)
        self.top = top
        self.chosen: list[torch.Tensor] = []  # [rows] float32 per piece, on the device
        self.top_values: list[torch.Tensor] = []  # [rows, top]
        self.top_ids: list[torch.Tensor] = []
        self.scored = 0  # prompt positions whose next token was scored

    def add(self, first: int, logits: torch.Tensor) -> None:
        """The float32 logits ``[T, V]`` of the chunk at positions ``first .. first + T - 1``; rows
        are scored in order (``first`` is where the last chunk ended). The last prompt row (whose
        logits predict the first new token) is not a prompt token's and is skipped."""
        assert first == self.scored, f"prompt chunks are scored in order: expected {self.scored}, got {first}"
        rows = min(logits.shape[0], self.ids.numel() - 1 - first)
        for at in range(0, rows, ROWS):
            block = logits[at:min(at + ROWS, rows)]
            lse = torch.logsumexp(block, dim=-1, keepdim=True)
            targets = self.ids[first + at + 1:first + at + 1 + block.shape[0]]
            self.chosen.append(block.gather(1, targets[:, None])[:, 0] - lse[:, 0])
            if self.top:
                values, ids = block.topk(self.top, dim=-1)
                self.top_values.append(values - lse)
                self.top_ids.append(ids)
        self.scored = first + logits.shape[0]

    def results(self) -> list[TokenLogprob | None]:
        """None for the first prompt token, then a ``TokenLogprob`` per later one (reads the device)."""
        ids = self.ids.tolist()
        if len(ids) < 2:
            return [None]
        assert self.scored >= len(ids) - 1, "every chunk of the prompt is scored before the results are read"
        chosen = torch.cat(self.chosen).tolist()
        if self.top:
            top_values, top_ids = torch.cat(self.top_values).tolist(), torch.cat(self.top_ids).tolist()
            tops = [list(zip(i, v)) for i, v in zip(top_ids, top_values)]
        else:
            tops = [[] for _ in chosen]
        return [None] + [TokenLogprob(token, logprob, top) for token, logprob, top in zip(ids[1:], chosen, tops)]


__all__ = ["PromptScores", "ROWS", "SCORING_CHUNK"]
