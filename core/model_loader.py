"""Loading a model as a run does: ``load_model`` and the ``Implementations`` it builds from.

``Implementations.of(config, registry)`` is what a resolved config names: the linear and attention
implementations with their options, the weight format (``quantize``), and the KV store with its
options and page size. ``load_model(checkpoint, implementations, ...)`` builds a Qwen3 model and a
KV store of its own from them, each tensor read once: the engine loads its target with it, and the
draft proposer its draft model. The DFlash drafter, whose stack is not a Qwen3 model, is built from
``Implementations`` and ``open_weights``.
"""

from __future__ import annotations

from dataclasses import dataclass
from os import PathLike
from pathlib import Path
from typing import Any, Mapping

import torch

from tileinfer.checkpoint import Checkpoint, read_checkpoint
from tileinfer.config import Config
from tileinfer.interfaces import Attention, KVGeometry, KVStore, Linear, RunSpec
from tileinfer.loading import CheckpointReader
from tileinfer.memory import check_fits
from tileinfer.model import Backend, Qwen3Model
from tileinfer.model_config import ModelConfig
from tileinfer.registry import Registry, build_registry
from tileinfer.resolution import implementation_options


@dataclass(frozen=True)
class Implementations:
    """The implementations a run builds its models from, with their options (validated, defaults
    filled in), as a resolved config names them in a registry."""

    linear: type[Linear]
    attention: type[Attention]
    kv_store: type[KVStore]
    linear_options: Mapping[str, Any]
    attention_options: Mapping[str, Any]
    kv_options: Mapping[str, Any]
    quantize: str  # "none" or "int8": the weight format of the linears (an INT8 checkpoint loads as INT8 anyway)
    page_size: int  # positions per KV page

    @classmethod
    def of(cls, config: Config, registry: Registry | None = None) -> "Implementations":
        """From a resolved ``Config`` (no ``auto`` left) and the registry it was resolved with
        (default: the built-in and installed plugins)."""
        registry = registry or build_registry()
        options = {kind: implementation_options(config, kind, registry) for kind in ("linear", "attention", "kv_store")}
        return cls(registry.get("linear", config.linear), registry.get("attention", config.attention),
                   registry.get("kv_store", config.kv_store), options["linear"], options["attention"],
                   options["kv_store"], config.quantize, config.kv_page_size)

    def backend(self, quantize: str | None = None) -> Backend:
        """The linear and attention implementations a model is built from (``quantize``: this
        model's weight format, default the run's)."""
        return Backend(self.linear, self.attention, quantize or self.quantize, dict(self.linear_options),
                       dict(self.attention_options))

    def pool_positions(self, positions: int) -> int:
        """``positions`` rounded up to whole KV pages."""
        return -(-positions // self.page_size) * self.page_size

    def check_fits(self, mc: ModelConfig, *, device: torch.device, dtype: torch.dtype, positions: int,
                   quantize: str | None = None, free: int | None = None) -> None:
        """ConfigError (``memory.check_fits``) when the weights of ``mc`` (with the linear
        implementation's ``workspace_bytes``) and a KV pool of ``positions`` (in whole pages)
        exceed the free memory of ``device`` (``free``: that figure, measured when not given)."""
        quantize = quantize or self.quantize
        run = RunSpec(device=device, dtype=dtype, quantize=quantize, kv_storage=self.kv_store.storage,
                      kv_page_size=self.page_size, options=dict(self.linear_options))
        check_fits(mc, device=device, dtype=dtype, quantize=quantize, positions=self.pool_positions(positions),
                   storage=self.kv_store.storage, workspace=self.linear.workspace_bytes(run, mc.linear_shapes()),
                   free=free)

    def kv(self, mc: ModelConfig, *, device: torch.device, dtype: torch.dtype, positions: int,
           key_norm_weights: list[torch.Tensor]) -> KVStore:
        """A KV store for a model of ``mc``'s layers and heads holding ``positions`` (in whole pages)."""
        geometry = KVGeometry(mc.num_layers, mc.num_kv_heads, mc.head_dim, self.page_size,
                              self.pool_positions(positions) // self.page_size, dtype)
        return self.kv_store(geometry, device, key_norm_weights=key_norm_weights, options=dict(self.kv_options))


def open_weights(folder: str | PathLike, config, *, device: torch.device, dtype: torch.dtype,
                 quantization: str = "none") -> CheckpointReader:
    """The tensors of a safetensors checkpoint in ``folder`` whose names and shapes
    ``config.tensor_shapes()`` gives (``config`` also has ``num_layers`` and
    ``tie_word_embeddings``), served one at a time on ``device`` in ``dtype``; a context manager.
    Names and (``quantization="int8"``) the INT8 layout are checked when it opens, shapes and
    values as each tensor is read: CheckpointError naming the file and tensor."""
    return CheckpointReader(Path(folder), config, torch.device(device), dtype, quantization=quantization)


@dataclass
class ModelBundle:
    """A loaded Qwen3 model: its ``checkpoint`` (config, tokenizer, generation defaults), the
    ``model`` built from its weights, a ``kv`` store of its own, and the weight format it runs
    (``quantize``)."""

    checkpoint: Checkpoint
    model: Qwen3Model
    kv: KVStore
    quantize: str

    @property
    def config(self) -> ModelConfig:
        return self.checkpoint.config


def load_model(checkpoint: Checkpoint | str | PathLike, implementations: Implementations, *,
               device: torch.device, dtype: torch.dtype, positions: int, progress: bool = False) -> ModelBundle:
    """The Qwen3 model of ``checkpoint`` (a Checkpoint, or a folder read with ``read_checkpoint``)
    built from ``implementations`` on ``device`` in ``dtype``, with a KV store holding
    ``positions`` (at most the model's context; rounded up to whole pages, which the RoPE tables
    cover too). An INT8 checkpoint runs INT8; otherwise the linears take ``implementations.quantize``.

    Before any weight loads: a ConfigError when the weights and the KV pool do not fit in the
    free memory, a CheckpointError for a missing, extra or mis-typed tensor. Each tensor is read
    once, straight to the device, and checked (shape, finite values). ``progress``: a loading bar
    on a terminal."""
    if not isinstance(checkpoint, Checkpoint):
        checkpoint = read_checkpoint(checkpoint)
    device, mc = torch.device(device), checkpoint.config
    positions = min(positions, mc.max_positions)
    quantize = "int8" if checkpoint.quantization == "int8" else implementations.quantize
    implementations.check_fits(mc, device=device, dtype=dtype, positions=positions, quantize=quantize)
    with checkpoint.tensors(device, dtype) as reader:
        model = Qwen3Model.build(mc, reader.tensor, implementations.backend(quantize), progress=progress,
                                 positions=implementations.pool_positions(positions))
    kv = implementations.kv(mc, device=device, dtype=dtype, positions=positions,
                            key_norm_weights=[layer.attention.k_norm_weight for layer in model.layers])
    return ModelBundle(checkpoint, model, kv, quantize)


__all__ = ["Implementations", "ModelBundle", "load_model", "open_weights"]
