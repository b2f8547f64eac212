"""Helpers of the decoding tests: decoders built as the engine builds them on CUDA (the engine
decodes eagerly on a CPU), a stand-in graph capture, guards against host reads of device values
and against CUDA syncs, and the KV poisoning that shows which cached positions a step reads."""

from __future__ import annotations

import contextlib
import dataclasses

import torch

import tileinfer
from conftest import reference_engine
from tileinfer.decode_plan import DecodePlan
from tileinfer.decoding import Decoder
from tileinfer.device_speculation import SpeculativeLoop
from tileinfer.steps import StepRunner


def rerun_capture(fn, pool):
    """Stand-in for cuda_graph_capture on a CPU: the capture runs ``fn`` once, and a replay re-runs
    it and writes the tensors it returns into the first run's (logits, hidden states, drafts), as a
    graph writes its static outputs; a step that keeps its state in static buffers returns None. A
    replay runs with the arguments of the capture, so only the static buffers carry a step's inputs."""
    outputs = fn()

    def replay():
        _copy_into(outputs, fn())

    return replay, outputs


def _copy_into(old, new) -> None:
    if isinstance(old, torch.Tensor):
        old.copy_(new)
    elif isinstance(old, dict):
        for key, value in old.items():
            _copy_into(value, new[key])
    elif isinstance(old, (tuple, list)):
        for a, b in zip(old, new):
            _copy_into(a, b)


def rows_of_calls(linear, rows: list[int] | None = None) -> list[int]:
    """The rows of each call of ``linear`` (a Linear implementation) from now on, appended to
    ``rows`` (default: a new list): its class is swapped for a subclass that records them."""
    rows, call = [] if rows is None else rows, type(linear).__call__

    class Recorded(type(linear)):
        def __call__(self, x, *args, **kw):
            rows.append(x.shape[0])
            return call(self, x, *args, **kw)

    linear.__class__ = Recorded
    return rows


def cuda_plan(engine: tileinfer.Engine, **keys) -> DecodePlan:
    """The plan ``engine``'s config (with ``keys`` replaced) gives on a CUDA device."""
    config = dataclasses.replace(engine.config, **keys)
    return DecodePlan.from_config(config, engine.proposer, torch.device("cuda"))


def rebuild(engine: tileinfer.Engine, plan: DecodePlan | None = None, *, step_capture=None, loop_capture=None,
            prefill: bool = True, prefix_cache: bool = False) -> tileinfer.Engine:
    """Put a Decoder of ``plan`` (default: the engine's plan on CUDA, ``pipelined``) in place over
    the engine's forward pass: its steps captured with ``step_capture`` (the prefill's too, unless
    ``prefill`` is False) and the device loop with ``loop_capture`` (None: eager); ``prefix_cache``
    as the Decoder takes it."""
    plan = plan or cuda_plan(engine, pipelined=True)
    forward, proposer = engine.decoder.steps.forward_pass, plan.proposer
    steps = StepRunner(forward, engine.kv, proposer.hidden_layers if proposer else (), capture=step_capture,
                       prefill=prefill)
    loop = (SpeculativeLoop(forward, engine.kv, proposer, plan.k_values, capture=loop_capture)
            if plan.strategy == "device" else None)
    engine.decoder = Decoder(steps, engine.decoder.sampler, plan, loop=loop, prefill_chunk=engine.config.prefill_chunk,
                             prefix_cache=prefix_cache)
    return engine


def with_loop(engine: tileinfer.Engine, *, capture=None) -> tileinfer.Engine:
    """The device loop in place (``capture``: None eager, or a stand-in capture)."""
    rebuild(engine, loop_capture=capture)
    assert engine.decoder.loop is not None
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


@contextlib.contextmanager
def no_sync_in(decoder: Decoder, stepper):
    """Make any synchronizing CUDA call (``.item()``, a blocking copy, ``torch.multinomial``'s
    checks) raise while ``stepper`` (the decoder's plain strategy, or its device loop) enqueues a
    step and while ``decoder`` sends a record to the host."""
    step, send = stepper.step, decoder.records.send

    def strict(fn):
        def call(*args):
            torch.cuda.set_sync_debug_mode("error")
            try:
                return fn(*args)
            finally:
                torch.cuda.set_sync_debug_mode("default")
        return call

    stepper.step, decoder.records.send = strict(step), strict(send)
    try:
        yield
    finally:
        stepper.step, decoder.records.send = step, send


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
