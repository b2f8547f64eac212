"""ReferenceAttention: q/k norm, RoPE, KV write, then dense causal attention over gathered pages."""

from __future__ import annotations

import torch

from tileinfer.backends.reference.paged_attention import causal_attention
from tileinfer.backends.reference.rms_norm import rms_norm
from tileinfer.backends.reference.rope import apply_rope
from tileinfer.interfaces import Attention, KVStore, Step


class ReferenceAttention(Attention):
    """Gathers the layer's pages into dense K and V every step and materializes the scores. It
    writes through ``KVStore.write``, so it works with any store's page format."""

    supported_storage = ("dtype", "int8")

    def __call__(self, qkv: torch.Tensor, step: Step, kv: KVStore) -> torch.Tensor:
        spec = self.spec
        t, d = qkv.shape[0], spec.head_dim
        q, k, v = qkv.split([spec.num_heads * d, spec.num_kv_heads * d, spec.num_kv_heads * d], dim=-1)
        q = rms_norm(q.reshape(t, spec.num_heads, d), self.q_norm_weight, spec.rms_norm_eps)
        k = rms_norm(k.reshape(t, spec.num_kv_heads, d), self.k_norm_weight, spec.rms_norm_eps)
        cos, sin = self.rope.cos[step.positions], self.rope.sin[step.positions]
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        kv.write(self.layer, step.positions, k, v.reshape(t, spec.num_kv_heads, d))
        smooth = kv.layer(self.layer).k_smooth
        if smooth is not None:  # the cache holds k / smooth: scale the query instead
            q = (q.float() * smooth).to(q.dtype)
        return dense_attention(q, step, kv, self.layer, spec.scale).reshape(t, spec.num_heads * d)


def dense_attention(q: torch.Tensor, step: Step, kv: KVStore, layer: int, scale: float) -> torch.Tensor:
    """Gather the layer's pages into dense K and V and attend, materializing the scores. A step
    replayed from a CUDA graph gathers ``max_context`` positions and masks by its positions tensor."""
    if step.max_context is None:
        keys, values = kv.gather(layer, step.end)
        return causal_attention(q, keys, values, step.start, scale)
    keys, values = kv.gather(layer, step.max_context)
    return causal_attention(q, keys, values, step.positions, scale)
