"""The machine's limits, measured in the same run as the figures they bound.

- copy bandwidth: ``dst.copy_(src)`` of a large buffer, bytes read + written over the time
  (``timing.median_seconds`` of several copies: CUDA events on a GPU, a wall clock on a CPU);
- matmul peak: a square matmul of random data in the dtype the engine runs there (BF16 8192^3 on
  a GPU, float32 512^3 on a CPU, whose BF16 matmul is far slower than the float32 path it bounds),
  ``2 n^3`` FLOPs over the time (median).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from timing import median_seconds


@dataclass
class Limits:
    copy_bandwidth: float  # bytes/s, read + written
    matmul_peak: float  # FLOP/s, BF16 on a GPU, float32 on a CPU
    device: str

    def to_dict(self) -> dict:
        return asdict(self)


def copy_bandwidth(device: torch.device, mib: int | None = None, repeats: int = 20) -> float:
    """Device-to-device copy, bytes read + written per second (median)."""
    mib = mib or (2048 if device.type == "cuda" else 64)
    src = torch.randn(mib * 2**19, dtype=torch.bfloat16, device=device)  # 2 bytes each
    dst = torch.empty_like(src)
    seconds = median_seconds(lambda: dst.copy_(src), device, repeats)
    return 2 * src.numel() * src.element_size() / seconds


def matmul_peak(device: torch.device, n: int | None = None, repeats: int = 20) -> float:
    """FLOP/s of an ``n x n x n`` matmul of random data (median): BF16 on a GPU, float32 on a CPU."""
    n = n or (8192 if device.type == "cuda" else 512)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    a = torch.randn(n, n, dtype=dtype, device=device)
    b = torch.randn(n, n, dtype=dtype, device=device)
    out = torch.empty(n, n, dtype=dtype, device=device)
    seconds = median_seconds(lambda: torch.matmul(a, b, out=out), device, repeats if device.type == "cuda" else 5)
    return 2.0 * n**3 / seconds


def measure(device: torch.device) -> Limits:
    """Both limits on ``device``; the buffers are freed before returning."""
    limits = Limits(copy_bandwidth(device), matmul_peak(device), device_name(device))
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return limits


def device_name(device: torch.device) -> str:
    """The GPU's name (``NVIDIA H200``), or ``cpu``."""
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
