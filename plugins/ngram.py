"""Plugin ``ngram``: prompt-lookup speculation, no model of its own.

On the host (``propose``) it matches with ``backends/reference/ngram.py``; in the device loop
(``draft_on_device``) with :func:`ngram_lookup_on_device`, torch ops over the sequence buffer with
fixed shapes, which proposes exactly the same tokens.
"""

from __future__ import annotations

import torch

from tileinfer import hookimpl
from tileinfer.backends.reference.ngram import ngram_lookup
from tileinfer.hookspecs import Implementation
from tileinfer.interfaces import DeviceSequence, Draft, Proposer, RunSpec
from tileinfer.options import Option

PAD = -2  # before the sequence in the matcher's buffer: equal to no token (a committed one is >= -1)


def ngram_lookup_on_device(tokens: torch.Tensor, length: torch.Tensor, n_min: int, n_max: int, k: int,
                           padded: torch.Tensor | None = None) -> torch.Tensor:
    """``ngram_lookup(tokens[:length], n_min, n_max, k)`` on the device, without a host sync:
    ``[k]`` int64, the proposal followed by -1 where it is shorter than ``k`` (all -1: no match).

    ``tokens`` ``[C]`` int64 (rows from ``length`` on are ignored), ``length`` ``[1]`` int64.
    ``padded`` (``[n_max + C]`` int64, its first ``n_max`` entries ``PAD``) is a scratch buffer
    reused across calls. Every candidate end ``e`` (the match ends before ``tokens[e]``) is
    compared with the suffix at once: ``run[e]`` is how many tokens before ``e`` equal the last
    ones, capped at ``min(n_max, length - 1)``; the longest run of at least ``n_min`` at any
    ``e <= length - 1`` wins, the earliest ``e`` among equals, as the host lookup picks.
    O(C * n_max) work per call."""
    c = tokens.numel()
    if padded is None:
        padded = torch.full((n_max + c,), PAD, dtype=torch.int64, device=tokens.device)
    padded[n_max:].copy_(tokens)
    cols = torch.arange(n_max, dtype=torch.int64, device=tokens.device)
    suffix = padded.index_select(0, length + cols)  # tokens[length - n_max .. length - 1]
    windows = padded.unfold(0, n_max, 1)  # [C + 1, n_max]: row e holds tokens[e - n_max .. e - 1]
    run = (windows == suffix).flip(1).long().cumprod(1).sum(1)  # [C + 1] equal tokens before e
    ends = torch.arange(c + 1, dtype=torch.int64, device=tokens.device)
    run = torch.minimum(run, (length - 1).clamp(max=n_max))
    run = torch.where((ends <= length - 1) & (run >= n_min), run, 0)
    best = (run * (c + 2) + (c + 1 - ends)).argmax(0, keepdim=True)  # longest, then earliest
    after = best + torch.arange(k, dtype=torch.int64, device=tokens.device)  # the tokens after the match
    drafts = tokens.index_select(0, after.clamp(max=c - 1))
    return torch.where((run.index_select(0, best) > 0) & (after < length), drafts, -1)


class NgramProposer(Proposer):
    """Matches the longest suffix of ``n_max`` down to ``n_min`` tokens earlier in the context and
    proposes the tokens that followed it (deterministic: ``q`` is one-hot). It reads the whole
    sequence at each draft, so a cached prompt prefix serves it too (``reuses_prefix``)."""

    reuses_prefix = True

    declared_options = (
        Option("n_min", int, 1, "the shortest suffix matched", minimum=1),
        Option("n_max", int, 4, "the longest suffix matched (tried first)", minimum=1),
    )

    @classmethod
    def incompatibilities(cls, run: RunSpec) -> list[str]:
        if run.options["n_min"] > run.options["n_max"]:
            return [f"options.ngram.n_min ({run.options['n_min']}) is larger than options.ngram.n_max "
                    f"({run.options['n_max']})"]
        return []

    def propose(self, tokens: list[int], k: int) -> Draft:
        return Draft(ngram_lookup(tokens, self.options["n_min"], self.options["n_max"], k))

    # -- device drafting ------------------------------------------------------------------------

    def device_drafting(self, positions: int) -> bool:
        return True

    def start_on_device(self, seq: DeviceSequence, positions: int) -> None:
        size = self.options["n_max"] + seq.capacity
        padded = getattr(self, "_padded", None)
        if padded is None or padded.numel() != size or padded.device != seq.tokens.device:
            self._padded = torch.full((size,), PAD, dtype=torch.int64, device=seq.tokens.device)

    def draft_on_device(self, seq: DeviceSequence, k: int) -> torch.Tensor:
        return ngram_lookup_on_device(seq.tokens, seq.length, self.options["n_min"], self.options["n_max"], k,
                                      self._padded)


@hookimpl
def tileinfer_implementations() -> list[Implementation]:
    return [Implementation("proposer", "ngram", NgramProposer, "n-gram lookup in the context (prompt lookup)")]
