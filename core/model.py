"""Qwen3Model: the decoder stack, built from whichever implementations the config names.

Data flows one way: embedding -> per layer [RMSNorm, fused qkv Linear, Attention, o_proj Linear,
add + RMSNorm, fused gate_up Linear with SwiGLU epilogue, down Linear] -> add + final RMSNorm ->
lm_head Linear with float32 logits. The residual add before each norm is one ``add_rms_norm``
call so that an ops backend may fuse it.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass

import torch
from tqdm.auto import tqdm

from tileinfer.interfaces import Attention, KVStore, Linear, Ops, RopeTable, Step
from tileinfer.model_config import ModelConfig


@dataclass
class Backend:
    """The implementations a model is built from."""

    linear: type[Linear]
    attention: type[Attention]
    ops: Ops
    quantize: str = "none"


@dataclass
class Qwen3Layer:
    input_norm: torch.Tensor
    qkv: Linear
    attention: Attention
    o_proj: Linear
    post_norm: torch.Tensor
    gate_up: Linear  # SwiGLU epilogue: [T, hidden] -> [T, intermediate]
    down: Linear


def rope_table(head_dim: int, theta: float, max_positions: int, device: torch.device) -> RopeTable:
    """cos and sin of ``position * theta^(-2i / head_dim)``, ``[max_positions, head_dim // 2]`` float32."""
    exponent = torch.arange(0, head_dim, 2, dtype=torch.int64, device=device).float() / head_dim
    inv_freq = 1.0 / (theta**exponent)
    angles = torch.arange(max_positions, dtype=torch.int64, device=device).float()[:, None] * inv_freq[None, :]
    return RopeTable(angles.cos(), angles.sin())


class Qwen3Model:
    """A dense Qwen3 causal LM on one device."""

    def __init__(self, config: ModelConfig, embed: torch.Tensor, layers: list[Qwen3Layer],
                 norm: torch.Tensor, lm_head: Linear, ops: Ops, rope: RopeTable) -> None:
        self.config = config
        self.embed = embed
        self.layers = layers
        self.norm = norm
        self.lm_head = lm_head
        self.ops = ops
        self.rope = rope

    @property
    def device(self) -> torch.device:
        return self.embed.device

    @property
    def dtype(self) -> torch.dtype:
        return self.embed.dtype

    @classmethod
    def build(cls, config: ModelConfig, tensor: Callable[[str], torch.Tensor], backend: Backend,
              *, progress: bool = True) -> "Qwen3Model":
        """Build from ``tensor(name)``, which returns a checkpoint tensor (Hugging Face name) on the
        target device in the model dtype, shape already checked. q/k/v and gate/up are fused here,
        and each Linear is built (and may quantize) as soon as its weight is loaded."""
        embed = tensor("model.embed_tokens.weight")
        rope = rope_table(config.head_dim, config.rope_theta, config.max_positions, embed.device)
        spec = config.attention
        q = backend.quantize
        layers = []
        for n in tqdm(range(config.num_layers), desc="loading layers", unit="layer", disable=not progress or None,
                      leave=False):
            p = f"model.layers.{n}."
            qkv = torch.cat([tensor(p + f"self_attn.{x}_proj.weight") for x in "qkv"])
            gate_up = torch.cat([tensor(p + "mlp.gate_proj.weight"), tensor(p + "mlp.up_proj.weight")])
            layers.append(Qwen3Layer(
                input_norm=tensor(p + "input_layernorm.weight"),
                qkv=backend.linear(qkv, quantize=q),
                attention=backend.attention(spec, layer=n, q_norm_weight=tensor(p + "self_attn.q_norm.weight"),
                                            k_norm_weight=tensor(p + "self_attn.k_norm.weight"), rope=rope),
                o_proj=backend.linear(tensor(p + "self_attn.o_proj.weight"), quantize=q),
                post_norm=tensor(p + "post_attention_layernorm.weight"),
                gate_up=backend.linear(gate_up, epilogue="swiglu", quantize=q),
                down=backend.linear(tensor(p + "mlp.down_proj.weight"), quantize=q),
            ))
            del qkv, gate_up
        head = embed if config.tie_word_embeddings else tensor("lm_head.weight")
        lm_head = backend.linear(head, out_dtype=torch.float32, quantize=q)
        return cls(config, embed, layers, tensor("model.norm.weight"), lm_head, backend.ops, rope)

    def forward(self, token_ids: torch.Tensor, step: Step, kv: KVStore, *, last_only: bool = False,
                capture: Collection[int] = ()) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
        """Run ``step`` (``token_ids`` ``[T]`` int64 on the device), writing its keys and values.

        Returns float32 logits ``[T, V]`` (``[1, V]`` of the last token with ``last_only``) and the
        outputs ``[T, hidden]`` of the decoder layers listed in ``capture`` (before the final norm).
        """
        ops, eps = self.ops, self.config.rms_norm_eps
        h = ops.embedding(token_ids, self.embed)
        residual = None
        hidden: dict[int, torch.Tensor] = {}
        for n, layer in enumerate(self.layers):
            if residual is None:
                x, residual = ops.rms_norm(h, layer.input_norm, eps), h
            else:
                x, residual = ops.add_rms_norm(h, residual, layer.input_norm, eps)
            h = layer.o_proj(layer.attention(layer.qkv(x), step, kv))
            x, residual = ops.add_rms_norm(h, residual, layer.post_norm, eps)
            h = layer.down(layer.gate_up(x))
            if n in capture:
                hidden[n] = h + residual
        if last_only:
            h, residual = h[-1:], residual[-1:]
        x, _ = ops.add_rms_norm(h, residual, self.norm, eps)
        return self.lm_head(x), hidden
