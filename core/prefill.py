"""Chunked prefill: a prompt of any length (up to the KV capacity) in steps of at most ``chunk`` tokens.

Chunk ``i`` is one ``Step`` at ``start = i * chunk`` over the pages the chunks before it cached (the
attentions take any ``start`` with any number of tokens), so a step's activations are bounded by
the chunk, whatever the prompt's length; the keys and values, and hence every later token, are
those of a prefill in one step (the same positions, the same causal attention). Only the last
chunk's last logits are computed (the other chunks run no lm_head). A proposer that reads the
prompt (its target hidden states, or a draft model prefilling its own cache) gets each chunk as it
is done (``on_chunk``).

Every chunk runs through the model's ``ForwardPass``. Given prefill graphs (those of a step runner
with CUDA graphs, ``tileinfer.steps.StepRunner``) each chunk is replayed from the graph of its
length bucket, padded past the prompt (tileinfer.prefill_graphs: the padding's keys and values
are dropped at the end, and a graphed chunk computes its last real row's logits whether or not it
is the last chunk); a chunk no graph serves runs eagerly.

On a terminal (``progress`` and stderr a TTY), a prompt of more than one chunk shows a line
``prefill 8192/32768 tokens`` on stderr, updated as the device finishes each chunk (on a GPU the
host waits for chunk ``i`` only after it enqueued chunk ``i + 1``, so the device never idles for
it) and erased when the prefill is over.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Collection, Sequence
from typing import TextIO

import torch

from tileinfer.interfaces import ForwardPass, KVStore, Step
from tileinfer.prefill_graphs import PrefillGraphs

ChunkCallback = Callable[[list[int], int, dict[int, torch.Tensor]], None]


def stderr_is_terminal() -> bool:
    """Whether standard error is a terminal (where progress lines are shown)."""
    stream = sys.stderr
    try:
        return stream is not None and stream.isatty()
    except (AttributeError, ValueError):  # replaced by an object without isatty, or closed
        return False


class ProgressLine:
    """``prefill DONE/TOTAL tokens`` on one line of ``stream``, rewritten in place (``\\r``) and
    erased by ``close`` (``\\r`` and clear-to-end-of-line), so that nothing is left behind."""

    def __init__(self, total: int, stream: TextIO) -> None:
        self.total, self.stream = total, stream

    def show(self, done: int) -> None:
        self.stream.write(f"\rprefill {done}/{self.total} tokens")
        self.stream.flush()

    def close(self) -> None:
        self.stream.write("\r\x1b[K")
        self.stream.flush()


@torch.inference_mode()
def chunked_prefill(forward: ForwardPass, kv: KVStore, ids: Sequence[int], *, chunk: int,
                    capture: Collection[int] = (), on_chunk: ChunkCallback | None = None,
                    progress: bool = False, graphs: PrefillGraphs | None = None) -> torch.Tensor:
    """Run the prompt ``ids`` from position 0 (the KV store empty) in steps of at most ``chunk``
    tokens; returns the float32 logits ``[1, V]`` after its last token, on the device (not read).

    ``capture``: the decoder layers whose outputs ``on_chunk(tokens, start, hidden)`` receives
    after each chunk (``tokens`` the chunk's ids, at positions ``start ..``; ``hidden`` ``[len(tokens),
    hidden_size]`` per layer). ``progress``: show the progress line when stderr is a terminal and the
    prompt takes more than one chunk. ``graphs``: the prefill graphs to replay the chunks from (None:
    every chunk eagerly).
    The KV store ends holding exactly the prompt (``kv.length == len(ids)``).
    """
    if chunk < 1:
        raise ValueError(f"chunk must be >= 1, got {chunk}")
    ids = list(ids)
    total = len(ids)
    kv.reserve(total)
    tokens = torch.tensor(ids, dtype=torch.int64, device=forward.device)
    line = ProgressLine(total, sys.stderr) if progress and total > chunk and stderr_is_terminal() else None
    cuda = forward.device.type == "cuda"
    pending: tuple[torch.cuda.Event, int] | None = None  # the previous chunk's end, until the device is past it
    logits = None
    try:
        for start in range(0, total, chunk):
            end = min(start + chunk, total)
            logits, hidden = _chunk(forward, kv, tokens[start:end], start, chunk, capture, end == total, graphs)
            if on_chunk is not None:
                on_chunk(ids[start:end], start, hidden)
            del hidden
            if line is None:
                continue
            if not cuda:
                line.show(end)
                continue
            event = torch.cuda.Event()
            event.record()
            if pending is not None:
                pending[0].synchronize()
                line.show(pending[1])
            pending = (event, end)
    finally:
        if line is not None:
            line.close()
    kv.truncate(total)  # a padded chunk's positions past the prompt
    return logits


def _chunk(forward: ForwardPass, kv: KVStore, tokens: torch.Tensor, start: int, chunk: int, capture: Collection[int],
           last: bool, graphs: PrefillGraphs | None) -> tuple[torch.Tensor | None, dict[int, torch.Tensor]]:
    """One chunk: replayed from its bucket's graph when one serves it, else eagerly (the lm_head
    only for the ``last`` chunk). Returns its last logits (None for an eager chunk before the last)
    and the captured layers' hidden states of its tokens."""
    served = graphs.run(tokens, start, chunk, capture) if graphs is not None else None
    if served is not None:
        return served
    step = Step.at(start, tokens.numel(), forward.device)
    return forward(tokens, step, kv, last_only=True, capture=capture, logits=last)


__all__ = ["ChunkCallback", "ProgressLine", "chunked_prefill", "stderr_is_terminal"]
