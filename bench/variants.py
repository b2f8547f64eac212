"""The ablation matrix: the engine's default config, and that config with features switched off.

Each variant is a list of config items for ``tileinfer.Engine.from_config``: the name of a shipped
config (``reference``, ``eager``: configs/<name>.yaml, layered over configs/default.yaml) or a
``KEY=VALUE`` override. A variant is config only; nothing in the engine branches on its name, and
each name says what the variant switches off. The Triton implementations' ablation knobs are typed
options under ``options.triton.<key>`` (one namespace shared by the Triton linear and attention).

``load`` merges a variant's items over the default config; ``resolve`` also resolves ``auto``
(device, dtype, implementation names) and validates the options. Both raise
tileinfer.errors.ConfigError when the variant does not load or cannot run here; the harness then
records the variant as skipped with that reason.
"""

from __future__ import annotations

from collections.abc import Sequence

from tileinfer.config import Config, load_config, resolve_config

EAGER = ["eager"]  # configs/eager.yaml: cuda_graphs=false, pipelined=false
NO_FUSED_LINEARS = ["options.triton.fuse_epilogue=false"]  # SwiGLU and the residual add as kernels of their own
NO_FUSED_INPUTS = ["options.triton.fuse_inputs=false"]  # q/k norm, RoPE, KV write: a kernel each
PER_OP = [*NO_FUSED_LINEARS, *NO_FUSED_INPUTS]  # one Triton kernel per op
TORCH_MATMUL = ["options.triton.matmul=torch", *NO_FUSED_LINEARS]  # cuBLAS between the Triton norm/SwiGLU/add

VARIANTS: dict[str, list[str]] = {
    "default": [],  # configs/default.yaml: fused Triton kernels, CUDA graphs, pipelined
    "reference": ["reference"],  # torch ops everywhere, eager
    "eager": EAGER,  # fused Triton kernels, eager steps
    "eager-per-op": [*EAGER, *PER_OP],
    "eager-per-op-dense-attention": [*EAGER, *PER_OP, "options.triton.attend=dense"],
    "no-fused-kernels": PER_OP,
    "no-fused-kernels-no-pipelining": [*PER_OP, "pipelined=false"],
    "no-fused-linears": NO_FUSED_LINEARS,
    "no-fused-attention-inputs": NO_FUSED_INPUTS,
    "no-cuda-graphs": ["cuda_graphs=false"],
    "no-pipelining": ["pipelined=false"],
    "no-pdl": ["options.triton.pdl=false"],  # no programmatic dependent launch
    "torch-matmul": TORCH_MATMUL,
    "eager-torch-matmul": [*EAGER, *TORCH_MATMUL],
    "int8": ["quantize=int8"],  # weight-only INT8 (W8A16)
    "int8-kv": ["kv_store=paged_int8"],  # INT8 KV cache
    "int8-int8-kv": ["quantize=int8", "kv_store=paged_int8"],  # both: the INT8 KV target with INT8 weights
    "ngram": ["proposer=ngram"],  # n-gram speculative decoding
    "persistent": ["forward=persistent"],  # decode and verify steps as one persistent kernel
    "int8-persistent": ["quantize=int8", "forward=persistent"],
}
QUANTIZED = ("int8", "int8-kv", "int8-int8-kv")  # the variants the summary table lists next to the default


def split(items: Sequence[str]) -> tuple[list[str], list[str]]:
    """(sources, overrides) of a variant's items: ``KEY=VALUE`` strings are overrides."""
    return [i for i in items if "=" not in i], [i for i in items if "=" in i]


def engine_args(name: str, extra: Sequence[str] = ()) -> tuple[list[str], list[str]]:
    """``(sources, overrides)`` for ``Engine.from_config(*sources, overrides=overrides)``: the
    variant's items, then ``extra`` overrides of the harness (device, kv_capacity)."""
    sources, overrides = split(VARIANTS[name])
    return sources, [*overrides, *extra]


def load(name: str, extra: Sequence[str] = ()) -> Config:
    """The variant's config as loaded (``auto`` not resolved); ConfigError when it does not load."""
    return load_config(*engine_args(name, extra))


def resolve(name: str, extra: Sequence[str] = ()) -> Config:
    """The variant's resolved config (``auto`` resolved, options validated); ConfigError when it
    does not load or cannot run here (the message names the key)."""
    return resolve_config(load(name, extra))
