"""The CPU thread count of a run on a CPU (config key ``threads``), applied with ``torch.set_num_threads``."""

from __future__ import annotations

import os

MAX_AUTO_THREADS = 16  # decode steps of a single sequence stop scaling well before this


def cpu_threads(setting: int) -> int:
    """``setting`` when > 0; for 0 (auto), the CPUs this process may run on (``os.sched_getaffinity``,
    so a container's or ``taskset``'s limit counts) less the CPUs already busy (the 1-minute load
    average, rounded), at least 1 and at most ``MAX_AUTO_THREADS``: on an idle machine every
    allowed CPU, on a busy one no more threads than the CPUs left, so that torch's threads do not
    oversubscribe the machine (an oversubscribed intra-op pool makes each step wait for its
    slowest thread)."""
    if setting > 0:
        return setting
    try:
        allowed = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        allowed = os.cpu_count() or 1
    try:
        busy = round(os.getloadavg()[0])
    except (AttributeError, OSError):
        busy = 0
    return max(1, min(allowed - busy, allowed, MAX_AUTO_THREADS))


__all__ = ["MAX_AUTO_THREADS", "cpu_threads"]
