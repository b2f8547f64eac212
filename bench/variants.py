"""The ablation matrix: the engine's default config, and that config with one feature switched off.

Each variant is a list of config items for ``tileinfer.Engine.from_config``: a shipped config
name (``tile-eager``, layered over configs/default.yaml) or a ``KEY=VALUE`` override. A variant is
config only; nothing in the engine branches on its name. ``resolve`` loads one and raises
tileinfer.errors.ConfigError when it does not load (unknown key, unregistered name); the caller
skips that variant with the reason (and does the same for a ConfigError from the Engine, e.g.
an attention that cannot read the chosen KV store's pages).
"""

from __future__ import annotations

from collections.abc import Sequence

from tileinfer.config import Config, load_config

FUSED_OFF = ["linear=triton", "attention=triton"]  # one Triton kernel per op

VARIANTS: dict[str, list[str]] = {
    "default": [],  # configs/default.yaml as it is: fused Triton kernels, CUDA graphs, pipelined
    "reference": ["reference"],  # torch ops everywhere, eager
    "unfused-refattn-eager": ["unfused-refattn-eager"],  # a Triton kernel per op, reference attention
    "unfused-eager": ["unfused-eager"],  # + paged flash attention
    "tile-eager": ["tile-eager"],  # + fused kernels
    "no-fused-kernels": FUSED_OFF,  # the default with one Triton kernel per op
    "no-fused-kernels-no-pipelining": [*FUSED_OFF, "pipelined=false"],  # the per-op CUDA-graph table's middle row
    "no-fused-linears": [FUSED_OFF[0]],  # the linears' norm, SwiGLU and residual add as kernels of their own
    "no-fused-attention": [FUSED_OFF[1]],  # the attention inputs (q/k norm, RoPE, KV write) as a kernel each
    "norm-prologue": ["linear=triton_fused_prologue"],  # + the RMSNorm in the GEMV prologue (not kept)
    "no-cuda-graphs": ["cuda_graphs=false"],
    "no-pipelining": ["pipelined=false"],
    "cublas-linears": ["linear=cublas"],  # torch (cuBLAS) matmuls between the per-op Triton kernels
    "cublas-linears-eager": ["cublas-linears"],  # tile-eager with cuBLAS linears (the seed's cuTile vs cuBLAS)
    # INT8 runs on the reference linear / attention only (so far): those rows switch them too.
    "int8": ["quantize=int8", "linear=reference"],  # weight-only INT8
    "int8-kv": ["kv_store=paged_int8", "attention=reference"],  # INT8 KV cache
    "ngram": ["proposer=ngram"],  # n-gram speculative decoding
}
QUANTIZED = ("int8", "int8-kv")  # the variants the summary table lists next to the default


def split(items: list[str]) -> tuple[list[str], list[str]]:
    """(sources, overrides) of a variant's items: ``KEY=VALUE`` strings are overrides."""
    return [i for i in items if "=" not in i], [i for i in items if "=" in i]


def engine_args(name: str, extra: Sequence[str] = ()) -> tuple[list[str], list[str]]:
    """``(sources, overrides)`` for ``Engine.from_config(*sources, overrides=overrides)``: the
    variant's items, then ``extra`` overrides of the harness (device, kv_capacity)."""
    sources, overrides = split(VARIANTS[name])
    return sources, [*overrides, *extra]


def resolve(name: str, extra: Sequence[str] = ()) -> Config:
    """The variant's resolved config; ConfigError when it does not load."""
    sources, overrides = engine_args(name, extra)
    return load_config(sources, overrides)
