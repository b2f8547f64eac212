"""The one timing harness of bench/: medians after a warm-up, CUDA events on a GPU, the wall clock
on a CPU; and the machine's limits, measured in the same run as the figures they bound.

- ``median_seconds(fn, device)``: ``fn()`` timed ``repeats`` times after ``warmup`` calls; on a GPU
  each call is bracketed by CUDA events (the device time of what ``fn`` enqueues, host overhead
  included only where the GPU waited for it).
- ``graph_seconds(fn)``: ``fn`` captured once into a CUDA graph (after a warm-up on a side stream)
  and its replay timed as above: the kernels' device time without Python's launch overhead.
- ``repeat(sample, seconds)``: a sampler that returns its own figure (tok/s, ms), called until a
  time budget is spent (at least once): for whole generations, which time themselves.
- ``host_seconds(fn)``: the host's wall time per call of ``fn`` (launch overhead), synchronized.
- ``cold_salt()``: a ``cache_salt`` no generation of this process used before: a generation given it
  prefills its whole prompt (the prefix cache serves a prompt only what the same salt left), so that
  a time to first token of a repeated prompt is a cold prefill's, not a prefix-cache hit's.
- ``measure_limits(device)``: the copy bandwidth (``dst.copy_(src)`` of a large buffer, bytes read +
  written over the median time) and the matmul peak (a square matmul of random data in the dtype the
  engine runs there: BF16 8192^3 on a GPU, float32 512^3 on a CPU, whose BF16 matmul is far slower
  than the float32 path it bounds; ``2 n^3`` FLOPs over the median time).
"""

from __future__ import annotations

import itertools
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch


def median_seconds(fn: Callable[[], object], device: torch.device | str, repeats: int = 20,
                   warmup: int = 3) -> float:
    """Median seconds per call of ``fn`` over ``repeats`` calls after ``warmup`` untimed ones."""
    cuda = torch.device(device).type == "cuda"
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            began = time.perf_counter()
            fn()
            times.append(time.perf_counter() - began)
    return statistics.median(times)


def capture_graph(fn: Callable[[], object]) -> Callable[[], None]:
    """``fn`` captured into a CUDA graph after one warm-up call on a side stream (so that kernel
    compilation and library handles stay out of the graph); returns the graph's replay."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    torch.cuda.synchronize()
    return graph.replay


def graph_seconds(fn: Callable[[], object], repeats: int = 50, warmup: int = 5, calls: int = 1) -> float:
    """Median device seconds of one ``fn()`` replayed from a CUDA graph; ``calls``: how many calls
    of the op one ``fn()`` makes (e.g. over rotating weight copies, so that each reads a weight not
    in L2), the result is per call."""
    return median_seconds(capture_graph(fn), "cuda", repeats, warmup) / calls


_COLD = itertools.count()


def cold_salt() -> str:
    """A ``SamplingParams.cache_salt`` not used before in this process (a cold prefill)."""
    return f"bench-cold-{next(_COLD)}"


def host_seconds(fn: Callable[[], object], calls: int = 100) -> float:
    """Host wall seconds per call of ``fn`` over ``calls`` calls, the device drained before and after."""
    fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    began = time.perf_counter()
    for _ in range(calls):
        fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return (time.perf_counter() - began) / calls


def repeat(sample: Callable[[], float], seconds: float) -> list[float]:
    """``sample()`` once, then again until ``seconds`` have passed since the first began."""
    began = time.perf_counter()
    samples = [sample()]
    while time.perf_counter() - began < seconds:
        samples.append(sample())
    return samples


@dataclass
class Limits:
    copy_bandwidth: float  # bytes/s, read + written
    matmul_peak: float  # FLOP/s, BF16 on a GPU, float32 on a CPU

    def figures(self) -> dict:
        """As a record's fields: ``copy_bandwidth_tb_s``, ``matmul_peak_tflops``."""
        return {"copy_bandwidth_tb_s": self.copy_bandwidth / 1e12, "matmul_peak_tflops": self.matmul_peak / 1e12}


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


def measure_limits(device: torch.device) -> Limits:
    """Both limits on ``device``; the buffers are freed before returning."""
    limits = Limits(copy_bandwidth(device), matmul_peak(device))
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return limits
