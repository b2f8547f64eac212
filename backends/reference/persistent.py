"""Reference decode step of a Qwen3 decoder stack: the torch ops one after another over the
tensors the persistent kernel reads; twin of backends/triton/persistent.py."""

from __future__ import annotations

import torch

from tileinfer.backends.reference.attention_inputs import attention_inputs
from tileinfer.backends.reference.linear import linear
from tileinfer.backends.reference.paged_attention import paged_attention
from tileinfer.backends.reference.rms_norm import rms_norm


def decode_step(h: torch.Tensor, layers: list[dict[str, torch.Tensor]], lm_w: torch.Tensor,
                lm_s: torch.Tensor | None, final_norm: torch.Tensor, positions: torch.Tensor,
                block_table: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, eps: float, heads: int,
                kv_heads: int, head_dim: int, *, capture: tuple[int, ...] = ()
                ) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """``T`` tokens at ``positions`` (``[T]`` int64, after ``positions[0]`` cached ones) whose
    embeddings are ``h`` ``[T, hidden]`` through every layer, then the lm_head: float32 logits ``[T,
    V]`` and the outputs of the layers in ``capture``. Each layer is a dict of the names of
    ``persistent_plan.LAYER_POINTERS``: the fused qkv, o_proj, gate_up (SwiGLU) and down weights
    (model dtype, or int8 with the ``*_s`` float32 row scales; None-free: a weight in the model dtype
    ignores its scale entry), the input, post-attention, q and k RMSNorm weights, and the layer's K
    and V pages (``[pages, kv_heads, page_size, head_dim]``, written here): in the model dtype, or
    int8 with the float32 scales ``k_scale``, ``v_scale`` (``[pages, kv_heads, page_size]``,
    written here) and the key smoothing ``k_smooth`` (``[head_dim]`` float32, or None / absent: not
    smoothed), through the int8 arguments of ``attention_inputs`` and ``paged_attention``."""

    def scale(layer: dict, name: str) -> torch.Tensor | None:
        return layer[f"{name}_s"] if layer[f"{name}_w"].dtype == torch.int8 else None

    def int8_pages(layer: dict) -> dict[str, torch.Tensor | None]:
        if layer["k_pages"].dtype != torch.int8:
            return {}
        return dict(k_scale=layer["k_scale"], v_scale=layer["v_scale"], k_smooth=layer.get("k_smooth"))

    t, captured = h.shape[0], []
    for n, layer in enumerate(layers):
        qkv = linear(rms_norm(h, layer["input_norm"], eps), layer["qkv_w"], scale(layer, "qkv"))
        q = attention_inputs(qkv, layer["q_norm"], layer["k_norm"], cos, sin, positions, layer["k_pages"],
                             layer["v_pages"], block_table, heads, kv_heads, head_dim, eps, **int8_pages(layer))
        attn = paged_attention(q, layer["k_pages"], layer["v_pages"], block_table, positions, head_dim**-0.5,
                               **int8_pages(layer))
        h = linear(attn.reshape(t, heads * head_dim), layer["o_w"], scale(layer, "o"), residual=h)
        act = linear(rms_norm(h, layer["post_norm"], eps), layer["gate_up_w"], scale(layer, "gate_up"), swiglu=True)
        h = linear(act, layer["down_w"], scale(layer, "down"), residual=h)
        if n in capture:
            captured.append(h)
    lm_scale = lm_s if lm_w.dtype == torch.int8 else None
    return linear(rms_norm(h, final_norm, eps), lm_w, lm_scale, out_dtype=torch.float32), captured
