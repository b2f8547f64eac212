"""Programmatic dependent launch (PDL, Hopper sm_90 and newer): when to use it, and how to launch.

Contract. A kernel launched with PDL (the launch option ``launch_pdl=True``) may start while the
kernel before it in the stream is still running, as soon as every program of that kernel has called
``gdc_launch_dependents()`` (or exited); our kernels call it first thing, under their ``PDL``
constexpr, except the attention-input kernel, which calls it after its wait so that the decode
attention's grid is placed only once the qkv GEMV has finished (attention_inputs.py), and the
GEMVs with a ``late_launch`` config, which call it after their K loop (linear_gemv.py). Until it calls
``gdc_wait()``, such a kernel may only read data that no kernel of the stream writes (weights, norm
weights: anything immutable while the model runs); it must call ``gdc_wait()``, which returns once
the kernel before has completed and its writes are visible, before it reads anything an earlier
kernel may have written (activations, positions, the block table, KV pages, scratch) and before any
global store (a store could overwrite what an earlier kernel still reads). Since that kernel itself
waited for the one before it, the wait covers every earlier kernel, provided that every program of
every PDL-launched kernel waits (no program may return before it has waited). A kernel not launched
with PDL (torch's kernels, or ours with ``pdl=False``) simply starts after its predecessor
completes, as usual, and its own successor may still be PDL-launched. Results are the same bits
either way: only the launch order changes.
"""

from __future__ import annotations

import functools

import torch

from tileinfer.backends.triton.interpreter import interpreting


@functools.lru_cache(maxsize=None)
def pdl_supported(device: torch.device) -> bool:
    """Programmatic dependent launch: a CUDA device of compute capability 9.0 or newer, compiled
    (not under TRITON_INTERPRET=1)."""
    device = torch.device(device)
    return device.type == "cuda" and not interpreting() and torch.cuda.get_device_capability(device)[0] >= 9


def use_pdl(pdl: bool, device: torch.device) -> bool:
    """A launcher's ``pdl`` request, granted only where :func:`pdl_supported`: the value of the
    kernel's ``PDL`` constexpr and of :func:`launch_options`' argument."""
    return bool(pdl) and pdl_supported(device)


def launch_options(pdl: bool) -> dict:
    """Extra launch keyword arguments of a Triton kernel: ``{"launch_pdl": True}`` with PDL, else
    ``{}`` (never pass ``launch_pdl`` under the interpreter)."""
    return {"launch_pdl": True} if pdl else {}


__all__ = ["launch_options", "pdl_supported", "use_pdl"]
