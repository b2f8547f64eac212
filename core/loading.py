"""Reading a Hugging Face checkpoint folder: safetensors (single or sharded), tensor by tensor,
straight to the target device, each checked against the shape config.json implies."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from tileinfer.errors import CheckpointError
from tileinfer.model_config import ModelConfig

INDEX = "model.safetensors.index.json"
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


class CheckpointReader:
    """Serves checkpoint tensors by Hugging Face name, one at a time, on ``device`` in ``dtype``.

    The constructor checks that the folder's files exist and that the set of tensor names is
    exactly what ``config`` needs; ``tensor(name)`` checks the shape, so no full host copy of the
    model is ever made.
    """

    def __init__(self, folder: Path, config: ModelConfig, device: torch.device, dtype: torch.dtype) -> None:
        self.folder, self.config, self.device, self.dtype = folder, config, device, dtype
        self.expected = config.tensor_shapes()
        self._handles: dict[Path, object] = {}
        self.where = self._locate()  # tensor name -> file
        missing = [name for name in self.expected if name not in self.where]
        if missing:
            raise CheckpointError(
                f"{folder}: tensor {missing[0]} is missing from the checkpoint"
                + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else "")
            )
        extra = [n for n in self.where if n not in self.expected and not n.endswith(IGNORED_SUFFIXES)
                 and not (n == "lm_head.weight" and config.tie_word_embeddings)]
        if extra:
            raise CheckpointError(f"{self.where[extra[0]]}: unexpected tensor {extra[0]} for a Qwen3 model "
                                  f"with {config.num_layers} layers")

    def _locate(self) -> dict[str, Path]:
        index = self.folder / INDEX
        single = self.folder / "model.safetensors"
        if index.is_file():
            try:
                weight_map = json.loads(index.read_text())["weight_map"]
            except (json.JSONDecodeError, KeyError, UnicodeDecodeError, TypeError) as exc:
                raise CheckpointError(f"{index}: not a safetensors index ({exc})") from None
            where = {name: self.folder / file for name, file in weight_map.items()}
            for file in sorted(set(where.values())):
                if not file.is_file():
                    raise CheckpointError(f"{index}: lists shard {file.name}, which is missing")
            return where
        if single.is_file():
            return {name: single for name in self._open(single).keys()}
        raise CheckpointError(f"{self.folder}: no model.safetensors or {INDEX}")

    def _open(self, file: Path):
        if file not in self._handles:
            try:
                self._handles[file] = safe_open(str(file), framework="pt", device=_device_name(self.device))
            except (SafetensorError, OSError, ValueError) as exc:
                raise CheckpointError(f"{file}: cannot read safetensors: {exc}") from None
        return self._handles[file]

    def tensor(self, name: str) -> torch.Tensor:
        file = self.where[name]
        try:
            t = self._open(file).get_tensor(name)
        except (SafetensorError, OSError, ValueError, KeyError) as exc:
            raise CheckpointError(f"{file}: cannot read tensor {name}: {exc}") from None
        if tuple(t.shape) != self.expected[name]:
            raise CheckpointError(f"{file}: tensor {name} has shape {tuple(t.shape)}, "
                                  f"config.json implies {self.expected[name]}")
        if not t.is_floating_point():
            raise CheckpointError(f"{file}: tensor {name} has dtype {t.dtype}, expected a floating-point weight")
        return t.to(self.dtype)

    def close(self) -> None:
        self._handles.clear()


def _device_name(device: torch.device) -> str:
    device = torch.device(device)
    if device.type == "cuda":
        return f"cuda:{device.index if device.index is not None else torch.cuda.current_device()}"
    return device.type
