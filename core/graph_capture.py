"""Capturing a step into a CUDA graph: the capture itself, the warm-up run before it, and both
measured."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import torch

T = TypeVar("T")


def cuda_graph_capture(fn: Callable[[], T], pool) -> tuple[Callable[[], None], T]:
    """Capture ``fn`` into a CUDA graph (memory from ``pool``): returns its replay and its static
    outputs."""
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        outputs = fn()
    return graph.replay, outputs


def warm_up(fn: Callable[[], object], device: torch.device, *, release: bool = False) -> None:
    """Run ``fn`` once on a side stream before it is captured (on CUDA; nothing elsewhere), so that
    kernel compilation and library handles stay out of the graph. ``release``: then wait for it and
    hand its activations back to the allocator, for the capture's pool to take."""
    if device.type != "cuda":
        return
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    if release:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def measured_capture(fn: Callable[[], T], capture: Callable, pool,
                     device: torch.device) -> tuple[tuple[Callable[[], None], T], float, int]:
    """:func:`warm_up` then ``capture(fn, pool)`` (``cuda_graph_capture``'s signature); returns the
    capture's ``(replay, outputs)``, the milliseconds both took (synchronized, on CUDA) and the
    device memory allocated meanwhile (bytes; 0 off CUDA)."""
    cuda = device.type == "cuda"
    began = time.perf_counter()
    before = torch.cuda.memory_allocated() if cuda else 0
    warm_up(fn, device)
    captured = capture(fn, pool)
    if cuda:
        torch.cuda.synchronize()
    return captured, (time.perf_counter() - began) * 1e3, (torch.cuda.memory_allocated() - before) if cuda else 0


__all__ = ["cuda_graph_capture", "measured_capture", "warm_up"]
