"""The split-K counters of the GEMVs and GEMMs whose last split's program adds the partials
(``linear_gemv.reduce_if_last``, the persistent GEMM's split tail): one int32 per column block,
0 between launches."""

from __future__ import annotations

import torch

_COUNTERS: dict[torch.device, torch.Tensor] = {}
MAX_COUNTERS = 1 << 16


def split_counters(device: torch.device, blocks: int) -> torch.Tensor:
    """The split-K counters of ``reduce_if_last`` on ``device``: int32 zeros, one per column block,
    shared by every launch (each leaves them at 0; launches on one stream run one after the other).
    Made once per device, outside any CUDA graph capture in the engine (its steps are run once
    before they are captured)."""
    assert blocks <= MAX_COUNTERS, f"{blocks} column blocks: more than the {MAX_COUNTERS} split-K counters"
    counters = _COUNTERS.get(device)
    if counters is None:
        counters = _COUNTERS[device] = torch.zeros(MAX_COUNTERS, dtype=torch.int32, device=device)
    return counters


__all__ = ["MAX_COUNTERS", "split_counters"]
