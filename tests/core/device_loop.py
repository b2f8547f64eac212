"""Helpers of the device-loop tests: an engine whose decoder has the device-resident speculative
loop (the engine builds it on CUDA only), a stand-in graph capture, a guard against host reads of
device values, and the KV poisoning that shows which cached positions a step reads."""

from __future__ import annotations

import contextlib
import dataclasses

import torch

import tileinfer
from conftest import reference_engine
from tileinfer.decoding import Decoder
from tileinfer.device_speculation import SpeculativeLoop


def rerun_capture(fn, pool):
    """Stand-in for cuda_graph_capture on a CPU: the capture runs ``fn`` once (as a warm-up does)
    and a replay re-runs it; the loop keeps its state in static buffers, so nothing else is needed."""
    fn()
    return fn, None


def with_loop(engine: tileinfer.Engine, *, capture=None) -> tileinfer.Engine:
    """Put a Decoder with the device loop in place, built as the engine builds it on CUDA
    (``capture``: None eager, or a stand-in capture)."""
    config = engine.config
    k_values = range(1, config.spec_k + 1) if config.spec_adaptive else [config.spec_k]
    loop = SpeculativeLoop(engine.model, engine.kv, engine.proposer, k_values, capture=capture)
    engine.decoder = Decoder(engine.model, engine.kv, engine.sampler, engine.decoder.steps, proposer=engine.proposer,
                             spec_k=config.spec_k, spec_adaptive=config.spec_adaptive, loop=loop,
                             prefill_chunk=config.prefill_chunk)
    return engine


def device_engine(folder, *, capture=None, **keys) -> tileinfer.Engine:
    return with_loop(reference_engine(folder, **keys), capture=capture)


def with_eos(engine: tileinfer.Engine, token: int | None) -> tileinfer.Engine:
    if token is not None:
        engine.model_config = dataclasses.replace(engine.model_config, eos_token_ids=(token,))
    return engine


def first_new_token(tokens: list[int], index: int) -> tuple[int, int]:
    """A token of ``tokens`` first seen at ``index`` or later (an EOS that stops there), and where."""
    for i in range(index, len(tokens)):
        if tokens[i] not in tokens[:i]:
            return tokens[i], i
    raise AssertionError(f"every token after index {index} occurs earlier: {tokens}")


class HostRead(AssertionError):
    pass


@contextlib.contextmanager
def no_host_reads():
    """Make every Python-level read of a tensor's value on the host (``item``, ``tolist``, ``int``,
    ``float``, ``bool``, ``__index__``) raise: on a GPU each is a sync, and inside a CUDA graph a
    value frozen at capture."""
    names = ("item", "tolist", "__int__", "__float__", "__bool__", "__index__")
    saved = {name: getattr(torch.Tensor, name) for name in names}

    def refuse(name):
        def call(self, *args, **kwargs):
            raise HostRead(f"Tensor.{name} read a device value on the host inside a device-loop step")
        return call

    for name in names:
        setattr(torch.Tensor, name, refuse(name))
    try:
        yield
    finally:
        for name, fn in saved.items():
            setattr(torch.Tensor, name, fn)


def guard_steps(loop: SpeculativeLoop) -> list[int]:
    """Run each of ``loop``'s steps under ``no_host_reads``; returns the list of k it stepped with."""
    ks, step = [], loop.step

    def guarded(k):
        ks.append(k)
        with no_host_reads():
            return step(k)

    loop.step = guarded
    return ks


def poison_unread_positions(loop: SpeculativeLoop, stores) -> None:
    """Before each step, fill the positions from ``length - back`` on (and every page not reserved)
    of each ``(kv, back)`` in ``stores`` with NaN (INT8 pages: their scales): the positions the
    step writes before it reads them, and those past them. A step that reads a key or value it has
    not written itself gets non-finite logits, and the host raises."""
    step = loop.step

    def poisoned(k):
        length = int(loop.seq.length)
        for kv, back in stores:
            _poison(kv, length - back)
        return step(k)

    loop.step = poisoned


def _poison(kv, first: int) -> None:
    tensors = [kv.k_scale, kv.v_scale] if kv.storage == "int8" else [kv.k, kv.v]
    page_size, reserved = kv.page_size, kv._pages
    for p in range(first, len(reserved) * page_size):  # [layers, pages, heads, page_size, ...]
        for t in tensors:
            t[:, reserved[p // page_size], :, p % page_size] = float("nan")
    spare = [page for page in range(kv.geometry.num_pages) if page not in reserved]
    for t in tensors:
        t[:, spare] = float("nan")
