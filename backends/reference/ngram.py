"""N-gram prompt lookup: propose what followed the longest earlier match of the context's suffix."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def ngram_lookup(tokens: Sequence[int], n_min: int, n_max: int, k: int) -> list[int]:
    """Up to ``k`` tokens that followed the earliest earlier occurrence of the longest suffix of
    ``tokens`` of length ``n_max`` down to ``n_min``; ``[]`` when no suffix occurs earlier."""
    seq = np.asarray(tokens, dtype=np.int64)
    length = len(seq)
    for n in range(min(n_max, length - 1), n_min - 1, -1):
        suffix = seq[length - n:]
        windows = np.lib.stride_tricks.sliding_window_view(seq[: length - 1], n)  # starts 0 .. L-1-n
        hits = np.flatnonzero((windows == suffix).all(axis=1))
        if hits.size:
            after = int(hits[0]) + n
            return seq[after: after + k].tolist()
    return []
