"""The Triton Attention: the attention inputs (q/k RMSNorm, RoPE, the paged K/V write) in one
kernel or a kernel each, then paged flash attention read in place through the block table (the
split-KV decode kernels for steps of up to 16 tokens, the prefill kernel above) or the reference
dense attention over gathered pages (``options.triton``).

The fused input kernel is bit-identical to the per-op chain (:func:`inputs_per_op`), so every
combination of ``fuse_inputs`` gives the same bits. Pages are written and read in place, in the
model dtype (``storage`` ``dtype``: ``kv_store=paged``) or as INT8 with one float32 scale per
cached vector and keys divided by the k-norm smoothing (``storage`` ``int8``: ``paged_int8``; the
input kernels quantize as the store's own ``write`` does, bit for bit, and the attention kernels
convert the int8 tiles in registers). The prefill kernel's tiles are the rule's unless
``prefill_tiles`` names a shape (``prefill_tiles`` of backends/triton/paged_attention.py).
"""

from __future__ import annotations

import torch

from tileinfer.backends.triton import SMALL_STEP_MAX_TOKENS
from tileinfer.backends.triton.attention_inputs import attention_inputs
from tileinfer.backends.triton.kv_write import write_kv, write_kv_int8
from tileinfer.backends.triton.paged_attention import (
    PREFILL_SHAPES,
    decode_splits,
    paged_decode_attention,
    paged_prefill_attention,
    prefill_tiles,
)
from tileinfer.backends.triton.pdl import pdl_supported
from tileinfer.backends.triton.rms_norm import rms_norm
from tileinfer.backends.triton.rope import apply_rope
from tileinfer.errors import ConfigError
from tileinfer.interfaces import Attention, KVStore, RunSpec, Step
from tileinfer.options import Option
from tileinfer.plugins.reference.attention import dense_attention
from tileinfer.plugins.triton.kernels_available import device_reasons
from tileinfer.plugins.triton.linear import PDL


def inputs_per_op(qkv: torch.Tensor, q_norm_weight: torch.Tensor, k_norm_weight: torch.Tensor, cos: torch.Tensor,
                  sin: torch.Tensor, positions: torch.Tensor, k_pages: torch.Tensor, v_pages: torch.Tensor,
                  block_table: torch.Tensor, num_heads: int, num_kv_heads: int, head_dim: int, eps: float, *,
                  k_scale: torch.Tensor | None = None, v_scale: torch.Tensor | None = None,
                  k_smooth: torch.Tensor | None = None, pdl: bool = False) -> torch.Tensor:
    """``attention_inputs`` as a chain of per-op kernels (8 launches): copy the q, k, v slices of
    ``qkv`` to contiguous tensors, ``rms_norm`` the q and k heads, ``apply_rope`` to both,
    ``write_kv`` (``write_kv_int8`` into int8 pages, with ``k_scale``, ``v_scale``, ``k_smooth``).
    Returns q ``[T, H, D]``; the same bits as the fused kernel."""
    t, d = qkv.shape[0], head_dim
    q, k, v = qkv.split([num_heads * d, num_kv_heads * d, num_kv_heads * d], dim=-1)
    q = q.contiguous().view(t, num_heads, d)
    k = k.contiguous().view(t, num_kv_heads, d)
    v = v.contiguous().view(t, num_kv_heads, d)
    q = apply_rope(rms_norm(q, q_norm_weight, eps, pdl=pdl), cos, sin, positions, pdl=pdl)
    k = apply_rope(rms_norm(k, k_norm_weight, eps, pdl=pdl), cos, sin, positions, pdl=pdl)
    if k_scale is None:
        write_kv(k_pages, v_pages, block_table, positions, k, v, pdl=pdl)
    else:
        write_kv_int8(k_pages, v_pages, k_scale, v_scale, block_table, positions, k, v, k_smooth=k_smooth, pdl=pdl)
    return q


class TritonAttention(Attention):
    supported_storage = ("dtype", "int8")
    declared_options = (
        Option("fuse_inputs", bool, True, "q/k RMSNorm, RoPE and the KV write in one kernel (false: a kernel "
               "each, after copies of the q/k/v slices)"),
        Option("attend", str, "paged", "paged: flash attention read in place from the pages; dense: the "
               "reference attention (pages gathered into dense K and V, scores materialized)",
               choices=("paged", "dense")),
        PDL,
        Option("prefill_tiles", str, "rule", "the prefill attention kernel's tiles: rule (64 query rows x 64 keys, "
               "4 warps, 3 stages; 128x64 from 16,384 query rows, a 4,096-token chunk of Qwen3-4B, same bits), "
               "128x64 (8 warps, 3 stages) or 128x128 (8 warps, 2 stages; not the rule's bits); on an H100 at an "
               "8,192-token prompt in 4,096-token chunks over pages of 64, 128x64 took 1,119 us against 64 x 64's "
               "1,196, 128x128 1,405", choices=("rule", *PREFILL_SHAPES)),
    )

    @classmethod
    def incompatibilities(cls, run: RunSpec) -> list[str]:
        reasons = super().incompatibilities(run) + device_reasons("attention", run.device)
        page = run.kv_page_size
        if run.options["attend"] == "paged" and (page < 16 or page & (page - 1)):
            reasons.append(f"kv_page_size={page}: its paged kernels take a power of two >= 16 (or set "
                           "options.triton.attend=dense)")
        return reasons

    def __init__(self, spec, *, layer, q_norm_weight, k_norm_weight, rope, options=None) -> None:
        super().__init__(spec, layer=layer, q_norm_weight=q_norm_weight, k_norm_weight=k_norm_weight, rope=rope,
                         options=options)
        d = spec.head_dim
        if d < 16 or d & (d - 1):
            raise ConfigError(f"attention=triton cannot run this model: its head_dim {d} is not a power of two >= 16 "
                              "(Qwen3's are 64 and 128); use attention=reference")
        self.pdl = self.options["pdl"] and pdl_supported(q_norm_weight.device)
        self._inputs = attention_inputs if self.options["fuse_inputs"] else inputs_per_op

    def inputs(self, qkv: torch.Tensor, step: Step, kv: KVStore) -> torch.Tensor:
        """Write the step's keys and values into the layer's pages; return q ``[T, H, D]``."""
        spec, pages = self.spec, kv.layer(self.layer)
        return self._inputs(qkv, self.q_norm_weight, self.k_norm_weight, self.rope.cos, self.rope.sin,
                            step.positions, pages.k, pages.v, kv.block_table, spec.num_heads, spec.num_kv_heads,
                            spec.head_dim, spec.rms_norm_eps, k_scale=pages.k_scale, v_scale=pages.v_scale,
                            k_smooth=pages.k_smooth, pdl=self.pdl)

    def write_kv(self, qkv: torch.Tensor, step: Step, kv: KVStore) -> None:
        self.inputs(qkv, step, kv)  # the fused kernel's q heads come along; no attention runs

    def __call__(self, qkv: torch.Tensor, step: Step, kv: KVStore) -> torch.Tensor:
        spec, pages = self.spec, kv.layer(self.layer)
        q = self.inputs(qkv, step, kv)
        int8 = dict(k_scale=pages.k_scale, v_scale=pages.v_scale, k_smooth=pages.k_smooth)
        if self.options["attend"] == "dense":
            if pages.k_smooth is not None:  # the cache holds k / k_smooth: scale the query instead
                q = (q.float() * pages.k_smooth).to(q.dtype)
            out = dense_attention(q, step, kv, self.layer, spec.scale)
        elif step.num_tokens > SMALL_STEP_MAX_TOKENS:
            tiles = prefill_tiles(step.num_tokens * spec.num_heads // spec.num_kv_heads, spec.head_dim,
                                  pages.k_scale is not None, shape=self.options["prefill_tiles"])
            out = paged_prefill_attention(q, pages.k, pages.v, kv.block_table, step.start, spec.scale,
                                          positions=step.positions, causal=step.causal, **int8, pdl=self.pdl,
                                          tiles=tiles)
        else:
            splits = None if step.max_context is None else decode_splits(step.max_context, pages.k_scale is not None)
            out = paged_decode_attention(q, pages.k, pages.v, kv.block_table, step.start, spec.scale,
                                         positions=step.positions, num_splits=splits, causal=step.causal,
                                         **int8, pdl=self.pdl)
        return out.reshape(step.num_tokens, spec.num_heads * spec.head_dim)
