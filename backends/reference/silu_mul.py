"""Reference SwiGLU of a fused gate/up projection; twin of backends/triton/silu_mul.py."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """SwiGLU of a fused projection: ``gate_up`` ``[T, 2I]`` (gate then up) -> ``silu(gate) * up``, ``[T, I]``."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up
