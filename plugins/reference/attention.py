"""ReferenceAttention: q/k norm, RoPE, KV write, then attention over the pages (causal, or not:
``Step.causal``) through torch's fused scaled_dot_product_attention."""

from __future__ import annotations

import torch

from tileinfer.backends.reference.paged_attention import causal_attention, gather_heads, sdpa_attention
from tileinfer.backends.reference.rms_norm import rms_norm
from tileinfer.backends.reference.rope import apply_rope
from tileinfer.interfaces import Attention, KVStore, Step
from tileinfer.options import Option


class ReferenceAttention(Attention):
    """Writes through ``KVStore.write``, so it works with any store's page format; reads pages in
    the model dtype itself, through the block table (one head-major copy of the context per layer
    and step, into the store's ``workspace``), and any other format through ``KVStore.gather``
    (dequantized); then attends with SDPA (torch's fused kernel: no score matrix) or with the
    scores materialized in float32 (``options.reference.scores``)."""

    supported_storage = ("dtype", "int8")
    declared_options = (
        Option("scores", str, "auto", "fused: torch's scaled_dot_product_attention, no score matrix; "
               "materialized: float32 scores over gathered K and V (the Triton kernels' oracle); auto: fused on a "
               "CPU, materialized on a GPU (where the fused path is not yet tested)",
               choices=("auto", "fused", "materialized")),
    )

    def write_kv(self, qkv: torch.Tensor, step: Step, kv: KVStore) -> None:
        self._write(qkv, step, kv)

    def _write(self, qkv: torch.Tensor, step: Step, kv: KVStore) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The step's keys and values written through ``KVStore.write``; returns ``(q, cos, sin)``:
        the raw queries ``[T, H, D]`` and the step's RoPE rows."""
        spec = self.spec
        t, d = qkv.shape[0], spec.head_dim
        q, k, v = qkv.split([spec.num_heads * d, spec.num_kv_heads * d, spec.num_kv_heads * d], dim=-1)
        k = rms_norm(k.reshape(t, spec.num_kv_heads, d), self.k_norm_weight, spec.rms_norm_eps)
        cos, sin = self.rope.cos[step.positions], self.rope.sin[step.positions]
        kv.write(self.layer, step.positions, apply_rope(k, cos, sin), v.reshape(t, spec.num_kv_heads, d))
        return q.reshape(t, spec.num_heads, d), cos, sin

    def __call__(self, qkv: torch.Tensor, step: Step, kv: KVStore) -> torch.Tensor:
        spec = self.spec
        t, d = qkv.shape[0], spec.head_dim
        q, cos, sin = self._write(qkv, step, kv)
        q = apply_rope(rms_norm(q, self.q_norm_weight, spec.rms_norm_eps), cos, sin)
        smooth = kv.layer(self.layer).k_smooth
        if smooth is not None:  # the cache holds k / smooth: scale the query instead
            q = (q.float() * smooth).to(q.dtype)
        fused = {"auto": None, "fused": True, "materialized": False}[self.options["scores"]]
        return dense_attention(q, step, kv, self.layer, spec.scale, fused=fused).reshape(t, spec.num_heads * d)


def dense_attention(q: torch.Tensor, step: Step, kv: KVStore, layer: int, scale: float, *,
                    fused: bool | None = None) -> torch.Tensor:
    """Attention of ``q`` ``[T, H, D]`` over the layer's cached positions, dense, causal unless
    ``step.causal`` is False (then every query sees all of them). ``fused``
    (None: on a CPU only): the pages copied head-major into the store's ``workspace`` (pages in the
    model dtype) or gathered by the store (any other format), then :func:`sdpa_attention`; otherwise gathered by the store and
    :func:`causal_attention` (float32 scores). A step replayed from a CUDA graph reads
    ``max_context`` positions and masks by its positions tensor. Returns ``[T, H, D]`` in q's dtype."""
    length = step.end if step.max_context is None else step.max_context
    start = step.start if step.max_context is None else step.positions
    if not (q.device.type != "cuda" if fused is None else fused):
        keys, values = kv.gather(layer, length)
        return causal_attention(q, keys, values, start, scale, step.causal)
    if kv.storage == "dtype":
        pages = kv.layer(layer)
        # The store's buffers, not fresh ones: a CPU decode of the shipped model at 1,900 positions
        # measured ~95 tok/s so against ~80 with a fresh copy per layer and step.
        k_out, v_out = kv.workspace(pages.k.numel(), pages.k.dtype)
        keys = gather_heads(pages.k, kv.block_table, length, k_out).transpose(0, 1)  # [L, Hkv, D] views
        values = gather_heads(pages.v, kv.block_table, length, v_out).transpose(0, 1)
    else:
        keys, values = kv.gather(layer, length)
    return sdpa_attention(q, keys, values, start, scale, step.causal)
