"""Bytes a decode step reads and FLOPs a prefill computes, from a checkpoint's ModelConfig.

Decode roofline: a step reads every weight once (the tied embedding once, as the lm_head; a
token's embedding row is negligible) plus the K and V of every cached position; at the measured
copy bandwidth that is ``bandwidth / bytes`` steps per second. Weight-only INT8 stores one byte
per weight of every Linear (the lm_head included) plus a float32 scale per output row; the INT8
KV cache one byte per value plus a float32 scale per cached vector (position x KV head, K and V).

Prefill FLOPs: ``2 x tokens x`` the parameters of the decoder layers' linears, plus the lm_head
for the last token only (the engine computes the prefill's logits with ``last_only=True``), plus
causal attention ``4 x T^2 / 2 x heads x head_dim x layers`` (QK^T and PV, half the square).
"""

from __future__ import annotations

from tileinfer.model_config import ModelConfig


def layer_linear_shapes(mc: ModelConfig) -> list[tuple[int, int]]:
    """(out, in) of one decoder layer's linears, as the engine fuses them: qkv, o, gate_up, down."""
    h, d, i = mc.hidden_size, mc.head_dim, mc.intermediate_size
    return [((mc.num_heads + 2 * mc.num_kv_heads) * d, h), (h, mc.num_heads * d), (2 * i, h), (h, i)]


def weight_bytes(mc: ModelConfig, quantize: str = "none", dtype_bytes: int = 2) -> int:
    """Bytes of weights one decode step reads: every layer's linears and the lm_head."""
    linears = [*layer_linear_shapes(mc)] * mc.num_layers + [(mc.vocab_size, mc.hidden_size)]
    if quantize == "int8":
        return sum(o * i + 4 * o for o, i in linears)
    return sum(o * i for o, i in linears) * dtype_bytes


def kv_bytes_per_position(mc: ModelConfig, storage: str = "dtype", dtype_bytes: int = 2) -> int:
    """Bytes of K and V one cached position holds over all layers (``storage`` as KVStore.storage)."""
    vectors = 2 * mc.num_layers * mc.num_kv_heads
    return vectors * (mc.head_dim + 4 if storage == "int8" else mc.head_dim * dtype_bytes)


def decode_step_bytes(mc: ModelConfig, context: float, *, quantize: str = "none", storage: str = "dtype",
                      dtype_bytes: int = 2) -> float:
    """Bytes one decode step reads after ``context`` cached positions."""
    return weight_bytes(mc, quantize, dtype_bytes) + kv_bytes_per_position(mc, storage, dtype_bytes) * context


def decode_roofline_tok_s(mc: ModelConfig, prompt: int, new: int, bandwidth: float, **layout) -> float:
    """Tokens per second at the copy bandwidth (bytes/s) for ``new`` tokens after ``prompt``
    positions, one token per step: the context averaged over the run (``prompt + new / 2``)."""
    return bandwidth / decode_step_bytes(mc, prompt + new / 2, **layout)


def prefill_flops(mc: ModelConfig, tokens: int) -> dict[str, float]:
    """FLOPs of a causal prefill of ``tokens`` from position 0: ``gemm``, ``attention``, ``total``."""
    layer = sum(o * i for o, i in layer_linear_shapes(mc))
    gemm = 2.0 * tokens * layer * mc.num_layers + 2.0 * mc.vocab_size * mc.hidden_size  # lm_head: last token
    attention = 4.0 * tokens * tokens / 2 * mc.num_heads * mc.head_dim * mc.num_layers
    return {"gemm": gemm, "attention": attention, "total": gemm + attention}
