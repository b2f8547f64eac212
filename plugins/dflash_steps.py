"""The DFlash drafter's two steps, run eagerly or replayed from CUDA graphs (``cuda_graphs``).

- The context step caches the context of ``n`` new positions (the target's hidden states of the
  layers ``target_layer_ids``, concatenated ``[n, K*H]``): ``fc``, then
  ``DFlashDrafter.write_context`` at positions ``start .. start+n-1``. One graph per row count
  ``n`` from 1 to 16 (a verify step keeps 1..k+1 rows); longer contexts (prompt chunks) run
  eagerly.
- The block step runs ``[last, MASK x (B-1)]`` at positions ``start .. start+B-1`` (non-causal)
  through the drafter's ForwardPass (config key ``forward``, as the target's steps), the logits of
  rows 1..B-1, and takes the argmax of each row: one graph, for blocks of up to 16 positions (the
  attention kernels' small-step path, which reads a step's positions from the device).

Each step's inputs travel through static device buffers, written in place before a replay: the
features, the last token and the positions (``start`` plus an offset; ``start`` a host int or a
``[1]`` int64 device tensor). A replayed step is built with ``Step.max_context`` (the store's
capacity), so every implementation takes its positions from the device; the store's block table
is its own tensor, updated in place by ``KVStore.reserve``: the caller reserves the step's pages
before it runs.

``step_context`` and ``step_block`` are the steps themselves, on the static buffers: the graphs
capture them, and a device-resident loop calls them inside its own capture.
"""

from __future__ import annotations

from collections.abc import Callable, Collection

import torch

from tileinfer.graph_capture import measured_capture
from tileinfer.interfaces import ForwardPass, KVStore, Step
from tileinfer.plugins.dflash_model import DFlashDrafter
from tileinfer.steps import MAX_GRAPH_TOKENS

Start = int | torch.Tensor  # a host position, or a [1] int64 device tensor


class DFlashSteps:
    """The context and block steps of ``drafter`` over ``kv`` (see the module); ``forward``: the
    ForwardPass over ``drafter`` that runs the block.

    ``capture`` (``cuda_graph_capture``'s signature: ``(fn, pool) -> (replay, outputs)``) makes
    ``context`` and ``block`` replay graphs, recorded on first use or by ``capture_graphs``; None
    runs them eagerly (on the same buffers for ``n <= 16`` rows). The tests hand in a stand-in
    that re-runs ``fn`` with the capture's host ``start``, to check on a CPU that only the static
    buffers carry a step's inputs.
    """

    def __init__(self, drafter: DFlashDrafter, kv: KVStore, block_size: int, mask_token_id: int, *,
                 forward: ForwardPass, capture: Callable | None = None) -> None:
        assert forward.model is drafter, "the block runs through a ForwardPass over the drafter"
        self.drafter, self.forward, self.kv, self.block_size = drafter, forward, kv, block_size
        device, rows = drafter.device, MAX_GRAPH_TOKENS
        width = len(drafter.config.target_layer_ids) * drafter.config.model.hidden_size
        self.features = torch.zeros(rows, width, dtype=drafter.embed.dtype, device=device)
        self.context_positions = torch.zeros(rows, dtype=torch.int64, device=device)
        self.block_tokens = torch.full((block_size,), mask_token_id, dtype=torch.int64, device=device)
        self.block_positions = torch.zeros(block_size, dtype=torch.int64, device=device)
        self._offsets = torch.arange(max(rows, block_size), dtype=torch.int64, device=device)
        self._capture = capture
        self._pool = torch.cuda.graph_pool_handle() if capture is not None and device.type == "cuda" else None
        self.graphs: dict[str, tuple[Callable[[], None], object]] = {}
        self.capture_ms = 0.0
        self.memory_bytes = 0

    @property
    def graphed(self) -> bool:
        return self._capture is not None

    # -- the steps on the static buffers ----------------------------------------------------------

    def set_context(self, hidden: dict[int, torch.Tensor], start: Start) -> int:
        """Copy ``hidden`` (``[n, H]`` per target layer, ``n <= 16``) and the positions from
        ``start`` into the buffers; returns ``n``. No host sync."""
        n = next(iter(hidden.values())).shape[0]
        ids = self.drafter.config.target_layer_ids
        torch.cat([hidden[i] for i in ids], dim=-1, out=self.features[:n])
        torch.add(self._offsets[:n], start, out=self.context_positions[:n])
        return n

    def set_block(self, last: Start, start: Start) -> None:
        """Put ``last`` (a host id or a ``[1]`` int64 device tensor) first in the block and its
        positions from ``start``. No host sync."""
        if isinstance(last, torch.Tensor):
            self.block_tokens[:1].copy_(last)
        else:
            self.block_tokens[:1].fill_(last)
        torch.add(self._offsets[:self.block_size], start, out=self.block_positions)

    def step_context(self, n: int, start: int, replayed: bool) -> None:
        """The context step over the first ``n`` rows of the buffers (``start``: the positions'
        first, on the host; with ``replayed`` only the capture's, the implementations then read
        the positions from the device)."""
        step = Step(start, n, self.context_positions[:n], max_context=self.kv.capacity if replayed else None)
        self.drafter.write_context(self.drafter.fc(self.features[:n]), step, self.kv)

    def step_block(self, start: int, replayed: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """The block step on the buffers: float32 logits ``[B - 1, V]`` and their argmax ``[B - 1]``."""
        step = Step(start, self.block_size, self.block_positions, causal=False,
                    max_context=self.kv.capacity if replayed else None)
        logits, _ = self.forward(self.block_tokens, step, self.kv, rows=self._offsets[1:self.block_size])
        return logits, logits.argmax(-1)

    # -- host-driven calls ------------------------------------------------------------------------

    def context(self, hidden: dict[int, torch.Tensor], start: int) -> None:
        """Cache the context of ``hidden`` (``[n, H]`` per target layer, the positions ``start ..
        start+n-1``; ``kv`` holds pages for them). Replayed for ``n <= 16`` with graphs."""
        n = next(iter(hidden.values())).shape[0]
        if n > MAX_GRAPH_TOKENS:
            step = Step.at(start, n, self.drafter.device)
            self.drafter.write_context(self.drafter.project(hidden), step, self.kv)
            return
        self.set_context(hidden, start)
        if not self.graphed:
            self.step_context(n, start, replayed=False)
            return
        self._replay(f"context{n}", lambda: self.step_context(n, 0, replayed=True))

    def block(self, last: int, start: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits ``[B - 1, V]`` float32 and argmax ``[B - 1]`` of the block after ``last`` at
        ``start`` (``kv`` holds pages for ``start + B`` positions). With graphs they are the
        graph's static outputs: read them before the next call."""
        self.set_block(last, start)
        if not self.graphed or self.block_size > MAX_GRAPH_TOKENS:
            return self.step_block(start, replayed=False)
        return self._replay("block", lambda: self.step_block(0, replayed=True))

    def capture_graphs(self, context_rows: Collection[int]) -> None:
        """Record the block graph and the context graphs of ``context_rows`` now (when the proposer
        is built), so that no generation pays a capture. The captures write keys and values at
        positions ``[0, 16)`` of a sequence that is dropped afterwards."""
        if not self.graphed:
            return
        self.kv.reserve(max([self.block_size, *context_rows]))
        ids = self.drafter.config.target_layer_ids
        for n in sorted(set(context_rows)):
            self.context({i: self.features.new_zeros(n, self.drafter.config.model.hidden_size) for i in ids}, 0)
        self.block(0, 0)
        self.kv.reset()

    def _replay(self, name: str, fn: Callable[[], object]):
        if name not in self.graphs:
            self._record(name, fn)
        replay, outputs = self.graphs[name]
        replay()
        return outputs

    def _record(self, name: str, fn: Callable[[], object]) -> None:
        self.graphs[name], ms, allocated = measured_capture(fn, self._capture, self._pool, self.drafter.device)
        self.capture_ms += ms
        self.memory_bytes += allocated

    def report(self) -> str:
        if not self.graphed:
            return "DFlash steps eager"
        return (f"DFlash steps: {len(self.graphs)} CUDA graphs ({', '.join(sorted(self.graphs))}), captured in "
                f"{self.capture_ms:.0f} ms, {self.memory_bytes / 2**20:.1f} MiB")


__all__ = ["DFlashSteps"]
