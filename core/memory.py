"""What a run will allocate, checked against what the device has free before anything is allocated.

``run_bytes`` estimates the weights as the model holds them (the model dtype; INT8 linears take one
byte a weight plus a float32 scale a row) and the KV pool (keys and values of every layer for the
pool's positions: model-dtype pages, or INT8 pages with a float32 scale per cached vector).
``check_fits`` raises a ConfigError, naming both parts and the free memory, when they exceed it.
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


def check_fits(mc: ModelConfig, *, device: torch.device, dtype: torch.dtype, quantize: str, positions: int,
               storage: str, free: int | None = None) -> None:
    """A ConfigError when the weights and a KV pool of ``positions`` positions exceed the free
    memory of ``device`` (``free``: that figure, measured when not given)."""
    weights, kv = weight_bytes(mc, dtype, quantize), kv_bytes(mc, positions, dtype, storage)
    free = free_bytes(device) if free is None else free
    if weights + kv > free:
        raise ConfigError(f"the run needs {(weights + kv) / GIB:.1f} GiB on {device.type} (weights "
                          f"{weights / GIB:.1f} GiB, KV pool {kv / GIB:.1f} GiB for {positions} positions), more "
                          f"than the {free / GIB:.1f} GiB free; lower kv_capacity"
                          + ("" if quantize == "int8" else " or set quantize=int8"))


__all__ = ["check_fits", "free_bytes", "kv_bytes", "weight_bytes"]
