"""A z-lab DFlash drafter checkpoint (the format of z-lab/Qwen3-8B-DFlash-b16), read for proposer=dflash.

``config.json``: ``architectures: ["DFlashDraftModel"]``, ``model_type: "qwen3"`` and the standard
Qwen3 keys of the drafter's stack (hidden size, heads, head_dim, intermediate size, layers, norms'
eps, RoPE theta, positions), ``block_size`` (top level, or inside ``dflash_config``),
``num_target_layers`` and ``dflash_config`` {``mask_token_id``, ``target_layer_ids``}; without
``target_layer_ids`` z-lab's default rule picks them (:func:`default_target_layer_ids`).

Safetensors (one file, or shards with an index), names without the ``model.`` prefix and no
embedding or lm_head (both are the target's): ``fc.weight`` ``[H, K*H]``, ``hidden_norm.weight``,
``norm.weight``, and per layer ``layers.{i}.`` + the Qwen3 decoder layer's names
(``self_attn.{q,k,v,o}_proj``, ``self_attn.{q,k}_norm``, ``mlp.{gate,up,down}_proj``,
``{input,post_attention}_layernorm``). Read with ``tileinfer.open_weights`` (shapes, NaN and inf,
truncated files: one-line errors naming the file and tensor).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tileinfer.errors import CheckpointError, ConfigError
from tileinfer.model_config import ModelConfig, read_json

ARCHITECTURE = "DFlashDraftModel"
# dflash_config keys of newer drafters that change the arithmetic; their neutral values.
NEUTRAL = {"input_embedding_scale": 1.0, "output_multiplier": 1.0, "final_logit_softcapping": None, "causal": False}


def default_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> tuple[int, ...]:
    """z-lab's rule: the middle layer for a 1-layer drafter, else ``num_draft_layers`` ids spread
    evenly over ``1 .. num_target_layers - 3`` (36 target layers, 5 draft layers: 1, 9, 17, 25, 33)."""
    if num_draft_layers == 1:
        return (num_target_layers // 2,)
    span = num_target_layers - 4
    return tuple(int(round(1 + i * span / (num_draft_layers - 1))) for i in range(num_draft_layers))


@dataclass(frozen=True)
class DFlashConfig:
    """A drafter's config.json, checked: its Qwen3 stack (``model``; its vocab_size is the target's
    vocabulary it was trained for), the block size B (B - 1 tokens proposed a pass), the target's
    layer count, the mask token and the target layers whose outputs it reads (0-based)."""

    model: ModelConfig
    block_size: int
    num_target_layers: int
    mask_token_id: int
    target_layer_ids: tuple[int, ...]
    source: str = "config.json"

    # What ``tileinfer.open_weights`` reads of a config, besides tensor_shapes().
    @property
    def num_layers(self) -> int:
        return self.model.num_layers

    @property
    def tie_word_embeddings(self) -> bool:
        return False

    def tensor_shapes(self) -> dict[str, tuple[int, ...]]:
        """The checkpoint's tensor names (no ``model.`` prefix, no embedding, no lm_head) and shapes."""
        m = self.model
        h = m.hidden_size
        shapes = {"fc.weight": (h, len(self.target_layer_ids) * h), "hidden_norm.weight": (h,), "norm.weight": (h,)}
        prefix = "model."
        for name, shape in m.tensor_shapes().items():
            if name.startswith(prefix + "layers."):
                shapes[name.removeprefix(prefix)] = shape
        return shapes

    @classmethod
    def from_folder(cls, folder: Path) -> "DFlashConfig":
        path = Path(folder) / "config.json"
        if not path.is_file():
            raise CheckpointError(f"{path}: missing (not a DFlash drafter checkpoint folder?)")
        return cls.from_dict(read_json(path), str(path))

    @classmethod
    def from_dict(cls, raw: dict, source: str = "config.json") -> "DFlashConfig":
        """Check every key read (type and range); CheckpointError naming ``source`` and the key."""
        if not isinstance(raw, dict):
            raise CheckpointError(f"{source}: expected a JSON object")
        arch = raw.get("architectures")
        if not (isinstance(arch, list) and ARCHITECTURE in arch):
            raise CheckpointError(f"{source}: architectures {arch!r} is not a DFlash drafter: proposer=dflash reads "
                                  f"z-lab's format (architectures [\"{ARCHITECTURE}\"], model_type qwen3)")
        dflash = raw.get("dflash_config", {})
        if not isinstance(dflash, dict):
            raise CheckpointError(f"{source}: dflash_config must be a JSON object, got {dflash!r}"[:200])
        # The drafter's stack is a Qwen3 decoder: the same keys, checked by the same code.
        model = ModelConfig.from_dict({**raw, "architectures": ["Qwen3ForCausalLM"]}, source)
        if raw.get("quantization_config") is not None:
            raise CheckpointError(f"{source}: quantization_config: quantized DFlash drafters are not supported "
                                  "(quantize=int8 quantizes a drafter in the model dtype at load)")
        for key, neutral in NEUTRAL.items():
            value = dflash.get(key, raw.get(key if key != "causal" else "is_causal", neutral))
            if value is not None and value != neutral:
                raise CheckpointError(f"{source}: {key}={value!r} is not supported (DFlash drafters with a "
                                      "non-causal block and no logit scaling only)")
        block = _integer(dflash.get("block_size", raw.get("block_size")), "block_size", source, low=2)
        num_target = _integer(raw.get("num_target_layers"), "num_target_layers", source, low=1)
        if "mask_token_id" not in dflash and "mask_token_id" not in raw:
            raise CheckpointError(f"{source}: dflash_config.mask_token_id is missing (the id of the mask token "
                                  "that fills the block)")
        mask = _integer(dflash.get("mask_token_id", raw.get("mask_token_id")), "dflash_config.mask_token_id",
                        source, low=0)
        if mask >= model.vocab_size:
            raise CheckpointError(f"{source}: dflash_config.mask_token_id {mask} is outside the vocabulary "
                                  f"[0, {model.vocab_size})")
        ids = dflash.get("target_layer_ids", raw.get("target_layer_ids"))
        if ids is None:
            ids = default_target_layer_ids(num_target, model.num_layers)
        if not (isinstance(ids, (list, tuple)) and ids and all(_is_int(i) for i in ids)):
            raise CheckpointError(f"{source}: dflash_config.target_layer_ids must be a non-empty list of layer "
                                  f"indices, got {ids!r}"[:200])
        bad = [i for i in ids if not 0 <= i < num_target]
        if bad:
            raise CheckpointError(f"{source}: dflash_config.target_layer_ids holds {bad[0]}, outside the target's "
                                  f"layers [0, {num_target}) (num_target_layers {num_target})")
        if len(set(ids)) != len(ids):
            raise CheckpointError(f"{source}: dflash_config.target_layer_ids {list(ids)} repeats a layer")
        return cls(model, block, num_target, mask, tuple(ids), source)

    def check_target(self, target: ModelConfig, folder: Path) -> None:
        """ConfigError (one line) when this drafter cannot serve ``target``: another hidden size,
        vocabulary or layer count (the embedding, lm_head and hidden states are the target's)."""
        m = self.model
        for what, mine, theirs in (("hidden_size", m.hidden_size, target.hidden_size),
                                   ("vocab_size", m.vocab_size, target.vocab_size),
                                   ("num_target_layers", self.num_target_layers, target.num_layers)):
            if mine != theirs:
                have = "layers" if what == "num_target_layers" else what
                raise ConfigError(f"the DFlash drafter {folder} has {what} {mine}, the target has {have} {theirs}: "
                                  "a drafter serves the target it was trained for")


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _integer(value, key: str, source: str, *, low: int) -> int:
    if value is None:
        raise CheckpointError(f"{source}: missing key {key!r}")
    if not _is_int(value) or value < low:
        raise CheckpointError(f"{source}: {key} must be an integer >= {low}, got {value!r}"[:200])
    return value


__all__ = ["ARCHITECTURE", "DFlashConfig", "default_target_layer_ids"]
