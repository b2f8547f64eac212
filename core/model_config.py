"""ModelConfig: the Qwen3 hyperparameters read from a checkpoint's config.json, checked."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch

from tileinfer.errors import CheckpointError
from tileinfer.interfaces import AttentionSpec, RopeTable
from tileinfer.rope import YarnScaling, read_rope_type, read_yarn, rope_table

SUPPORTED_ARCHITECTURES = ("Qwen3ForCausalLM",)


@dataclass(frozen=True)
class ModelConfig:
    """``max_positions``: the model's context, ``max_position_embeddings``, or YaRN's
    ``factor * original_max_position_embeddings`` where larger (as vLLM sizes a YaRN model)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_positions: int
    tie_word_embeddings: bool
    eos_token_ids: tuple[int, ...] = ()
    yarn: YarnScaling | None = None  # YaRN RoPE scaling; None: the default RoPE

    def rope_table(self, positions: int, device: torch.device) -> RopeTable:
        """The cos/sin tables of this model's RoPE (:func:`tileinfer.rope.rope_table`), ``positions`` rows."""
        return rope_table(self.head_dim, self.rope_theta, positions, device, self.yarn)

    @property
    def attention(self) -> AttentionSpec:
        return AttentionSpec(self.num_heads, self.num_kv_heads, self.head_dim, self.rms_norm_eps)

    def tensor_shapes(self) -> dict[str, tuple[int, ...]]:
        """Hugging Face tensor names of the checkpoint and their shapes."""
        h, d, i = self.hidden_size, self.head_dim, self.intermediate_size
        shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (self.vocab_size, h), "model.norm.weight": (h,)}
        if not self.tie_word_embeddings:
            shapes["lm_head.weight"] = (self.vocab_size, h)
        for n in range(self.num_layers):
            p = f"model.layers.{n}."
            shapes.update({
                p + "input_layernorm.weight": (h,),
                p + "post_attention_layernorm.weight": (h,),
                p + "self_attn.q_proj.weight": (self.num_heads * d, h),
                p + "self_attn.k_proj.weight": (self.num_kv_heads * d, h),
                p + "self_attn.v_proj.weight": (self.num_kv_heads * d, h),
                p + "self_attn.o_proj.weight": (h, self.num_heads * d),
                p + "self_attn.q_norm.weight": (d,),
                p + "self_attn.k_norm.weight": (d,),
                p + "mlp.gate_proj.weight": (i, h),
                p + "mlp.up_proj.weight": (i, h),
                p + "mlp.down_proj.weight": (h, i),
            })
        return shapes

    def linear_shapes(self) -> dict[str, tuple[int, int]]:
        """``[rows, in_features]`` of each Linear as the model builds it: the fused ``qkv`` and
        ``gate_up`` (SwiGLU's [gate; up]), ``o_proj``, ``down`` (one of each a layer) and ``lm_head``."""
        h, d, i = self.hidden_size, self.head_dim, self.intermediate_size
        return {"qkv": ((self.num_heads + 2 * self.num_kv_heads) * d, h), "o_proj": (h, self.num_heads * d),
                "gate_up": (2 * i, h), "down": (h, i), "lm_head": (self.vocab_size, h)}

    @classmethod
    def from_folder(cls, folder: Path) -> "ModelConfig":
        """config.json of ``folder``, with the EOS ids of generation_config.json where it has them
        (``checkpoint.read_checkpoint``'s ``config``)."""
        from tileinfer.checkpoint import read_checkpoint

        return read_checkpoint(folder).config

    @classmethod
    def from_dict(cls, raw: dict, source: str = "config.json") -> "ModelConfig":
        """Check every key tileinfer reads (type and range) and build the config; CheckpointError
        naming ``source`` and the key otherwise. Keys it does not read are ignored."""
        if not isinstance(raw, dict):
            raise CheckpointError(f"{source}: expected a JSON object, got {_kind(raw)}")
        arch = raw.get("architectures")
        if arch is not None and not (isinstance(arch, list) and all(isinstance(a, str) for a in arch)):
            raise CheckpointError(f"{source}: architectures must be a list of strings, got {_show(arch)}")
        if raw.get("model_type") != "qwen3" or not any(a in SUPPORTED_ARCHITECTURES for a in arch or []):
            raise CheckpointError(
                f"{source}: unsupported architecture {arch or raw.get('model_type')!r}; "
                f"tileinfer runs dense Qwen3 models ({', '.join(SUPPORTED_ARCHITECTURES)}, model_type qwen3)"
            )
        key = _Keys(raw, source)
        key.mapping("rope_parameters"), key.mapping("rope_scaling")  # JSON objects or null
        rope_type, rope_key, rope = read_rope_type(raw, source)
        if key.flag("attention_bias", False):
            raise CheckpointError(f"{source}: attention_bias=true is not supported (Qwen3 has no biases)")
        if key.flag("use_sliding_window", False):
            raise CheckpointError(f"{source}: use_sliding_window=true is not supported")
        act = raw.get("hidden_act", "silu")
        if act != "silu":
            raise CheckpointError(f"{source}: hidden_act {act!r} is not supported (only silu)")
        layer_types = raw.get("layer_types")
        if layer_types is not None:
            if not isinstance(layer_types, list) or not all(isinstance(t, str) for t in layer_types):
                raise CheckpointError(f"{source}: layer_types must be a list of strings, got {_show(layer_types)}")
            other = [t for t in layer_types if t != "full_attention"]
            if other:
                raise CheckpointError(f"{source}: layer_types {other[0]!r} is not supported (only full_attention)")

        heads = key.integer("num_attention_heads")
        kv_heads = key.integer("num_key_value_heads", default=heads)
        if heads % kv_heads:
            raise CheckpointError(f"{source}: num_attention_heads {heads} is not a multiple of num_key_value_heads {kv_heads}")
        hidden = key.integer("hidden_size")
        if raw.get("head_dim") is None and hidden % heads:
            raise CheckpointError(f"{source}: head_dim is missing and hidden_size {hidden} is not a multiple of "
                                  f"num_attention_heads {heads}")
        head_dim = key.integer("head_dim", default=hidden // heads)
        if head_dim % 2:
            raise CheckpointError(f"{source}: head_dim {head_dim} must be even for RoPE")
        theta = key.number("rope_theta", 10000.0, low=1.0)  # older transformers' key, checked even if not used
        if rope.get("rope_theta") is not None:  # the RoPE section's (which wins, as there)
            theta = _number(rope["rope_theta"], f"{rope_key}.rope_theta", source, low=1.0)
        positions = key.integer("max_position_embeddings", default=32768)
        yarn = read_yarn(raw, rope_key, rope, source, positions, theta) if rope_type == "yarn" else None
        vocab = key.integer("vocab_size")
        eos = eos_ids(raw, source, vocab)
        return cls(
            vocab_size=vocab,
            hidden_size=hidden,
            intermediate_size=key.integer("intermediate_size"),
            num_layers=key.integer("num_hidden_layers"),
            num_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=head_dim,
            rms_norm_eps=key.number("rms_norm_eps", 1e-6, low=0.0),
            rope_theta=theta,
            max_positions=max(positions, yarn.context) if yarn else positions,
            tie_word_embeddings=key.flag("tie_word_embeddings", False),
            eos_token_ids=eos,
            yarn=yarn,
        )


QUANT_FORMATS = ("pack-quantized", "naive-quantized", "int-quantized")  # int8 weights: packed int32, or plain int8


def read_config(folder: Path) -> tuple[dict, ModelConfig, str]:
    """config.json of ``folder``, read once: its JSON object, the ModelConfig it gives (without
    generation_config.json's EOS ids) and the weight format (:func:`quantization_of`)."""
    path = folder / "config.json"
    if not path.is_file():
        raise CheckpointError(f"{path}: missing (not a Hugging Face checkpoint folder?)")
    raw = read_json(path)
    return raw, ModelConfig.from_dict(raw, str(path)), quantization_of(raw, str(path))


def read_quantization(folder: Path) -> str:
    """The weight format of the checkpoint in ``folder``: ``"int8"`` when its config.json has a
    supported ``quantization_config`` (:func:`quantization_of`), else ``"none"``."""
    return read_config(folder)[2]


def quantization_of(raw: dict, source: str) -> str:
    """``"int8"`` for a compressed-tensors W8A16 ``quantization_config`` (symmetric int8 weights,
    one scale per output channel, no activation quantization), ``"none"`` without one; anything
    else is a CheckpointError naming the key and what tileinfer reads instead."""
    qc = raw.get("quantization_config")
    if qc is None:
        return "none"
    where = f"{source}: quantization_config"
    supported = "tileinfer reads compressed-tensors W8A16 (int8 weights, one scale per output channel)"
    if not isinstance(qc, dict):
        raise CheckpointError(f"{where} must be a JSON object, got {_show(qc)}")
    if qc.get("quant_method") != "compressed-tensors":
        raise CheckpointError(f"{where}.quant_method {_show(qc.get('quant_method'))} is not supported; {supported}")
    if qc.get("quantization_status", "compressed") != "compressed":
        raise CheckpointError(f"{where}.quantization_status {_show(qc.get('quantization_status'))} is not supported "
                              "(only compressed checkpoints)")
    for key in ("sparsity_config", "transform_config", "kv_cache_scheme"):
        if qc.get(key):
            raise CheckpointError(f"{where}.{key} is not supported (got {_show(qc[key])}); {supported}")
    groups = qc.get("config_groups")
    if not isinstance(groups, dict) or not groups:
        raise CheckpointError(f"{where}.config_groups must be a non-empty JSON object, got {_show(groups)}")
    for name, group in groups.items():
        key = f"{where}.config_groups.{name}"
        if not isinstance(group, dict) or not isinstance(group.get("weights"), dict):
            raise CheckpointError(f"{key} must be a JSON object with a weights object, got {_show(group)}")
        fmt = group.get("format") or qc.get("format")
        if fmt not in QUANT_FORMATS:
            raise CheckpointError(f"{key}: format {_show(fmt)} is not supported (supported: {', '.join(QUANT_FORMATS)})")
        for act in ("input_activations", "output_activations"):
            if group.get(act) is not None:
                raise CheckpointError(f"{key}.{act}: activation quantization is not supported; {supported}")
        w = group["weights"]
        if w.get("strategy") == "group" or w.get("group_size") not in (None, -1):
            raise CheckpointError(f"{key}.weights: group-wise scales (strategy {_show(w.get('strategy'))}, group_size "
                                  f"{_show(w.get('group_size'))}) are not supported; tileinfer reads one scale per "
                                  "output channel (strategy \"channel\")")
        expected = {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "channel"}
        for field_, value in expected.items():
            if w.get(field_) != value:
                raise CheckpointError(f"{key}.weights.{field_} {_show(w.get(field_))} is not supported (needs "
                                      f"{_show(value)}); {supported}")
        if w.get("dynamic") not in (None, False) or w.get("actorder") not in (None, False):
            raise CheckpointError(f"{key}.weights: dynamic or activation-ordered weights are not supported; {supported}")
    return "int8"


# Upper bounds of the integer keys: far above every published Qwen3 checkpoint (Qwen3-235B-A22B:
# hidden 4096, 94 layers, 64 heads; vocab 151936; at most 262144 positions in the 2507 releases),
# low enough that sizes derived from them stay far from int64 overflow. Positions are bounded by
# int32 indexing (2**31); what a run allocates for them is sized by its KV capacity, not by this.
LIMITS = {
    "vocab_size": 2**24,
    "hidden_size": 2**16,
    "intermediate_size": 2**20,
    "num_hidden_layers": 2**12,
    "num_attention_heads": 2**12,
    "num_key_value_heads": 2**12,
    "head_dim": 2**12,
    "max_position_embeddings": 2**31,
}


class _Keys:
    """Typed, range-checked reads of config.json keys; CheckpointError naming the file and key."""

    def __init__(self, raw: dict, source: str) -> None:
        self.raw, self.source = raw, source

    def integer(self, key: str, *, default: int | None = None) -> int:
        value = self.raw.get(key)
        if value is None:
            if default is None:
                raise CheckpointError(f"{self.source}: missing key {key!r}")
            return default
        if not _is_int(value) or value <= 0:
            raise CheckpointError(f"{self.source}: {key} must be a positive integer, got {_show(value)}")
        if value > LIMITS[key]:
            raise CheckpointError(f"{self.source}: {key} {value} is beyond tileinfer's limit ({LIMITS[key]}; "
                                  f"a corrupt config.json?)")
        return value

    def number(self, key: str, default: float, *, low: float) -> float:
        value = self.raw.get(key)
        return default if value is None else _number(value, key, self.source, low=low)

    def flag(self, key: str, default: bool) -> bool:
        value = self.raw.get(key, default)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise CheckpointError(f"{self.source}: {key} must be true or false, got {_show(value)}")
        return value

    def mapping(self, key: str) -> dict:
        value = self.raw.get(key)
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise CheckpointError(f"{self.source}: {key} must be a JSON object or null, got {_show(value)}")
        return value


def _number(value, key: str, source: str, *, low: float) -> float:
    """A finite number above ``low`` (rms_norm_eps: > 0; rope_theta: >= 1, since below 1 the RoPE
    frequencies grow with the channel and overflow float32 angles)."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    try:
        number = float(value) if ok else math.nan
    except OverflowError:
        number = math.inf
    if not (math.isfinite(number) and (number >= low if low else number > low)):
        need = "a positive finite number" if not low else f"a finite number >= {low:g}"
        raise CheckpointError(f"{source}: {key} must be {need}, got {_show(value)}")
    return number


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def eos_ids(raw, source: str, vocab: int) -> tuple[int, ...]:
    """eos_token_id of config.json or generation_config.json: null, an id or a list of ids, each in
    the vocabulary (an id outside it would never be sampled: generation would never stop)."""
    if not isinstance(raw, dict):
        raise CheckpointError(f"{source}: expected a JSON object, got {_kind(raw)}")
    value = raw.get("eos_token_id")
    if value is None:
        return ()
    ids = value if isinstance(value, list) else [value]
    if not all(_is_int(i) for i in ids):
        raise CheckpointError(f"{source}: eos_token_id must be a token id or a list of token ids, got {_show(value)}")
    bad = [i for i in ids if not 0 <= i < vocab]
    if bad:
        raise CheckpointError(f"{source}: eos_token_id {bad[0]} is outside the vocabulary [0, {vocab})")
    return tuple(ids)


def read_json(path: Path):
    """The JSON value of ``path``; CheckpointError naming the file if it cannot be read or parsed."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise CheckpointError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except RecursionError:
        raise CheckpointError(f"{path}: not valid JSON: nested too deeply") from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, an integer of too many digits
        raise CheckpointError(f"{path}: not valid JSON: {one_line(exc)}") from None


def one_line(exc: BaseException) -> str:
    """An exception's message on one line (library errors sometimes span several)."""
    return " ".join(str(exc).split()) or type(exc).__name__


def _kind(value) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), "a number")


def _show(value) -> str:
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):  # not JSON (from_dict called from Python), an int too long to print
        text = f"a {type(value).__name__}"
    return text if len(text) <= 60 else text[:57] + "..."
