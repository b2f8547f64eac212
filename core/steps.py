"""How decode and verify steps run: eagerly, or from CUDA graphs captured once per token count.

Both runners have ``forward(tokens, start) -> (logits, hidden)``; the engine picks one when it is
built (config key ``cuda_graphs``). ``tokens`` are ``[T]`` int64 on the device; a negative id (the
mark of a step whose logits were not finite, fed on by pipelined decoding before the host reads
it) is fed as 0, and that step's result is never used.

A step of ``T <= 16`` tokens reads its token ids and positions from static device buffers that
are updated in place before each replay, and every implementation takes the step's positions
from the device (``Step.max_context`` tells it that ``Step.start`` is only the capture's). The
block table is the KV store's own tensor, which covers the whole pool, so a graph stays valid for
any context the pool holds.

The prefill follows the runner last built over a KV store: ``GraphedSteps`` replays prefill chunks
from graphs of its own, one per length bucket (``prefill_graphs``, tileinfer.prefill_graphs, in the
same memory pool), ``EagerSteps`` runs them eagerly.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection
from typing import Union

import torch

from tileinfer.graph_capture import cuda_graph_capture, warm_up
from tileinfer.interfaces import KVStore, Step
from tileinfer.model import Qwen3Model
from tileinfer.prefill_graphs import MAX_GRAPH_TOKENS, PrefillGraphs, use_prefill_graphs


Outputs = tuple[torch.Tensor, dict[int, torch.Tensor]]


class EagerSteps:
    """Each step is a plain call of the model's forward."""

    def __init__(self, model: Qwen3Model, kv: KVStore, capture_layers: Collection[int] = ()) -> None:
        self.model, self.kv, self.capture_layers = model, kv, tuple(capture_layers)
        self.prefill_graphs = None
        use_prefill_graphs(kv, None)

    def forward(self, tokens: torch.Tensor, start: int) -> Outputs:
        step = Step.at(start, tokens.numel(), self.model.device)
        return self.model.forward(tokens.clamp(min=0), step, self.kv, capture=self.capture_layers)

    def report(self) -> str:
        return "eager steps"


class GraphedSteps:
    """``forward(tokens, start)`` for steps of 1..16 tokens, one captured graph per token count;
    ``prefill_graphs`` for the prompt's chunks (in the same pool), which the KV store's prefill
    takes from now on (``prefill_graphs.use_prefill_graphs``).

    ``capture(fn, pool) -> (replay, outputs)`` is ``cuda_graph_capture``; the tests hand in a
    stand-in that re-runs ``fn`` on each replay with the capture's ``start``, to check on a CPU that
    nothing but the static buffers carries a step's inputs. ``prefill=False``: the prefill chunks
    run eagerly (no ``prefill_graphs``).
    """

    def __init__(self, model: Qwen3Model, kv: KVStore, capture_layers: Collection[int] = (), *,
                 capture: Callable = cuda_graph_capture, prefill: bool = True) -> None:
        self.model, self.kv, self.capture_layers = model, kv, tuple(capture_layers)
        device = model.device
        self.tokens = torch.zeros(MAX_GRAPH_TOKENS, dtype=torch.int64, device=device)
        self.positions = torch.zeros(MAX_GRAPH_TOKENS, dtype=torch.int64, device=device)
        self._offsets = torch.arange(MAX_GRAPH_TOKENS, dtype=torch.int64, device=device)
        self._capture = capture
        self._pool = torch.cuda.graph_pool_handle() if device.type == "cuda" else None
        self.graphs: dict[int, tuple[Callable[[], None], Outputs]] = {}
        self.capture_ms = 0.0
        self.memory_bytes = 0
        self.prefill_graphs = (PrefillGraphs(model, kv, self.capture_layers, capture=capture, pool=self._pool)
                               if prefill else None)
        use_prefill_graphs(kv, self.prefill_graphs)

    def forward(self, tokens: torch.Tensor, start: int) -> Outputs:
        """Logits ``[T, V]`` float32 (and captured hidden states) of ``tokens`` at ``start``.

        The returned tensors are the graph's static outputs: read them before the next call.
        """
        t = tokens.numel()
        torch.clamp(tokens, min=0, out=self.tokens[:t])
        torch.add(self._offsets[:t], start, out=self.positions[:t])
        if t not in self.graphs:
            self._record(t, start)
        replay, outputs = self.graphs[t]
        replay()
        return outputs

    def capture(self, token_counts: Collection[int]) -> None:
        """Capture the graphs of ``token_counts`` now (the engine does it when it is built: 1, and
        1 + spec_k with a proposer), so that no generation pays a capture. The capture steps write
        keys and values at positions ``[0, t)`` of a sequence that is dropped afterwards."""
        todo = sorted(set(token_counts) - set(self.graphs))
        if not todo:
            return
        self.kv.reserve(max(todo))
        for t in todo:
            self.forward(torch.zeros(t, dtype=torch.int64, device=self.model.device), 0)
        self.kv.reset()

    def _step(self, t: int, start: int) -> Outputs:
        step = Step(start, t, self.positions[:t], max_context=self.kv.capacity)
        return self.model.forward(self.tokens[:t], step, self.kv, capture=self.capture_layers)

    def _record(self, t: int, start: int) -> None:
        cuda = self.model.device.type == "cuda"
        began = time.perf_counter()
        before = torch.cuda.memory_allocated() if cuda else 0
        warm_up(lambda: self._step(t, start), self.model.device)
        self.graphs[t] = self._capture(lambda: self._step(t, start), self._pool)
        if cuda:
            torch.cuda.synchronize()
        self.capture_ms += (time.perf_counter() - began) * 1e3
        self.memory_bytes += (torch.cuda.memory_allocated() - before) if cuda else 0

    def report(self) -> str:
        prefill = self.prefill_graphs.report() if self.prefill_graphs else "prefill chunks eager"
        return (f"{len(self.graphs)} CUDA graphs (token counts {sorted(self.graphs)}), captured in "
                f"{self.capture_ms:.0f} ms, {self.memory_bytes / 2**20:.1f} MiB; {prefill}")


StepRunner = Union[EagerSteps, GraphedSteps]
