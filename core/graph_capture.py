"""Capturing a step into a CUDA graph: the capture itself, and the warm-up run before it."""

from __future__ import annotations

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


__all__ = ["cuda_graph_capture", "warm_up"]
