"""The DFlash drafter's forward pass, built from the run's Linear and Attention implementations.

A small Qwen3 decoder stack that reads the target's hidden states (z-lab's DFlashDraftModel,
arithmetic of dflash/model.py):

- context: the outputs of the target layers ``target_layer_ids`` at each committed position,
  concatenated ``[T, K*H]``, projected by ``fc`` (``project``) and normalized by ``hidden_norm``:
  ``c = hidden_norm(fc(F))``, ``[T, H]``;
- every layer ``l`` caches ``k_norm(k_proj_l(c))`` with RoPE at the context's positions and
  ``v_proj_l(c)`` in the drafter's own KV store (``c`` skips input_layernorm); the k/v projections of
  all layers are one Linear (``context_kv``, ``hidden_norm`` its RMSNorm), as vLLM fuses them;
- the block ``[x0, MASK x (B-1)]`` (the newest committed token, then mask tokens), embedded with the
  target's embedding at positions ``s .. s+B-1``, runs through the layers (input_layernorm, q/k/v,
  q/k norms, RoPE, attention, o_proj + residual, post_attention_layernorm, SwiGLU, down +
  residual); its queries see every cached context position and all B block positions (no mask:
  ``Step.causal=False``);
- ``norm`` then the target's lm_head on block positions 1..B-1: row ``j - 1`` scores the token at
  ``s + j``.

Two kinds of step, each of fixed shape so that it can be replayed from a CUDA graph
(plugins/dflash_steps.py): ``write_context`` hands the new context rows to each layer's
``Attention.write_kv`` (a zero query per row, never attended with), so that the attention
implementation writes their keys and values in its own page format; ``block_logits`` runs the block as one
non-causal step. The caller crops the block's keys and values (``KVStore.truncate``) afterwards,
or lets the next step rewrite them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from tileinfer.interfaces import Attention, KVStore, Linear, RMSNorm, Step
from tileinfer.model import Backend, stack_forward
from tileinfer.plugins.dflash_checkpoint import DFlashConfig


@dataclass
class DrafterLayer:
    qkv: Linear  # input_layernorm, then the block's q/k/v: [B, H] -> [B, (Hq + 2 Hkv) D]
    attention: Attention
    o_proj: Linear  # called with the residual stream
    gate_up: Linear  # post_attention_layernorm, then SwiGLU
    down: Linear  # called with the residual stream


class DFlashDrafter:
    """The drafter on one device, in the target's dtype (see the module)."""

    def __init__(self, config: DFlashConfig, fc: Linear, context_kv: Linear, layers: list[DrafterLayer],
                 head: Linear, embed: torch.Tensor) -> None:
        self.config, self.fc, self.context_kv, self.layers, self.head, self.embed = \
            config, fc, context_kv, layers, head, embed
        m = config.model
        self.kv_width = 2 * m.num_kv_heads * m.head_dim  # one layer's slice of context_kv's output
        self.q_width = m.num_heads * m.head_dim

    @property
    def device(self) -> torch.device:
        return self.embed.device

    @classmethod
    def build(cls, config: DFlashConfig, tensor: Callable[[str], torch.Tensor], backend: Backend, *,
              embed: torch.Tensor, head_weight: torch.Tensor, positions: int) -> "DFlashDrafter":
        """From ``tensor(name)`` (the drafter's checkpoint names, on the device in the model dtype),
        the target's ``embed`` ``[V, H]`` and lm_head weight ``head_weight`` ``[V, H]``; RoPE tables
        of ``positions`` rows."""
        m = config.model

        def linear(weight: torch.Tensor, **kw) -> Linear:
            return backend.linear(weight, quantize=backend.quantize, options=backend.linear_options, **kw)

        def norm(name: str) -> RMSNorm:
            return RMSNorm(tensor(name), m.rms_norm_eps)

        rope = m.rope_table(min(positions, m.max_positions), embed.device)
        layers, context = [], []
        for n in range(m.num_layers):
            p = f"layers.{n}."
            k, v = tensor(p + "self_attn.k_proj.weight"), tensor(p + "self_attn.v_proj.weight")
            context += [k, v]
            layers.append(DrafterLayer(
                qkv=linear(torch.cat([tensor(p + "self_attn.q_proj.weight"), k, v]),
                           norm=norm(p + "input_layernorm.weight")),
                attention=backend.attention(m.attention, layer=n, q_norm_weight=tensor(p + "self_attn.q_norm.weight"),
                                            k_norm_weight=tensor(p + "self_attn.k_norm.weight"), rope=rope,
                                            options=backend.attention_options),
                o_proj=linear(tensor(p + "self_attn.o_proj.weight")),
                gate_up=linear(torch.cat([tensor(p + "mlp.gate_proj.weight"), tensor(p + "mlp.up_proj.weight")]),
                               epilogue="swiglu", norm=norm(p + "post_attention_layernorm.weight")),
                down=linear(tensor(p + "mlp.down_proj.weight")),
            ))
        return cls(config, linear(tensor("fc.weight")), linear(torch.cat(context), norm=norm("hidden_norm.weight")),
                   layers, linear(head_weight, out_dtype=torch.float32, norm=norm("norm.weight")), embed)

    def key_norm_weights(self) -> list[torch.Tensor]:
        return [layer.attention.k_norm_weight for layer in self.layers]

    def project(self, hidden: dict[int, torch.Tensor]) -> torch.Tensor:
        """``fc`` of the target layers' outputs (``hidden[id]``: ``[T, H]``), concatenated in
        ``target_layer_ids`` order: ``[T, H]`` in the model dtype (``hidden_norm`` comes later,
        as ``context_kv``'s RMSNorm). A new tensor: the caller's hidden states may be reused buffers."""
        return self.fc(torch.cat([hidden[i] for i in self.config.target_layer_ids], dim=-1))

    def write_context(self, context: torch.Tensor, step: Step, kv: KVStore) -> None:
        """Cache ``context`` (``[n, H]``, ``project``'s output, ``n == step.num_tokens``) at the
        step's positions: ``hidden_norm`` and the k/v projections of every layer (one Linear),
        then each layer's ``Attention.write_kv`` (with a zero query per row, which it does not
        attend with), which writes the keys (k-norm, RoPE) and values in the store's page format.
        ``kv`` must hold pages for the step's positions."""
        context_kv = self.context_kv(context)  # [n, layers * 2 Hkv D]
        zero_q = context.new_zeros(context.shape[0], self.q_width)
        w = self.kv_width
        for i, layer in enumerate(self.layers):
            layer.attention.write_kv(torch.cat([zero_q, context_kv[:, i * w:(i + 1) * w]], dim=-1), step, kv)

    @property
    def lm_head(self) -> Linear:
        """``head`` (the final norm, then the target's lm_head): the stack a ForwardPass runs is
        ``embed``, ``layers``, ``lm_head``, as a Qwen3Model's."""
        return self.head

    def block_logits(self, block: torch.Tensor, step: Step, kv: KVStore) -> torch.Tensor:
        """Run ``block`` (``[B]`` int64 token ids) at the step's positions, a non-causal step
        (``step.causal`` False) after the cached context, one kernel per operation
        (``tileinfer.model.stack_forward``, what the ``per_op`` ForwardPass runs): float32 logits
        ``[B - 1, V]`` of block positions 1..B-1. Writes the block's keys and values at its
        positions (``kv`` must hold pages for them): the caller truncates them away, or a later
        step rewrites them before any query reads them."""
        rows = torch.arange(1, block.shape[0], dtype=torch.int64, device=block.device)
        return stack_forward(self, block, step, kv, rows=rows)[0]

    def forward(self, context: torch.Tensor, block: torch.Tensor, start: int, kv: KVStore) -> torch.Tensor:
        """Eagerly: cache ``context`` (``[n, H]``, ``project``'s output for positions ``start ..
        start+n-1``) in ``kv`` and run ``block`` (``[B]`` int64 token ids) at the positions after it.

        Returns float32 logits ``[B - 1, V]`` of block positions 1..B-1. ``kv`` then holds the
        context and the block's keys and values (``start + n + B`` positions): truncate it to
        ``start + n`` to keep the context only."""
        n, b = context.shape[0], block.shape[0]
        kv.reserve(start + n + b)
        if n:
            self.write_context(context, Step.at(start, n, self.device), kv)
        return self.block_logits(block, Step.at(start + n, b, self.device, causal=False), kv)


__all__ = ["DFlashDrafter", "DrafterLayer"]
