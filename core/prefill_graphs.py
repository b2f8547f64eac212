"""Prefill chunks replayed from CUDA graphs, one graph per length bucket.

A prefill chunk of ``n`` tokens runs as a step of ``bucket(n)`` tokens, the real ones first and
padding after them, replayed from the graph captured for that bucket (on its first use; or up front
with :meth:`PrefillGraphs.capture`), so that the host enqueues one replay instead of every kernel of
every layer. Everything that varies between chunks of one bucket is read on the device from static
buffers, updated in place before each replay: the token ids, the positions (the chunk's start is
``positions[0]``; ``Step.max_context`` tells each implementation that ``Step.start`` is only the
capture's) and the index of the last real row, whose logits are the step's output.

Buckets (:func:`bucket_for`): a chunk of at most ``MAX_GRAPH_TOKENS`` (16) tokens is its own
bucket, unpadded: implementations compute steps that short with other kernels than longer ones (the
Triton backend: its GEMV and decode attention, as for decode and verify steps), so padding it
would change its bits from the eager prefill's. Above that, the next power of two from 32 up to
512 tokens; above 512, the next multiple of a quarter of the largest power of two below ``n`` (640,
768, 896, 1,024, 1,280, ..., 4,096, 5,120, ...); never more than the chunk size (a full chunk is
its own bucket). The padding is therefore at most 15 tokens up to 32, less than ``n`` up to 512
(where a step's time is set by reading the weights rather than by its tokens), and less than ``n /
4`` above.

Padding: its rows compute from token ids that are valid (zeros, or the ids a previous use left) at
the positions after the real ones, and write their keys and values there; the KV store reserves
pages for them, and the caller drops them afterwards (``KVStore.truncate`` to the real length).
They are never used: a real row attends causally to positions up to its own, so it gives every
padded key weight 0 (the attention kernels load the diagonal tiles and mask the scores: 0 x a
finite value), and every later step writes a position before it reads it (a decode or verify step
writes its own positions first; a chunk after a padded one overwrites them). Only the real rows'
hidden states are handed on (``hidden[:n]``), and the logits are those of row ``n - 1``.

Memory: the graphs share one pool with the decode graphs (``StepRunner``), so a capture reuses
what earlier captures freed: the pool holds about one largest bucket's activations plus each
graph's static outputs (float32 logits ``[1, V]``, and ``[bucket, hidden]`` per captured layer).
That is safe because each graph's outputs are read before any other graph replays (the sampler
reads the logits, a proposer the hidden states, on the same stream). At most ``max_graphs`` (8)
buckets of more than 16 tokens are captured (the short ones, small, are not counted); past that a
chunk of more than 16 tokens takes the smallest captured bucket that holds it, else it runs
eagerly, as does a chunk whose padding would pass the KV capacity or the RoPE table.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass

import torch

from tileinfer.graph_capture import warm_up
from tileinfer.interfaces import ForwardPass, KVStore, Step

Outputs = tuple[torch.Tensor, dict[int, torch.Tensor]]
MAX_GRAPH_TOKENS = 16  # the longest decode or verify step; a prefill chunk this short is not padded
MIN_BUCKET = 32
MAX_PREFILL_GRAPHS = 8


def bucket_for(tokens: int, chunk: int) -> int:
    """The token count a chunk of ``tokens`` (1 <= tokens <= chunk) is padded to: itself up to
    ``MAX_GRAPH_TOKENS``, then the next power of two >= 32 up to 512, above that the next multiple
    of a quarter of the largest power of two below ``tokens``; at most ``chunk``."""
    if not 1 <= tokens <= chunk:
        raise ValueError(f"a chunk holds 1 to {chunk} tokens, got {tokens}")
    if tokens <= MAX_GRAPH_TOKENS:
        return tokens
    if tokens <= 512:
        bucket = max(MIN_BUCKET, 1 << (tokens - 1).bit_length())
    else:
        quarter = (1 << ((tokens - 1).bit_length() - 1)) // 4
        bucket = -(-tokens // quarter) * quarter
    return min(bucket, chunk)


@dataclass
class _Graph:
    """One bucket's static inputs (filled before each replay), its replay and its static outputs."""

    tokens: torch.Tensor  # [bucket] int64
    positions: torch.Tensor  # [bucket] int64: start, start + 1, ...
    last: torch.Tensor  # [1] int64: the last real row
    replay: Callable[[], None] | None = None
    outputs: Outputs | None = None


class PrefillGraphs:
    """``run(tokens, start, chunk)``: one prefill chunk of ``forward``'s model replayed from its
    bucket's graph. They belong to the step runner that built them (``tileinfer.steps.StepRunner``),
    whose prefill hands them to ``tileinfer.prefill.chunked_prefill``.

    ``capture_layers``: the decoder layers whose outputs the graphs keep (a proposer's
    ``hidden_layers``); ``capture(fn, pool) -> (replay, outputs)``: ``steps.cuda_graph_capture``
    (the tests hand in a stand-in that re-runs ``fn`` on each replay, to check on a CPU that only
    the static buffers carry a chunk's inputs); ``pool``: the memory pool the graphs share (the
    decode graphs').
    """

    def __init__(self, forward: ForwardPass, kv: KVStore, capture_layers: Collection[int] = (), *,
                 capture: Callable, pool=None, max_graphs: int = MAX_PREFILL_GRAPHS) -> None:
        self.forward, self.kv, self.capture_layers = forward, kv, tuple(capture_layers)
        self._capture, self._pool, self.max_graphs = capture, pool, max_graphs
        self.graphs: dict[int, _Graph] = {}
        self.capture_ms = 0.0
        self.memory_bytes = 0

    @property
    def limit(self) -> int:
        """Positions a padded step may reach: the KV pool's and the RoPE table's."""
        return min(self.kv.capacity, self.forward.model.rope.cos.shape[0])

    def bucket(self, tokens: int, start: int, chunk: int) -> int | None:
        """The bucket that serves a chunk of ``tokens`` at ``start`` (chunks of at most ``chunk``):
        :func:`bucket_for`, or when ``max_graphs`` long buckets are captured and it is not one of
        them the smallest captured long bucket that holds the chunk; None (run eagerly) when none
        fits below :attr:`limit`."""
        wanted = bucket_for(tokens, chunk)
        long = [b for b in self.graphs if b > MAX_GRAPH_TOKENS]
        if wanted in self.graphs or wanted <= MAX_GRAPH_TOKENS or len(long) < self.max_graphs:
            return wanted if start + wanted <= self.limit else None
        fitting = [b for b in sorted(long) if tokens <= b and start + b <= self.limit]
        return fitting[0] if fitting else None

    def run(self, tokens: torch.Tensor, start: int, chunk: int, capture: Collection[int] = ()) -> Outputs | None:
        """The chunk ``tokens`` (``[n]`` int64 on the device) at positions ``start ..``: float32
        logits ``[1, V]`` after its last token and the outputs ``[n, hidden]`` of the layers in
        ``capture`` (a subset of ``capture_layers``), static outputs of the graph (read them before
        the next call); or None when no graph serves it (then nothing ran). Reserves the KV store
        for the padding: truncate it to the real length once the prefill is over."""
        n = tokens.numel()
        bucket = self.bucket(n, start, chunk) if set(capture) <= set(self.capture_layers) else None
        if bucket is None:
            return None
        self.kv.reserve(start + bucket)
        graph = self.graphs.get(bucket) or self._buffers(bucket)
        graph.tokens[:n].copy_(tokens)
        torch.arange(start, start + bucket, out=graph.positions)
        graph.last.fill_(n - 1)
        if graph.replay is None:
            self._record(bucket, graph, start)
        graph.replay()
        logits, hidden = graph.outputs
        return logits, {layer: hidden[layer][:n] for layer in capture}

    def capture(self, buckets: Iterable[int]) -> None:
        """Capture the graphs of ``buckets`` now, so that no prompt pays a capture: each runs once
        at positions ``[0, bucket)`` of a sequence dropped afterwards (the KV store is reset)."""
        todo = sorted(set(buckets) - {b for b, g in self.graphs.items() if g.replay is not None})
        for bucket in todo:
            self.kv.reset()
            zeros = torch.zeros(bucket, dtype=torch.int64, device=self.forward.device)
            if self.run(zeros, 0, bucket) is None:
                raise ValueError(f"a prefill graph of {bucket} tokens does not fit: the KV store holds "
                                 f"{self.limit} positions, or {self.max_graphs} graphs are captured")
        self.kv.reset()

    def report(self) -> str:
        """What was captured and the memory it holds."""
        if not self.graphs:
            return "no prefill graphs"
        return (f"{len(self.graphs)} prefill CUDA graphs (buckets {sorted(self.graphs)} tokens), captured in "
                f"{self.capture_ms:.0f} ms, {self.memory_bytes / 2**20:.1f} MiB")

    def _buffers(self, bucket: int) -> _Graph:
        device = self.forward.device
        return _Graph(torch.zeros(bucket, dtype=torch.int64, device=device),
                      torch.zeros(bucket, dtype=torch.int64, device=device),
                      torch.zeros(1, dtype=torch.int64, device=device))

    def _step(self, graph: _Graph, start: int) -> Outputs:
        bucket = graph.tokens.numel()
        step = Step(start, bucket, graph.positions, max_context=self.kv.capacity)
        return self.forward(graph.tokens, step, self.kv, rows=graph.last, capture=self.capture_layers)

    def _record(self, bucket: int, graph: _Graph, start: int) -> None:
        cuda = self.forward.device.type == "cuda"
        began = time.perf_counter()
        warm_up(lambda: self._step(graph, start), self.forward.device, release=True)
        before = torch.cuda.memory_reserved() if cuda else 0
        graph.replay, graph.outputs = self._capture(lambda: self._step(graph, start), self._pool)
        if cuda:
            torch.cuda.synchronize()
        self.graphs[bucket] = graph
        self.capture_ms += (time.perf_counter() - began) * 1e3
        self.memory_bytes += (torch.cuda.memory_reserved() - before) if cuda else 0


__all__ = ["MAX_GRAPH_TOKENS", "MAX_PREFILL_GRAPHS", "MIN_BUCKET", "PrefillGraphs", "bucket_for"]
