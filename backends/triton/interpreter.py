"""Where the Triton kernels run: compiled on a CUDA device, or in the Triton interpreter
(``TRITON_INTERPRET=1``, CPU tensors), which computes ``tl.dot`` and elementwise ops on bfloat16
wrongly, so that the launchers hand it float32 tiles instead."""

from __future__ import annotations

import functools
import os

import torch

DEFAULT_NUM_SMS = 132  # H200; where no GPU is visible (interpreter), so that the tile rules stay deterministic


def interpreting() -> bool:
    """Whether Triton runs kernels in its interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def kernels_run_on(device: torch.device) -> bool:
    """Whether the kernels can run on tensors of ``device``: CUDA always; the CPU only under the
    interpreter."""
    return torch.device(device).type == "cuda" or interpreting()


def interpreted(device: torch.device) -> bool:
    """Whether a launch on tensors of ``device`` runs in the interpreter (CPU tensors, or
    ``TRITON_INTERPRET=1``): then its dot operands go to float32."""
    return torch.device(device).type != "cuda" or interpreting()


@functools.lru_cache(maxsize=None)
def num_sms(device_index: int | None = None) -> int:
    """Multiprocessors of the CUDA device (the tile rules' grid sizes); ``DEFAULT_NUM_SMS`` without
    a GPU or under the interpreter."""
    if torch.cuda.is_available() and not interpreting():
        return torch.cuda.get_device_properties(device_index or 0).multi_processor_count
    return DEFAULT_NUM_SMS


def sms_of(device: torch.device) -> int:
    """:func:`num_sms` of the device that tensors of ``device`` live on (``DEFAULT_NUM_SMS`` for the CPU)."""
    device = torch.device(device)
    return num_sms(device.index) if device.type == "cuda" else DEFAULT_NUM_SMS


__all__ = ["DEFAULT_NUM_SMS", "interpreted", "interpreting", "kernels_run_on", "num_sms", "sms_of"]
