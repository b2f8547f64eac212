"""Whether Triton kernels can run on a device, and the one-line notice when they cannot."""

from __future__ import annotations

import os
import sys

import torch

_noticed = False


def kernels_run_on(device: torch.device) -> bool:
    """CUDA always; the CPU only under the Triton interpreter."""
    return device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1"


def notice_reference_twin(name: str) -> None:
    """One line per process, whichever Triton implementation asks first."""
    global _noticed
    if not _noticed:
        _noticed = True
        print("notice: the Triton implementations run their torch reference twins on the CPU (Triton kernels "
              f"need a GPU; TRITON_INTERPRET=1 runs them in the interpreter), {name} among them", file=sys.stderr)
