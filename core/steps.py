"""How a model's steps run: through its ForwardPass, eagerly or from CUDA graphs captured once per
token count; and its prompt's prefill, in chunks.

``StepRunner.forward(tokens, start) -> (logits, hidden)`` runs a decode or verify step of ``T``
tokens; ``StepRunner.prefill(ids, ...)`` the prompt (``tileinfer.prefill.chunked_prefill``). The
engine builds one per model (config key ``cuda_graphs``: a CUDA device captures). ``tokens`` are
``[T]`` int64 on the device; a negative id (the mark of a step whose logits were not finite, fed
on by a step enqueued before the host read it) is fed as 0, and that step's result is never used.

With ``capture``, a step of ``T <= 16`` tokens reads its token ids and positions from static
device buffers that are updated in place before each replay, and every implementation takes the
step's positions from the device (``Step.max_context`` tells it that ``Step.start`` is only the
capture's). The block table is the KV store's own tensor, which covers the whole pool, so a graph
stays valid for any context the pool holds. The prompt's chunks then replay graphs of their own,
one per length bucket (``PrefillGraphs``, in the same memory pool), which the runner owns and
hands to the prefill.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence

import torch

from tileinfer.graph_capture import cuda_graph_capture, measured_capture
from tileinfer.interfaces import ForwardPass, KVStore, Step
from tileinfer.prefill import ChunkCallback, chunked_prefill
from tileinfer.prefill_graphs import MAX_GRAPH_TOKENS, PrefillGraphs
from tileinfer.prompt_logprobs import PromptScores

Outputs = tuple[torch.Tensor, dict[int, torch.Tensor]]


def build_forward(model, config, registry) -> ForwardPass:
    """The ForwardPass the resolved ``config`` names (key ``forward``) over ``model``, with its options."""
    from tileinfer.resolution import implementation_options

    cls = registry.get("forward", config.forward)
    return cls(model, options=implementation_options(config, "forward", registry))


class StepRunner:
    """The steps of ``forward``'s model over ``kv``; ``capture_layers``: the decoder layers whose
    outputs every step returns (a proposer's ``hidden_layers``).

    ``capture(fn, pool) -> (replay, outputs)``: ``cuda_graph_capture`` (a CUDA device with
    ``cuda_graphs``), or a stand-in in the tests that re-runs ``fn`` on each replay with the
    capture's ``start``, to check on a CPU that nothing but the static buffers carries a step's
    inputs; None: every step runs eagerly. ``prefill=False``: the prompt's chunks run eagerly even
    with ``capture`` (no ``prefill_graphs``).
    """

    def __init__(self, forward: ForwardPass, kv: KVStore, capture_layers: Collection[int] = (), *,
                 capture: Callable | None = None, prefill: bool = True) -> None:
        self.forward_pass, self.kv, self.capture_layers = forward, kv, tuple(capture_layers)
        self.device = device = forward.device
        self._capture = capture
        self.graphs: dict[int, tuple[Callable[[], None], Outputs]] = {}
        self.capture_ms = 0.0
        self.memory_bytes = 0
        self.prefill_graphs: PrefillGraphs | None = None
        if capture is None:
            return
        self.tokens = torch.zeros(MAX_GRAPH_TOKENS, dtype=torch.int64, device=device)
        self.positions = torch.zeros(MAX_GRAPH_TOKENS, dtype=torch.int64, device=device)
        self._offsets = torch.arange(MAX_GRAPH_TOKENS, dtype=torch.int64, device=device)
        self._pool = torch.cuda.graph_pool_handle() if device.type == "cuda" else None
        if prefill:
            self.prefill_graphs = PrefillGraphs(forward, kv, self.capture_layers, capture=capture, pool=self._pool)

    @property
    def graphed(self) -> bool:
        return self._capture is not None

    def forward(self, tokens: torch.Tensor, start: int) -> Outputs:
        """Logits ``[T, V]`` float32 (and the captured hidden states) of ``tokens`` at ``start``.

        Replayed, the returned tensors are the graph's static outputs: read them before the next
        call. A step of more than 16 tokens runs eagerly."""
        t = tokens.numel()
        if not self.graphed or t > MAX_GRAPH_TOKENS:
            step = Step.at(start, t, self.device)
            return self.forward_pass(tokens.clamp(min=0), step, self.kv, capture=self.capture_layers)
        torch.clamp(tokens, min=0, out=self.tokens[:t])
        torch.add(self._offsets[:t], start, out=self.positions[:t])
        if t not in self.graphs:
            self._record(t, start)
        replay, outputs = self.graphs[t]
        replay()
        return outputs

    def prefill(self, ids: Sequence[int], *, chunk: int, capture: Collection[int] = (),
                on_chunk: ChunkCallback | None = None, progress: bool = False, start: int = 0,
                scores: PromptScores | None = None) -> torch.Tensor:
        """``tileinfer.prefill.chunked_prefill`` of ``ids`` from ``start`` (the store holding
        ``ids[:start]``) over this runner's prefill graphs (if any; not while ``scores`` are kept)."""
        return chunked_prefill(self.forward_pass, self.kv, ids, chunk=chunk, capture=capture, on_chunk=on_chunk,
                               progress=progress, graphs=self.prefill_graphs, start=start, scores=scores)

    def capture(self, token_counts: Collection[int]) -> None:
        """Capture the graphs of ``token_counts`` now (when the engine is built: 1, and 1 + spec_k
        with a proposer), so that no generation pays a capture; nothing when eager. The capture
        steps write keys and values at positions ``[0, t)`` of a sequence dropped afterwards."""
        todo = sorted(set(token_counts) - set(self.graphs)) if self.graphed else []
        if not todo:
            return
        self.kv.reserve(max(todo))
        for t in todo:
            self.forward(torch.zeros(t, dtype=torch.int64, device=self.device), 0)
        self.kv.reset()

    def _step(self, t: int, start: int) -> Outputs:
        step = Step(start, t, self.positions[:t], max_context=self.kv.capacity)
        return self.forward_pass(self.tokens[:t], step, self.kv, capture=self.capture_layers)

    def _record(self, t: int, start: int) -> None:
        self.graphs[t], ms, allocated = measured_capture(lambda: self._step(t, start), self._capture, self._pool,
                                                         self.device)
        self.capture_ms += ms
        self.memory_bytes += allocated

    def report(self) -> str:
        if not self.graphed:
            return "eager steps"
        prefill = self.prefill_graphs.report() if self.prefill_graphs else "prefill chunks eager"
        return (f"{len(self.graphs)} CUDA graphs (token counts {sorted(self.graphs)}), captured in "
                f"{self.capture_ms:.0f} ms, {self.memory_bytes / 2**20:.1f} MiB; {prefill}")


__all__ = ["MAX_GRAPH_TOKENS", "Outputs", "StepRunner", "build_forward", "cuda_graph_capture"]
