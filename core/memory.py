"""What a run will allocate, checked against what the device has free before anything is allocated.

``weight_bytes`` estimates the weights as the model holds them (the model dtype; INT8 linears take
one byte a weight plus a float32 scale a row; a linear implementation's ``workspace_bytes`` goes
beside them), ``kv_bytes`` the KV pool (keys and values of every layer for the pool's positions:
model-dtype pages, or INT8 pages with a float32 scale per cached vector).
``check_fits`` raises a ConfigError, naming both parts and the free memory, when they exceed it.
``auto_positions`` sizes the pool of ``kv_capacity=auto`` from a share of the free memory.
"""

from __future__ import annotations

import os

import torch

from tileinfer.errors import ConfigError
from tileinfer.model_config import ModelConfig

GIB = 2**30


def free_bytes(device: torch.device) -> int:
    """Free memory of ``device``: the GPU's (``cudaMemGetInfo``), or the host's available memory."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def weight_bytes(mc: ModelConfig, dtype: torch.dtype, quantize: str) -> int:
    """Bytes of the weights once loaded: the embedding and norms in ``dtype``, the linears in
    ``dtype`` or INT8 with a float32 scale per output row (the lm_head too; tied, it is a copy)."""
    size = torch.finfo(dtype).bits // 8
    total = 0
    for name, shape in mc.tensor_shapes().items():
        numel = 1
        for n in shape:
            numel *= n
        linear = len(shape) == 2 and name != "model.embed_tokens.weight"
        total += numel + 4 * shape[0] if linear and quantize == "int8" else numel * size
    if mc.tie_word_embeddings and quantize == "int8":  # the lm_head quantizes its own copy
        total += mc.vocab_size * mc.hidden_size + 4 * mc.vocab_size
    return total


def kv_bytes(mc: ModelConfig, positions: int, dtype: torch.dtype, storage: str) -> int:
    """Bytes of a KV pool holding ``positions`` positions, keys and values of every layer."""
    vectors = 2 * mc.num_layers * mc.num_kv_heads * positions
    if storage == "int8":
        return vectors * (mc.head_dim + 4)
    return vectors * mc.head_dim * (torch.finfo(dtype).bits // 8)


def activation_bytes(mc: ModelConfig, tokens: int, dtype: torch.dtype) -> int:
    """An upper estimate of the activations of one step of ``tokens`` tokens (a prefill chunk): per
    token, the residual stream and its normed copy, q/k/v, the attention output and the SwiGLU's
    gate, up and product, in ``dtype``, plus one row of float32 logits. Freed after each step."""
    size = torch.finfo(dtype).bits // 8
    qkv = (mc.num_heads + 2 * mc.num_kv_heads) * mc.head_dim
    per_token = 3 * mc.hidden_size + 2 * qkv + mc.num_heads * mc.head_dim + 3 * mc.intermediate_size
    return tokens * per_token * size + 4 * mc.vocab_size


def auto_positions(mc: ModelConfig, *, device: torch.device, dtype: torch.dtype, quantize: str, storage: str,
                   page_size: int, chunk: int, fraction: float, free: int | None = None, workspace: int = 0) -> int:
    """``kv_capacity=auto``: the model's context (``max_position_embeddings``), or, when fewer fit,
    the whole pages that ``fraction`` of the free memory of ``device`` holds after the weights (and
    ``workspace``: the linear implementation's ``workspace_bytes``) and one prefill chunk's
    activations (as vLLM sizes its pool from gpu_memory_utilization). A ConfigError when not one
    page fits. ``free``: that figure, measured when not given."""
    free = free_bytes(device) if free is None else free
    weights = weight_bytes(mc, dtype, quantize) + workspace
    activations = activation_bytes(mc, min(chunk, mc.max_positions), dtype)
    budget = int(fraction * free) - weights - activations
    per_page = kv_bytes(mc, page_size, dtype, storage)
    pages = max(budget, 0) // per_page
    if pages < 1:
        raise ConfigError(f"kv_capacity=auto: the weights ({_size(weights)}) and a prefill chunk's activations "
                          f"({_size(activations)}) leave no room for one KV page ({_size(per_page)}) in "
                          f"memory_fraction={fraction} of the {_size(free)} free on {device.type}; lower prefill_chunk"
                          + ("" if quantize == "int8" else " or set quantize=int8"))
    return min(mc.max_positions, pages * page_size)


def tensor_bytes(*roots, exclude: tuple = ()) -> int:
    """Bytes of the tensors reachable from ``roots`` (through lists, tuples, dicts and the attributes
    of objects, a few levels deep), each storage counted once; an INT8 weight counts its int8 rows
    and float32 scales. Tensors sharing a storage with one reachable from ``exclude`` are left out
    (the model's RoPE tables, held by each attention layer, are not weights)."""
    from tileinfer.quantize import Int8Weight

    seen: set[int] = set()
    total = 0

    def visit(obj, depth: int, count: bool) -> None:
        nonlocal total
        if isinstance(obj, Int8Weight):
            for t in (obj.q, obj.scale):
                visit(t, depth, count)
        elif isinstance(obj, torch.Tensor):
            storage = obj.untyped_storage()
            if storage.data_ptr() not in seen:
                seen.add(storage.data_ptr())
                total += storage.nbytes() if count else 0
        elif depth > 0 and isinstance(obj, (list, tuple)):
            for item in obj:
                visit(item, depth - 1, count)
        elif depth > 0 and isinstance(obj, dict):
            for item in obj.values():
                visit(item, depth - 1, count)
        elif depth > 0 and hasattr(obj, "__dict__") and not isinstance(obj, type):
            for item in vars(obj).values():
                visit(item, depth - 1, count)

    for root in exclude:
        visit(root, 6, False)
    for root in roots:
        visit(root, 6, True)
    return total


def _size(n: int) -> str:
    for unit, name in ((GIB, "GiB"), (2**20, "MiB")):
        if n >= unit:
            return f"{n / unit:.1f} {name}"
    return f"{n / 1024:.1f} KiB"


def check_fits(mc: ModelConfig, *, device: torch.device, dtype: torch.dtype, quantize: str, positions: int,
               storage: str, free: int | None = None, workspace: int = 0) -> None:
    """A ConfigError when the weights (with the linear implementation's ``workspace`` bytes) and a
    KV pool of ``positions`` positions exceed the free memory of ``device`` (``free``: that
    figure, measured when not given)."""
    weights, kv = weight_bytes(mc, dtype, quantize) + workspace, kv_bytes(mc, positions, dtype, storage)
    free = free_bytes(device) if free is None else free
    if weights + kv > free:
        raise ConfigError(f"the run needs {(weights + kv) / GIB:.1f} GiB on {device.type} (weights "
                          f"{weights / GIB:.1f} GiB, KV pool {kv / GIB:.1f} GiB for {positions} positions), more "
                          f"than the {free / GIB:.1f} GiB free; lower kv_capacity"
                          + ("" if quantize == "int8" else " or set quantize=int8"))


__all__ = ["activation_bytes", "auto_positions", "check_fits", "free_bytes", "kv_bytes", "tensor_bytes", "weight_bytes"]
