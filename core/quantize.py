"""Weight-only INT8 checkpoints (W8A16): the in-memory weight a Linear receives, the
compressed-tensors ``pack-quantized`` layout that vLLM reads, and ``tileinfer quantize``.

Format (compressed-tensors, strategy ``channel``, symmetric, 8 bits; config.json holds a
``quantization_config`` with ``quant_method: compressed-tensors``). Per quantized Linear ``X``:

- ``X.weight_packed``: int32 ``[out, ceil(in / 4)]``; word j of a row holds elements 4j..4j+3,
  element 4j+k in bits 8k..8k+7 as ``q + 128`` (the row's ``q + 128`` bytes read as little-endian
  int32 words).
- ``X.weight_scale``: ``[out, 1]``, one scale per output channel (tileinfer writes float32, so a
  checkpoint it writes loads to exactly the weights ``quantize=int8`` gives at load).
- ``X.weight_shape``: int64 ``[2]`` = ``(out, in)``.

``tileinfer quantize --model DIR --out DIR`` writes every projection of every layer (and an untied
lm_head) this way, quantized by ``backends/reference/linear.quantize_int8`` (absmax / 127 per
row); the embedding, the norms and a tied lm_head stay in the checkpoint's dtype.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from types import MappingProxyType

import torch
from torch.utils._pytree import tree_map

from tileinfer.backends.reference.linear import quantize_int8

PACKED, SCALE, SHAPE = "weight_packed", "weight_scale", "weight_shape"
COPIED_FILES = ("generation_config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                "added_tokens.json", "vocab.json", "merges.txt", "chat_template.jinja", "LICENSE")


class Int8Weight(torch.Tensor):
    """A linear weight stored as int8 rows ``q`` ``[out, in]`` and float32 scales ``scale``
    ``[out]``, standing for ``q * scale[:, None]`` in ``dtype``: what the checkpoint reader serves
    for a pre-quantized projection. Its shape, dtype and device are the weight's; ``torch.cat`` of
    Int8Weights along rows (the fused q/k/v and gate/up) stays one; any other op sees the
    dequantized weight. A Linear with ``quantize=int8`` takes ``q`` and ``scale`` as they are
    (``int8_of``), so a pre-quantized weight is never re-quantized."""

    q: torch.Tensor
    scale: torch.Tensor

    @staticmethod
    def __new__(cls, q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype):
        return torch.Tensor._make_wrapper_subclass(cls, q.shape, dtype=dtype, device=q.device, requires_grad=False)

    def __init__(self, q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> None:
        assert q.dtype == torch.int8 and q.dim() == 2, f"q must be int8 [out, in], got {q.dtype} {tuple(q.shape)}"
        assert scale.shape == (q.shape[0],) and scale.dtype == torch.float32, "scale must be float32 [out]"
        self.q, self.scale = q, scale

    def __repr__(self) -> str:
        return f"Int8Weight(shape={tuple(self.shape)}, dtype={self.dtype}, device={self.device})"

    def dequantize(self) -> torch.Tensor:
        return (self.q.float() * self.scale[:, None]).to(self.dtype)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.ops.aten.cat.default and all(isinstance(t, Int8Weight) for t in args[0]) and \
                (args[1] if len(args) > 1 else kwargs.get("dim", 0)) in (0, -2):
            parts = args[0]
            return Int8Weight(torch.cat([t.q for t in parts]), torch.cat([t.scale for t in parts]), parts[0].dtype)
        if func in (torch.ops.aten.detach.default, torch.ops.aten.alias.default):
            return args[0]

        def plain(t):
            return t.dequantize() if isinstance(t, Int8Weight) else t

        return func(*tree_map(plain, args), **tree_map(plain, kwargs))


def int8_of(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(q, scale)`` of a weight for a Linear with ``quantize=int8``: an Int8Weight's own (contiguous),
    else ``quantize_int8(weight)`` (int8 ``[out, in]``, float32 ``[out]``)."""
    if isinstance(weight, Int8Weight):
        return weight.q.contiguous(), weight.scale.contiguous()
    return quantize_int8(weight)


def unquantized(weight: torch.Tensor) -> tuple[torch.Tensor, None]:
    """``(weight, None)`` for a Linear with ``quantize=none``: the weight as it is (contiguous)."""
    return weight.contiguous(), None


# The weight formats of a Linear (its ``quantize``): what each stores for a checkpoint weight, as the
# ``(weight, scale)`` the backends' ``linear(x, weight, scale)`` takes (scale None: the model dtype).
WEIGHT_FORMATS: Mapping[str, Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor | None]]] = MappingProxyType(
    {"none": unquantized, "int8": int8_of})


# -- the pack-quantized layout ---------------------------------------------------------------------


def pack_int8(q: torch.Tensor) -> torch.Tensor:
    """int8 ``[out, in]`` -> int32 ``[out, ceil(in / 4)]``: ``q + 128`` bytes, four a word,
    little-endian (element 4j + k in bits 8k..8k+7 of word j); a partial last word is padded with 0."""
    u = q.contiguous().view(torch.uint8) ^ 0x80  # q + 128 (mod 256)
    pad = -q.shape[1] % 4
    if pad:
        u = torch.cat([u, torch.zeros(q.shape[0], pad, dtype=torch.uint8, device=u.device)], dim=1)
    return u.contiguous().view(torch.int32)  # torch's tensors are little-endian on every supported device


def unpack_int8(packed: torch.Tensor, columns: int) -> torch.Tensor:
    """The inverse of :func:`pack_int8`: int32 ``[out, ceil(columns / 4)]`` -> int8 ``[out, columns]``."""
    u = packed.contiguous().view(torch.uint8)[:, :columns]
    return (u ^ 0x80).view(torch.int8).contiguous()


def quantization_config(ignore: list[str]) -> dict:
    """The ``quantization_config`` of a tileinfer W8A16 checkpoint, as compressed-tensors writes it
    (keys sorted) for one group of channel-wise symmetric int8 weights over every Linear."""
    weights = {"actorder": None, "block_structure": None, "dynamic": False, "group_size": None, "num_bits": 8,
               "observer": "minmax", "observer_kwargs": {}, "strategy": "channel", "symmetric": True, "type": "int"}
    group = {"format": "pack-quantized", "input_activations": None, "output_activations": None,
             "targets": ["Linear"], "weights": weights}
    return {"config_groups": {"group_0": group}, "format": "pack-quantized", "global_compression_ratio": None,
            "ignore": ignore, "kv_cache_scheme": None, "quant_method": "compressed-tensors",
            "quantization_status": "compressed", "sparsity_config": {}, "transform_config": {}}


def quantized_modules(mc) -> list[str]:
    """The Linear modules a tileinfer checkpoint of ``mc`` (a ModelConfig) stores in INT8."""
    names = [f"model.layers.{n}.{m}" for n in range(mc.num_layers)
             for m in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                       "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")]
    return names if mc.tie_word_embeddings else names + ["lm_head"]


def quantize_checkpoint(model: Path, out: Path, *, progress: bool = False) -> Path:
    """Write ``out``: the checkpoint ``model`` with its linears in W8A16 pack-quantized form (one
    ``model.safetensors``), config.json with the ``quantization_config``, and the tokenizer,
    generation and licence files copied. ``model`` is read and checked as the engine reads it
    (CheckpointError naming the file and tensor otherwise); a checkpoint already quantized is
    refused. ``out`` is written whole or not at all (``atomic_folder.written_in_place``: checked
    before any weight is read, filled beside it, renamed into place when complete); config.json
    is written last, so that the temporary folder of an interrupted run is no checkpoint."""
    from safetensors.torch import save_file
    from tqdm.auto import tqdm

    from tileinfer.atomic_folder import check_destination, written_in_place
    from tileinfer.errors import UsageError
    from tileinfer.loading import CheckpointReader
    from tileinfer.model_config import read_config

    model, out = Path(model), Path(out)
    raw, mc, stored = read_config(model)
    if stored != "none":
        raise UsageError(f"{model / 'config.json'}: the checkpoint is already quantized ({stored})")
    check_destination(out)
    dtype = {"float16": torch.float16, "float32": torch.float32}.get(raw.get("torch_dtype") or raw.get("dtype"),
                                                                    torch.bfloat16)
    quantized = set(quantized_modules(mc))
    with CheckpointReader(model, mc, torch.device("cpu"), torch.float32, quantization=stored) as reader, \
            written_in_place(out) as folder:
        tensors: dict[str, torch.Tensor] = {}
        for name in tqdm(list(reader.expected), desc="quantizing", disable=not progress or None, leave=False):
            w = reader.tensor(name)
            module = name.removesuffix(".weight")
            if module in quantized:
                q, scale = quantize_int8(w)
                tensors[f"{module}.{PACKED}"] = pack_int8(q)
                tensors[f"{module}.{SCALE}"] = scale[:, None].contiguous()
                tensors[f"{module}.{SHAPE}"] = torch.tensor(list(w.shape), dtype=torch.int64)
            else:
                tensors[name] = w.to(dtype).contiguous()
        save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
        for file in COPIED_FILES:
            if (model / file).is_file():
                shutil.copyfile(model / file, folder / file)
        raw["quantization_config"] = quantization_config([] if "lm_head" in quantized else ["lm_head"])
        (folder / "config.json").write_text(json.dumps(raw, indent=2, sort_keys=True) + "\n")
    return out


__all__ = ["WEIGHT_FORMATS", "Int8Weight", "int8_of", "pack_int8", "quantization_config", "quantize_checkpoint",
           "quantized_modules", "unpack_int8", "unquantized"]
