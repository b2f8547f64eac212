"""A Hugging Face Qwen3 checkpoint folder, its small files each read once.

``read_checkpoint(folder)`` reads config.json (the model's hyperparameters and its weight format)
and generation_config.json (its EOS ids and sampling defaults), once each, and checks them. The
tokenizer (tokenizer.json, with tokenizer_config.json or chat_template.jinja) is built the first
time ``Checkpoint.tokenizer`` is read, once per Checkpoint. The weights are read by
``Checkpoint.tensors``, tensor by tensor, with no second read of config.json.

``model_folder(config)`` is the folder a run config names (``model``, or the shipped model).
"""

from __future__ import annotations

import importlib.resources
from dataclasses import dataclass, field, replace
from functools import cached_property
from os import PathLike
from pathlib import Path
from typing import Any, Mapping

import torch

from tileinfer.errors import ConfigError
from tileinfer.loading import CheckpointReader
from tileinfer.model_config import ModelConfig, eos_ids, read_config, read_json
from tileinfer.sampling_defaults import sampling_of
from tileinfer.tokenizer import Tokenizer

GENERATION_CONFIG = "generation_config.json"


@dataclass(frozen=True)
class Checkpoint:
    """What a checkpoint folder says about its model, read once.

    ``config``: config.json, checked, with the EOS ids of generation_config.json where it has them.
    ``quantization``: ``"int8"`` for a compressed-tensors W8A16 checkpoint, else ``"none"``.
    ``generation``: generation_config.json as read (None without the file); ``sampling`` its
    sampling defaults (``sampling_defaults.KEYS``), checked when first read.
    ``tokenizer``: None when the folder has no tokenizer.json.
    """

    folder: Path
    config: ModelConfig
    quantization: str = "none"
    generation: Mapping[str, Any] | None = field(default=None, compare=False)

    @cached_property
    def sampling(self) -> dict[str, Any]:
        """generation_config.json's values of the sampling keys, as transformers samples with it
        (``{}`` without the file); CheckpointError naming the file and key for a bad value."""
        if self.generation is None:
            return {}
        return sampling_of(self.generation, self.folder / GENERATION_CONFIG)

    @cached_property
    def tokenizer(self) -> Tokenizer | None:
        """The tokenizer with its chat template, built on first use; None without tokenizer.json."""
        return Tokenizer.from_folder(self.folder) if (self.folder / "tokenizer.json").is_file() else None

    def tensors(self, device: torch.device, dtype: torch.dtype) -> CheckpointReader:
        """The weights, served one at a time by Hugging Face name on ``device`` in ``dtype`` (a
        context manager; see ``loading.CheckpointReader``). Its constructor checks the tensor names
        and the INT8 layout before any weight loads."""
        return CheckpointReader(self.folder, self.config, torch.device(device), dtype, quantization=self.quantization)


def read_checkpoint(folder: str | PathLike) -> Checkpoint:
    """The checkpoint in ``folder``: config.json and generation_config.json read once and checked
    (CheckpointError naming the file and key otherwise); the tokenizer and the weights are read
    when asked for."""
    folder = Path(folder)
    _, config, quantization = read_config(folder)
    generation_path = folder / GENERATION_CONFIG
    generation = read_json(generation_path) if generation_path.is_file() else None
    if generation is not None:
        eos = eos_ids(generation, str(generation_path), config.vocab_size)
        config = replace(config, eos_token_ids=eos or config.eos_token_ids)
    return Checkpoint(folder, config, quantization, generation)


def model_folder(config) -> Path:
    """The checkpoint folder ``config.model`` names (the shipped model when None), checked to exist."""
    folder = Path(config.model) if config.model is not None else shipped_model()
    if folder is None:
        raise ConfigError("no model given: pass --model DIR or model=DIR (a Hugging Face Qwen3 checkpoint "
                          "folder); the shipped model models/target is not installed (models/README.md)")
    if not folder.is_dir():
        raise ConfigError(f"model folder not found: {folder}")
    return folder


def shipped_model() -> Path | None:
    """The small model trained for tileinfer (``tileinfer.models``: models/target in the
    repository, installed with the package), if present."""
    try:
        folder = Path(str(importlib.resources.files("tileinfer.models") / "target"))
    except ModuleNotFoundError:  # installed without its models
        return None
    return folder if (folder / "config.json").is_file() else None


__all__ = ["Checkpoint", "model_folder", "read_checkpoint", "shipped_model"]
