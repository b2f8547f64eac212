"""Reference INT8 KV-cache ops: symmetric INT8 with one float32 scale per vector, and the key
smoothing that evens the channels out before quantization (the ``paged_int8`` KV store's ops, and
the twin of the quantizing writes of backends/triton/attention_inputs.py and kv_write.py)."""

from __future__ import annotations

import torch

from tileinfer.backends.reference.kv_write import write_pages

# The scale is absmax times the float32 reciprocal of 127, not absmax / 127: torch divides a CUDA
# tensor by a Python scalar through its reciprocal and a CPU one exactly, so only the product gives
# the same bits on both devices (and in the Triton kernels, which compute it the same way).
INV_127 = 1.0 / 127.0


def quantize_per_vector(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric INT8 with one float32 scale per vector of the last dim: ``x ~= q * scale[..., None]``.

    In float32: ``scale = max(absmax, 1e-12) * float32(1 / 127)``, ``q = round_half_even(x /
    scale)`` (an IEEE division) clamped to ``[-127, 127]``; the Triton writes compute exactly this."""
    xf = x.float()
    scale = xf.abs().amax(dim=-1).clamp(min=1e-12) * INV_127
    q = torch.round(xf / scale[..., None]).clamp(-127, 127).to(torch.int8)
    return q, scale


def dequantize_per_vector(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``q * scale[..., None]`` computed in float32, returned in ``dtype``."""
    return (q.float() * scale[..., None]).to(dtype)


def key_smoothing(k_norm_weight: torch.Tensor) -> torch.Tensor:
    """Per-channel divisor for keys before INT8 quantization, from the key RMSNorm's weight.

    A key's channel ``i`` is about ``|w_i|`` times a unit-scale value, so dividing by ``|w|`` evens
    the channels out and the one scale per vector wastes fewer levels. RoPE mixes channel ``i`` with
    ``i + D/2``, so both get the same divisor (the RMS of the pair) and the division commutes with
    the rotation: ``q.k = (q * s).(k / s)`` exactly in real arithmetic. Returns ``[D]`` float32.
    """
    w = k_norm_weight.float()
    a, b = w.chunk(2)
    pair = torch.sqrt((a * a + b * b) / 2).clamp(min=1e-6)
    return torch.cat((pair, pair))


def quantize_keys(k: torch.Tensor, k_smooth: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`quantize_per_vector` of ``k / k_smooth`` (float32 ``[D]``; None: no smoothing) in
    float32: what the ``paged_int8`` store holds for keys ``k`` ``[..., D]`` in the model dtype."""
    return quantize_per_vector(k.float() if k_smooth is None else k.float() / k_smooth)


def write_quantized(k_pages: torch.Tensor, v_pages: torch.Tensor, k_scale: torch.Tensor, v_scale: torch.Tensor,
                    block_table: torch.Tensor, positions: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    k_smooth: torch.Tensor | None = None) -> None:
    """Quantize ``k`` (:func:`quantize_keys`) and ``v`` (:func:`quantize_per_vector`), ``[T, Hkv, D]``
    in the model dtype, and store them at ``positions`` ``[T]`` through ``block_table``: int8 into
    ``k_pages``/``v_pages`` ``[num_pages, Hkv, page_size, D]``, the float32 scales into
    ``k_scale``/``v_scale`` ``[num_pages, Hkv, page_size]`` (the layout of ``LayerKV``)."""
    kq, ks = quantize_keys(k, k_smooth)
    vq, vs = quantize_per_vector(v)
    write_pages(k_pages, block_table, positions, kq)
    write_pages(k_scale, block_table, positions, ks)
    write_pages(v_pages, block_table, positions, vq)
    write_pages(v_scale, block_table, positions, vs)
