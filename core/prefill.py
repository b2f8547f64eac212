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

On a terminal (``progress`` and stderr a TTY), a prompt of more than one chunk shows a tqdm line
``prefill 8192/32768 tokens`` on stderr, updated as the device finishes each chunk (on a GPU the
host waits for chunk ``i`` only after it enqueued chunk ``i + 1``, so the device never idles for
it) and erased when the prefill is over.

Given ``scores`` (``tileinfer.prompt_logprobs.PromptScores``: the prompt's log-probabilities were
asked for) every chunk runs eagerly with every row's logits, at most ``SCORING_CHUNK`` tokens, and
is reduced to the requested values before the next one runs.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Collection, Sequence

import torch
from tqdm.auto import tqdm

from tileinfer.interfaces import ForwardPass, KVStore, Step
from tileinfer.prefill_graphs import PrefillGraphs
from tileinfer.prompt_logprobs import SCORING_CHUNK, PromptScores

ChunkCallback = Callable[[list[int], int, dict[int, torch.Tensor]], None]


def progress_line(total: int, shown: bool) -> tqdm:
    """``prefill DONE/TOTAL tokens`` on stderr when ``shown`` and stderr is a terminal (tqdm's
    check), redrawn at every update and erased at ``close``."""
    shown = shown and sys.stderr is not None  # started with stderr closed: nowhere to show it
    return tqdm(total=total, bar_format="prefill {n}/{total} tokens", leave=False, mininterval=0, miniters=1,
                disable=None if shown else True)


@torch.inference_mode()
def chunked_prefill(forward: ForwardPass, kv: KVStore, ids: Sequence[int], *, chunk: int,
                    capture: Collection[int] = (), on_chunk: ChunkCallback | None = None,
                    progress: bool = False, graphs: PrefillGraphs | None = None,
                    start: int = 0, scores: PromptScores | None = None) -> torch.Tensor:
    """Run the prompt ``ids`` from position ``start`` (the KV store holding ``ids[:start]`` at
    least, ``0 <= start < len(ids)``; what it holds past ``start`` is dropped) in steps of at most
    ``chunk`` tokens; returns the float32 logits ``[1, V]`` after its last token, on the device
    (not read).

    ``capture``: the decoder layers whose outputs ``on_chunk(tokens, start, hidden)`` receives
    after each chunk (``tokens`` the chunk's ids, at positions ``start ..``; ``hidden`` ``[len(tokens),
    hidden_size]`` per layer). ``progress``: show the progress line when stderr is a terminal and the
    prompt takes more than one chunk. ``graphs``: the prefill graphs to replay the chunks from (None:
    every chunk eagerly). ``scores``: filled with the prompt's logprobs, chunk by chunk (see the
    module; from ``start``, which must then be 0).
    The KV store ends holding exactly the prompt (``kv.length == len(ids)``). A proposer fed by
    ``on_chunk`` sees the chunks from ``start`` only.
    """
    if chunk < 1:
        raise ValueError(f"chunk must be >= 1, got {chunk}")
    ids = list(ids)
    total = len(ids)
    if scores is not None:
        assert start == 0, "a scored prompt is prefilled whole"
        chunk, graphs = min(chunk, SCORING_CHUNK), None
    if not 0 <= start < total or start > kv.length:
        raise ValueError(f"a prefill from {start} of {total} tokens needs the store to hold {start}, not {kv.length}")
    kv.truncate(start)  # positions past it are the prompt's to write
    kv.reserve(total)
    tokens = torch.tensor(ids, dtype=torch.int64, device=forward.device)
    line = progress_line(total - start, progress and total - start > chunk)
    cuda = forward.device.type == "cuda"
    pending: tuple[torch.cuda.Event, int] | None = None  # the previous chunk's end, until the device is past it
    logits = None
    try:
        for first in range(start, total, chunk):
            end = min(first + chunk, total)
            if scores is None:
                logits, hidden = _chunk(forward, kv, tokens[first:end], first, chunk, capture, end == total, graphs)
            else:
                logits, hidden = forward(tokens[first:end], Step.at(first, end - first, forward.device), kv,
                                         capture=capture)
                scores.add(first, logits)
                logits = logits[-1:].clone()  # the chunk's [T, V] is freed before the next one runs
            if on_chunk is not None:
                on_chunk(ids[first:end], first, hidden)
            del hidden
            if line.disable:
                continue
            if not cuda:
                line.update(end - start - line.n)
                continue
            event = torch.cuda.Event()
            event.record()
            if pending is not None:
                pending[0].synchronize()
                line.update(pending[1] - line.n)
            pending = (event, end - start)
    finally:
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


__all__ = ["ChunkCallback", "chunked_prefill", "progress_line"]
