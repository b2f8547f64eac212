"""Triton attentions, from one kernel per op with the reference attention to the fused engine.

``TritonRefAttention``: per-op input kernels (copies, q/k RMSNorm, RoPE, KV write), then the
reference dense attention. ``TritonAttention``: the same inputs, then paged flash attention read
in place through the block table: the split-KV decode kernels for steps of up to 16 tokens
(decode and speculative verify), the prefill kernel above. ``TritonFusedAttention``: the inputs in
one kernel launch (q norm + RoPE; k norm + RoPE + KV write; two launches of it where the q and kv
heads' norm tiles differ, few heads), bit-identical to the per-op chain.
Every Triton kernel is launched with programmatic dependent launch where the weights' device
supports it (Hopper and newer, compiled; backends/triton/pdl.py), decided once at construction.
"""

from __future__ import annotations

import torch

from tileinfer.backends.triton.attention_inputs import attention_inputs, attention_inputs_unfused
from tileinfer.backends.triton.paged_attention import (
    DECODE_MAX_TOKENS,
    decode_splits,
    paged_decode_attention,
    paged_prefill_attention,
)
from tileinfer.backends.triton.pdl import pdl_supported
from tileinfer.interfaces import Attention, KVStore, Step
from tileinfer.plugins.reference.attention import ReferenceAttention, dense_attention
from tileinfer.plugins.triton.device import kernels_run_on, notice_reference_twin


class TritonAttention(Attention):
    name = "attention=triton"

    def __init__(self, spec, *, layer, q_norm_weight, k_norm_weight, rope) -> None:
        super().__init__(spec, layer=layer, q_norm_weight=q_norm_weight, k_norm_weight=k_norm_weight, rope=rope)
        self._twin = None
        self.pdl = pdl_supported(q_norm_weight.device)
        if not kernels_run_on(q_norm_weight.device):
            notice_reference_twin(self.name)
            self._twin = ReferenceAttention(spec, layer=layer, q_norm_weight=q_norm_weight,
                                            k_norm_weight=k_norm_weight, rope=rope)

    def inputs(self, qkv: torch.Tensor, step: Step, kv: KVStore) -> torch.Tensor:
        """Write the step's k and v into the pages; return q ``[T, H, D]``."""
        spec, pages = self.spec, kv.layer(self.layer)
        return attention_inputs_unfused(qkv, self.q_norm_weight, self.k_norm_weight, self.rope.cos, self.rope.sin,
                                        step.positions, pages.k, pages.v, kv.block_table, spec.num_heads,
                                        spec.num_kv_heads, spec.head_dim, spec.rms_norm_eps, pdl=self.pdl)

    def attend(self, q: torch.Tensor, step: Step, kv: KVStore) -> torch.Tensor:
        pages = kv.layer(self.layer)
        if step.num_tokens > DECODE_MAX_TOKENS:
            return paged_prefill_attention(q, pages.k, pages.v, kv.block_table, step.start, self.spec.scale,
                                           pdl=self.pdl)
        splits = None if step.max_context is None else decode_splits(step.max_context)
        return paged_decode_attention(q, pages.k, pages.v, kv.block_table, step.start, self.spec.scale,
                                      positions=step.positions, num_splits=splits, pdl=self.pdl)

    def __call__(self, qkv: torch.Tensor, step: Step, kv: KVStore) -> torch.Tensor:
        if self._twin is not None:
            return self._twin(qkv, step, kv)
        q = self.inputs(qkv, step, kv)
        return self.attend(q, step, kv).reshape(step.num_tokens, self.spec.num_heads * self.spec.head_dim)


class TritonRefAttention(TritonAttention):
    name = "attention=triton_refattn"

    def attend(self, q: torch.Tensor, step: Step, kv: KVStore) -> torch.Tensor:
        return dense_attention(q, step, kv, self.layer, self.spec.scale)


class TritonFusedAttention(TritonAttention):
    name = "attention=triton_fused"

    def inputs(self, qkv: torch.Tensor, step: Step, kv: KVStore) -> torch.Tensor:
        spec, pages = self.spec, kv.layer(self.layer)
        return attention_inputs(qkv, self.q_norm_weight, self.k_norm_weight, self.rope.cos, self.rope.sin,
                                step.positions, pages.k, pages.v, kv.block_table, spec.num_heads,
                                spec.num_kv_heads, spec.head_dim, spec.rms_norm_eps, pdl=self.pdl)
