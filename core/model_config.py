"""ModelConfig: the Qwen3 hyperparameters read from a checkpoint's config.json, checked."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from tileinfer.errors import CheckpointError
from tileinfer.interfaces import AttentionSpec

SUPPORTED_ARCHITECTURES = ("Qwen3ForCausalLM",)


@dataclass(frozen=True)
class ModelConfig:
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

    @classmethod
    def from_folder(cls, folder: Path) -> "ModelConfig":
        path = folder / "config.json"
        if not path.is_file():
            raise CheckpointError(f"{path}: missing (not a Hugging Face checkpoint folder?)")
        try:
            raw = json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise CheckpointError(f"{path}: not valid JSON: {exc}") from None
        config = cls.from_dict(raw, str(path))
        eos = _eos_ids(folder / "generation_config.json") or _as_tuple(raw.get("eos_token_id"))
        return cls(**{**config.__dict__, "eos_token_ids": eos})

    @classmethod
    def from_dict(cls, raw: dict, source: str = "config.json") -> "ModelConfig":
        arch = raw.get("architectures") or []
        if raw.get("model_type") != "qwen3" or not any(a in SUPPORTED_ARCHITECTURES for a in arch):
            raise CheckpointError(
                f"{source}: unsupported architecture {arch or raw.get('model_type')!r}; "
                f"tileinfer runs dense Qwen3 models ({', '.join(SUPPORTED_ARCHITECTURES)}, model_type qwen3)"
            )

        def need(key):
            if key not in raw:
                raise CheckpointError(f"{source}: missing key {key!r}")
            return raw[key]

        rope = raw.get("rope_parameters") or {}
        scaling = raw.get("rope_scaling") or {}
        rope_type = rope.get("rope_type") or scaling.get("rope_type") or scaling.get("type") or "default"
        if rope_type != "default":
            raise CheckpointError(f"{source}: rope type {rope_type!r} is not supported (only the default RoPE)")
        if raw.get("attention_bias"):
            raise CheckpointError(f"{source}: attention_bias=true is not supported (Qwen3 has no biases)")
        if raw.get("use_sliding_window"):
            raise CheckpointError(f"{source}: use_sliding_window=true is not supported")
        if raw.get("hidden_act", "silu") != "silu":
            raise CheckpointError(f"{source}: hidden_act {raw['hidden_act']!r} is not supported (only silu)")
        heads = need("num_attention_heads")
        kv_heads = raw.get("num_key_value_heads") or heads
        if heads % kv_heads:
            raise CheckpointError(f"{source}: num_attention_heads {heads} is not a multiple of num_key_value_heads {kv_heads}")
        head_dim = raw.get("head_dim") or need("hidden_size") // heads
        if head_dim % 2:
            raise CheckpointError(f"{source}: head_dim {head_dim} must be even for RoPE")
        return cls(
            vocab_size=need("vocab_size"),
            hidden_size=need("hidden_size"),
            intermediate_size=need("intermediate_size"),
            num_layers=need("num_hidden_layers"),
            num_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=head_dim,
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            rope_theta=float(rope.get("rope_theta") or raw.get("rope_theta") or 10000.0),
            max_positions=int(raw.get("max_position_embeddings", 32768)),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            eos_token_ids=_as_tuple(raw.get("eos_token_id")),
        )


def _as_tuple(value) -> tuple[int, ...]:
    if value is None:
        return ()
    return tuple(value) if isinstance(value, list) else (int(value),)


def _eos_ids(path: Path) -> tuple[int, ...]:
    if not path.is_file():
        return ()
    try:
        return _as_tuple(json.loads(path.read_text()).get("eos_token_id"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{path}: not valid JSON: {exc}") from None
