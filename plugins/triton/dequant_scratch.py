"""The scratch buffer of ``options.triton.int8_prefill_dequant``: one model-dtype buffer per device
and dtype, into which every int8 Triton linear writes its weight's values (backends/triton/
int8_dequant.py) before a prefill GEMM of at least the threshold's tokens. Calls run one after
another on the stream, so that one buffer the size of the largest such weight serves every layer of
every model in the process (Qwen3-4B: the fused gate_up, 19,456 x 2,560, 100 MB in bfloat16).

The layers hold the :class:`Scratch` (:func:`shared` keeps only a weak reference: the buffer goes
with the last layer). Each reserves its size at load. Until a call has used the buffer, a larger
reservation replaces it; from the first use on it is kept (a CUDA graph of a prefill chunk holds its
address): a later, larger reservation makes a new buffer and keeps the old one alive beside it.
"""

from __future__ import annotations

import weakref

import torch


class Scratch:
    """One device's and dtype's buffer, shared by the layers that hold it. Slotted, no ``__dict__``:
    ``tileinfer.memory.tensor_bytes`` (the engine's ``weight_bytes``) walks attributes and leaves the
    scratch out; it is not a weight (:attr:`nbytes` says its size)."""

    __slots__ = ("device", "dtype", "buffer", "used", "kept", "__weakref__")

    def __init__(self, device: torch.device, dtype: torch.dtype) -> None:
        self.device, self.dtype = device, dtype
        self.buffer: torch.Tensor | None = None
        self.used = False
        self.kept: list[torch.Tensor] = []  # earlier buffers that a captured graph may still read

    def reserve(self, numel: int) -> None:
        """Make the buffer hold at least ``numel`` elements (allocated here, at load, not in a call)."""
        if self.buffer is not None and self.buffer.numel() >= numel:
            return
        if self.buffer is not None and self.used:
            self.kept.append(self.buffer)
        self.buffer, self.used = torch.empty(numel, dtype=self.dtype, device=self.device), False

    def view(self, rows: int, cols: int) -> torch.Tensor:
        """The buffer's first ``rows x cols`` elements as a contiguous ``[rows, cols]`` tensor (reserved
        before: an AssertionError otherwise)."""
        numel = rows * cols
        assert self.buffer is not None and self.buffer.numel() >= numel, (
            f"no scratch of {numel} {self.dtype} reserved on {self.device}")
        self.used = True
        return self.buffer[:numel].view(rows, cols)

    @property
    def nbytes(self) -> int:
        """Bytes of the buffer and of the ones kept beside it."""
        held = self.kept + ([self.buffer] if self.buffer is not None else [])
        return sum(t.numel() * t.element_size() for t in held)


_SHARED: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


def shared(device: torch.device, dtype: torch.dtype) -> Scratch:
    """The :class:`Scratch` of ``(device, dtype)`` that the live layers share (a new one where none
    is held)."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    scratch = _SHARED.get((device, dtype))
    if scratch is None:
        scratch = _SHARED[(device, dtype)] = Scratch(device, dtype)
    return scratch


__all__ = ["Scratch", "shared"]
