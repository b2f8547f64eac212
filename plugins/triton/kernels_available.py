"""Whether the Triton kernels can run where a config asks for them."""

from __future__ import annotations

import torch

from tileinfer.backends.triton.interpreter import kernels_run_on


def device_reasons(kind: str, device: torch.device) -> list[str]:
    """Why ``{kind}=triton`` cannot run on ``device`` (empty: it can)."""
    if kernels_run_on(device):
        return []
    return [f"the Triton kernels need a CUDA GPU, and device is {device.type} (use {kind}=auto or {kind}=reference "
            "on a CPU, or set TRITON_INTERPRET=1 to run the kernels in Triton's interpreter, slowly)"]
