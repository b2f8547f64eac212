"""Qwen3Model: the decoder stack, built from whichever implementations the config names.

Data flows one way along the residual stream ``h``: embedding -> per layer [fused qkv Linear
(input_layernorm as its RMSNorm), Attention, o_proj Linear adding ``h``, fused gate_up Linear
(post_attention_layernorm as its RMSNorm; SwiGLU epilogue), down Linear adding ``h``] -> lm_head
Linear (the final norm as its RMSNorm) with float32 logits. Each norm and residual add belongs to
the Linear beside it, so that an implementation may fuse them into its kernel.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from tileinfer.interfaces import Attention, KVStore, Linear, RMSNorm, RopeTable, Step
from tileinfer.model_config import ModelConfig
from tileinfer.rope import rope_table  # noqa: F401 (tileinfer.model.rope_table: the tables' one builder)


@dataclass
class Backend:
    """The implementations a model is built from, with their options."""

    linear: type[Linear]
    attention: type[Attention]
    quantize: str = "none"
    linear_options: dict[str, Any] = field(default_factory=dict)
    attention_options: dict[str, Any] = field(default_factory=dict)


@dataclass
class Qwen3Layer:
    qkv: Linear  # input_layernorm, then [T, hidden] -> [T, (H + 2 Hkv) D]
    attention: Attention
    o_proj: Linear  # called with the residual stream
    gate_up: Linear  # post_attention_layernorm, then SwiGLU: [T, hidden] -> [T, intermediate]
    down: Linear  # called with the residual stream


class Qwen3Model:
    """A dense Qwen3 causal LM on one device."""

    def __init__(self, config: ModelConfig, embed: torch.Tensor, layers: list[Qwen3Layer], lm_head: Linear,
                 rope: RopeTable) -> None:
        self.config = config
        self.embed = embed
        self.layers = layers
        self.lm_head = lm_head  # the final norm is its RMSNorm
        self.rope = rope

    @property
    def device(self) -> torch.device:
        return self.embed.device

    @property
    def dtype(self) -> torch.dtype:
        return self.embed.dtype

    @classmethod
    def build(cls, config: ModelConfig, tensor: Callable[[str], torch.Tensor], backend: Backend,
              *, progress: bool = True, positions: int | None = None) -> "Qwen3Model":
        """Build from ``tensor(name)``, which returns a checkpoint tensor (Hugging Face name) on the
        target device in the model dtype, shape already checked. q/k/v and gate/up are fused here,
        and each Linear is built (and may quantize) as soon as its weight is loaded.

        ``positions``: how many positions the run can reach (its KV capacity); the RoPE tables get
        ``min(positions, config.max_positions)`` rows (cos and sin: 4 * head_dim bytes a position;
        sized by max_position_embeddings alone, 1e9 positions would take 512 GB at head_dim 128).
        Default: config.max_positions rows."""
        if positions is not None and (isinstance(positions, bool) or not isinstance(positions, int) or positions < 1):
            raise ValueError(f"positions must be a positive integer, got {positions!r}")
        rows = config.max_positions if positions is None else min(positions, config.max_positions)
        embed = tensor("model.embed_tokens.weight")
        rope = config.rope_table(rows, embed.device)
        spec = config.attention

        def linear(weight: torch.Tensor, **kw) -> Linear:
            return backend.linear(weight, quantize=backend.quantize, options=backend.linear_options, **kw)

        def norm(name: str) -> RMSNorm:
            return RMSNorm(tensor(name), config.rms_norm_eps)

        layers = []
        for n in tqdm(range(config.num_layers), desc="loading layers", unit="layer", disable=not progress or None,
                      leave=False):
            p = f"model.layers.{n}."
            qkv = torch.cat([tensor(p + f"self_attn.{x}_proj.weight") for x in "qkv"])
            gate_up = torch.cat([tensor(p + "mlp.gate_proj.weight"), tensor(p + "mlp.up_proj.weight")])
            layers.append(Qwen3Layer(
                qkv=linear(qkv, norm=norm(p + "input_layernorm.weight")),
                attention=backend.attention(spec, layer=n, q_norm_weight=tensor(p + "self_attn.q_norm.weight"),
                                            k_norm_weight=tensor(p + "self_attn.k_norm.weight"), rope=rope,
                                            options=backend.attention_options),
                o_proj=linear(tensor(p + "self_attn.o_proj.weight")),
                gate_up=linear(gate_up, epilogue="swiglu", norm=norm(p + "post_attention_layernorm.weight")),
                down=linear(tensor(p + "mlp.down_proj.weight")),
            ))
            del qkv, gate_up
        head = embed if config.tie_word_embeddings else tensor("lm_head.weight")
        lm_head = linear(head, out_dtype=torch.float32, norm=norm("model.norm.weight"))
        return cls(config, embed, layers, lm_head, rope)

    def forward(self, token_ids: torch.Tensor, step: Step, kv: KVStore, *, last_only: bool = False,
                capture: Collection[int] = (), rows: torch.Tensor | None = None, logits: bool = True
                ) -> tuple[torch.Tensor | None, dict[int, torch.Tensor]]:
        """``stack_forward`` of this model: one step, one implementation call per operation."""
        return stack_forward(self, token_ids, step, kv, capture=capture, rows=rows, last_only=last_only,
                             logits=logits)


def stack_forward(stack, token_ids: torch.Tensor, step: Step, kv: KVStore, *, capture: Collection[int] = (),
                  rows: torch.Tensor | None = None, last_only: bool = False,
                  logits: bool = True) -> tuple[torch.Tensor | None, dict[int, torch.Tensor]]:
    """Run ``step`` (``token_ids`` ``[T]`` int64 on the device) through a decoder ``stack``, writing
    its keys and values, one implementation call per operation: the ``per_op`` ForwardPass, the
    reference of the ``tileinfer.interfaces.ForwardPass`` contract. ``stack`` has ``embed``
    ``[V, H]``, ``layers`` (each a ``Qwen3Layer``'s five fields) and ``lm_head`` (a Qwen3Model;
    the DFlash drafter's block).

    Returns float32 logits ``[T, V]`` (``[1, V]`` of the last token with ``last_only``; ``[R,
    V]`` of the rows listed in ``rows``, ``[R]`` int64 indices on the device, read there: a
    padded prefill step replayed from a CUDA graph takes its last real row so; None with
    ``logits=False``, which runs no lm_head) and the outputs ``[T, hidden]`` of the decoder
    layers listed in ``capture`` (the residual stream after the layer, before the final norm).
    """
    h = F.embedding(token_ids, stack.embed)
    hidden: dict[int, torch.Tensor] = {}
    for n, layer in enumerate(stack.layers):
        h = layer.o_proj(layer.attention(layer.qkv(h), step, kv), residual=h)
        h = layer.down(layer.gate_up(h), residual=h)
        if n in capture:
            hidden[n] = h
    if not logits:
        return None, hidden
    if rows is not None:
        h = h.index_select(0, rows)
    elif last_only:
        h = h[-1:]
    return stack.lm_head(h), hidden
