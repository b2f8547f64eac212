"""Reading a Hugging Face checkpoint folder: safetensors (single or sharded), tensor by tensor,
straight to the target device, each checked against the shape config.json implies.

A checkpoint whose config.json has a compressed-tensors W8A16 ``quantization_config``
(``model_config.quantization_of``) may store each linear ``X`` as ``X.weight_packed`` (int32,
pack-quantized) or an int8 ``X.weight`` (naive-/int-quantized), with ``X.weight_scale`` (one scale
per output channel) and optionally ``X.weight_shape``; ``tensor("X.weight")`` then serves an
:class:`~tileinfer.quantize.Int8Weight`. Names, dtypes and shapes of those tensors are checked
when the reader is built, before any weight loads.
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path, PurePosixPath

import torch
from safetensors import SafetensorError, safe_open

from tileinfer.errors import CheckpointError
from tileinfer.model_config import ModelConfig, one_line, read_json, read_quantization
from tileinfer.quantize import PACKED, SCALE, SHAPE, Int8Weight, unpack_int8

INDEX = "model.safetensors.index.json"
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


class CheckpointReader:
    """Serves checkpoint tensors by Hugging Face name, one at a time, on ``device`` in ``dtype``.

    The constructor checks that the folder's files exist and that the set of tensor names is
    exactly what ``config`` needs; ``tensor(name)`` checks the shape, so no full host copy of the
    model is ever made. ``quantization``: the checkpoint's weight format (``"int8"`` or
    ``"none"``; None: read from its config.json). A context manager: leaving it closes the files.
    """

    def __init__(self, folder: Path, config: ModelConfig, device: torch.device, dtype: torch.dtype, *,
                 quantization: str | None = None) -> None:
        self.folder, self.config, self.device, self.dtype = folder, config, device, dtype
        self.expected = config.tensor_shapes()
        self._handles: dict[Path, object] = {}
        self.where = self._locate()  # tensor name -> file
        self.quantization = read_quantization(folder) if quantization is None else quantization
        self.int8 = self._int8_layout()  # "X.weight" -> "packed" | "int8", for the quantized linears
        companions = {f"{n.removesuffix('.weight')}.{part}" for n in self.int8 for part in (PACKED, SCALE, SHAPE)}
        missing = [name for name in self.expected if name not in self.where and name not in self.int8]
        if missing:
            raise CheckpointError(
                f"{folder}: tensor {missing[0]} is missing from the checkpoint"
                + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else "")
            )
        extra = [n for n in self.where if n not in self.expected and not n.endswith(IGNORED_SUFFIXES)
                 and not (n == "lm_head.weight" and config.tie_word_embeddings) and n not in companions]
        if extra:
            raise CheckpointError(f"{self.where[extra[0]]}: unexpected tensor {extra[0]} for a Qwen3 model "
                                  f"with {config.num_layers} layers")

    def _locate(self) -> dict[str, Path]:
        index = self.folder / INDEX
        single = self.folder / "model.safetensors"
        if index.is_file():
            where = {name: self.folder / file for name, file in _weight_map(index).items()}
            for file in sorted(set(where.values())):
                if not file.is_file():
                    raise CheckpointError(f"{index}: lists shard {file.name}, which is missing")
            return where
        if single.is_file():
            return {name: single for name in self._open(single).keys()}
        raise CheckpointError(f"{self.folder}: no model.safetensors or {INDEX}")

    def _int8_layout(self) -> dict[str, str]:
        """Which linear weights the checkpoint stores in INT8, and how; checked from the headers
        (and the tiny ``weight_shape`` tensors), so that a bad quantized tensor fails before any
        weight loads."""
        quantized = {n for n in self.where if n.endswith((f".{PACKED}", f".{SCALE}", ".weight_zero_point",
                                                         ".weight_g_idx"))}
        if self.quantization != "int8":
            if quantized:
                name = sorted(quantized)[0]
                raise CheckpointError(f"{self.where[name]}: tensor {name} is quantized, but config.json has no "
                                      "quantization_config (compressed-tensors W8A16)")
            return {}
        layout = {}
        for name, shape in self.expected.items():
            module = name.removesuffix(".weight")
            if len(shape) != 2 or name == "model.embed_tokens.weight":
                continue
            for extra in ("weight_zero_point", "weight_g_idx"):
                if f"{module}.{extra}" in self.where:
                    raise CheckpointError(f"{self.where[f'{module}.{extra}']}: tensor {module}.{extra}: asymmetric or "
                                          "activation-ordered int8 weights are not supported (symmetric, per channel)")
            packed, scale = f"{module}.{PACKED}", f"{module}.{SCALE}"
            if packed in self.where:
                self._check_header(packed, ("I32",), (shape[0], -(-shape[1] // 4)))
                kind = "packed"
            elif name in self.where and self._header(name)[0] == "I8":
                self._check_header(name, ("I8",), shape)
                kind = "int8"
            else:
                if scale in self.where:
                    raise CheckpointError(f"{self.where[scale]}: tensor {scale} has no int8 weight beside it "
                                          f"({packed} or an int8 {name})")
                continue  # a module left unquantized (quantization_config's ignore list): model dtype
            if scale not in self.where:
                raise CheckpointError(f"{self.where[packed if kind == 'packed' else name]}: the int8 weight of {module} "
                                      f"has no scales (tensor {scale} is missing)")
            dtype, scale_shape = self._header(scale)
            if dtype not in ("F32", "F16", "BF16", "F64") or tuple(scale_shape) not in ((shape[0], 1), (shape[0],)):
                raise CheckpointError(f"{self.where[scale]}: tensor {scale} is {dtype} {list(scale_shape)}, expected a "
                                      f"float [{shape[0]}, 1] (one scale per output channel; group-wise scales are "
                                      "not supported)")
            if f"{module}.{SHAPE}" in self.where:
                stored = self._read(f"{module}.{SHAPE}")
                if stored.numel() != 2 or tuple(int(v) for v in stored.flatten()) != shape:
                    raise CheckpointError(f"{self.where[f'{module}.{SHAPE}']}: tensor {module}.{SHAPE} is "
                                          f"{stored.flatten().tolist()}, config.json implies {list(shape)}")
            layout[name] = kind
        return layout

    def _header(self, name: str) -> tuple[str, list[int]]:
        """The safetensors dtype (``"I32"``, ``"BF16"``, ...) and shape of ``name``, from the header."""
        file = self.where[name]
        try:
            piece = self._open(file).get_slice(name)
            return str(piece.get_dtype()), list(piece.get_shape())
        except (SafetensorError, OSError, ValueError, KeyError, RuntimeError) as exc:
            raise CheckpointError(f"{file}: cannot read tensor {name}: {one_line(exc)}") from None

    def _check_header(self, name: str, dtypes: tuple[str, ...], shape: tuple[int, ...]) -> None:
        dtype, stored = self._header(name)
        if dtype not in dtypes or tuple(stored) != tuple(shape):
            raise CheckpointError(f"{self.where[name]}: tensor {name} is {dtype} {stored}, expected "
                                  f"{'/'.join(dtypes)} {list(shape)} (config.json's shape)")

    def _read(self, name: str) -> torch.Tensor:
        file = self.where[name]
        try:
            return self._open(file).get_tensor(name)
        except (SafetensorError, OSError, ValueError, KeyError, RuntimeError) as exc:
            raise CheckpointError(f"{file}: cannot read tensor {name}: {one_line(exc)}") from None

    def _int8_tensor(self, name: str) -> Int8Weight:
        """The INT8 linear weight ``name``: int8 rows unpacked and float32 scales on the device."""
        module, (rows, columns) = name.removesuffix(".weight"), self.expected[name]
        if self.int8[name] == "packed":
            q = unpack_int8(self._read(f"{module}.{PACKED}"), columns)
        else:
            q = self._read(name).contiguous()
        scale_name = f"{module}.{SCALE}"
        scale = self._read(scale_name).reshape(rows).to(torch.float32).contiguous()
        if not bool(torch.isfinite(scale).all()):
            raise CheckpointError(f"{self.where[scale_name]}: tensor {scale_name} holds non-finite values (NaN or inf)")
        return Int8Weight(q, scale, self.dtype)

    def _open(self, file: Path):
        if file not in self._handles:
            try:
                self._handles[file] = safe_open(str(file), framework="pt", device=_device_name(self.device))
            except (SafetensorError, OSError, ValueError) as exc:
                raise CheckpointError(f"{file}: cannot read safetensors: {_diagnose(file) or one_line(exc)}") from None
        return self._handles[file]

    def tensor(self, name: str) -> torch.Tensor:
        """The tensor ``name`` on the device in the model dtype; CheckpointError naming the file and
        tensor if it cannot be read, has another shape than config.json implies, is not floating
        point, or holds a NaN or an infinity (in the checkpoint, or once cast to the model dtype).
        A linear stored in INT8 comes as an :class:`~tileinfer.quantize.Int8Weight`."""
        if name in self.int8:
            return self._int8_tensor(name)
        file = self.where[name]
        try:
            t = self._open(file).get_tensor(name)
        except (SafetensorError, OSError, ValueError, KeyError, RuntimeError) as exc:
            raise CheckpointError(f"{file}: cannot read tensor {name}: {one_line(exc)}") from None
        if tuple(t.shape) != self.expected[name]:
            raise CheckpointError(f"{file}: tensor {name} has shape {tuple(t.shape)}, "
                                  f"config.json implies {self.expected[name]}")
        if not t.is_floating_point():
            raise CheckpointError(f"{file}: tensor {name} has dtype {t.dtype}, expected a floating-point weight")
        out = t.to(self.dtype)
        # One reduction per tensor (one host sync on a GPU: negligible at load). A NaN or inf in
        # any weight makes every logit NaN, and sampling would then end at once as if at EOS.
        if not bool(torch.isfinite(out).all()):
            if t.dtype != out.dtype and bool(torch.isfinite(t.to(torch.float32)).all()):
                raise CheckpointError(f"{file}: tensor {name} overflows {str(self.dtype).removeprefix('torch.')} "
                                      f"(its {str(t.dtype).removeprefix('torch.')} values are too large)")
            raise CheckpointError(f"{file}: tensor {name} holds non-finite values (NaN or inf)")
        return out

    def close(self) -> None:
        self._handles.clear()

    def __enter__(self) -> "CheckpointReader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _device_name(device: torch.device) -> str:
    device = torch.device(device)
    if device.type == "cuda":
        return f"cuda:{device.index if device.index is not None else torch.cuda.current_device()}"
    return device.type


def _weight_map(index: Path) -> dict[str, str]:
    """The ``weight_map`` of a safetensors index: tensor name -> shard file name in the folder."""
    raw = read_json(index)
    if not isinstance(raw, dict) or "weight_map" not in raw:
        raise CheckpointError(f"{index}: not a safetensors index (no weight_map)")
    weight_map = raw["weight_map"]
    if not isinstance(weight_map, dict):
        raise CheckpointError(f"{index}: weight_map must be a JSON object (tensor name -> file name), "
                              f"got {type(weight_map).__name__}")
    for name, file in weight_map.items():
        if not isinstance(file, str) or not file:
            raise CheckpointError(f"{index}: weight_map[{name!r}] must be a file name, got {json.dumps(file)[:60]}")
        parts = PurePosixPath(file.replace("\\", "/")).parts
        if file.startswith(("/", "\\")) or ".." in parts or (parts and ":" in parts[0]):
            raise CheckpointError(f"{index}: weight_map[{name!r}] names {file!r}, outside the checkpoint folder")
    return weight_map


_DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1, "I64": 8, "I32": 4,
                "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}


def _diagnose(file: Path) -> str | None:
    """Why safetensors refused ``file``, naming the tensor where its header is readable: data
    cut short (a truncated download) or offsets that do not match the dtype and shape."""
    try:
        with open(file, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                return f"{len(head)} bytes, too short for a header"
            size = struct.unpack("<Q", head)[0]
            total = file.stat().st_size
            if size > total - 8:
                return f"its header claims {size} bytes, the file has {total} (truncated or not safetensors)"
            header = json.loads(f.read(size))
    except (OSError, ValueError, RecursionError):
        return None
    if not isinstance(header, dict):
        return None
    data = total - 8 - size
    for name, info in header.items():
        if name == "__metadata__" or not isinstance(info, dict):
            continue
        try:
            start, end = (int(x) for x in info["data_offsets"])
            need = math.prod(int(d) for d in info["shape"]) * _DTYPE_BYTES.get(info["dtype"], 0)
        except (KeyError, TypeError, ValueError):
            return f"corrupt header: tensor {name} has no valid dtype, shape and data_offsets"
        if end > data:
            return f"truncated: tensor {name} needs bytes [{start}, {end}) of data, the file holds {data}"
        if need and end - start != need:
            return (f"corrupt header: tensor {name} ({info['dtype']} {info['shape']}) spans {end - start} bytes, "
                    f"not {need}")
    return None


def resolve_quantize(requested: str, stored: str, folder: Path) -> str:
    """The ``quantize`` a run of the checkpoint in ``folder``, whose weights are ``stored``
    (``int8`` for a compressed-tensors W8A16 checkpoint, else ``none``), uses: ``auto`` takes the
    checkpoint's; ``int8`` quantizes a model-dtype checkpoint at load; ``none`` with an INT8
    checkpoint is a CheckpointError (its weights exist only in INT8)."""
    if requested == "auto":
        return stored
    if requested == "none" and stored == "int8":
        raise CheckpointError(f"{folder / 'config.json'}: the checkpoint's weights are INT8 (compressed-tensors W8A16 "
                              "quantization_config) and run with quantize=int8, not quantize=none")
    return requested
