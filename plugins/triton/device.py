"""Whether Triton kernels can run on a device, and the one-line notice when they cannot."""

from __future__ import annotations

import os
import sys

import torch

_noticed: set[str] = set()


def kernels_run_on(device: torch.device) -> bool:
    """CUDA always; the CPU only under the Triton interpreter."""
    return device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1"


def notice_reference_twin(name: str) -> None:
    if name not in _noticed:
        _noticed.add(name)
        print(f"notice: {name} runs its torch reference twin on the CPU (Triton kernels need a GPU; "
              f"TRITON_INTERPRET=1 runs them in the interpreter)", file=sys.stderr)
