"""Reference linear: one matmul (cuBLAS on a GPU), for weights in the model dtype or int8 with one
float32 scale per output row (W8A16, per-output-channel quantization: :func:`quantize_int8`), and
the SwiGLU / residual-add epilogues after it, one torch op after the other; twin of
backends/triton/linear.py.

Arithmetic of the int8 form (the kernels'): int8 -> the activation dtype is exact (|q| <= 128), so
``x q^T`` is a float32-accumulated matmul of exact operands; the float32 per-channel scale
multiplies the float32 accumulator, and the product is rounded once to the output dtype.

Int8 weight layouts (``int8_layout``, :data:`INT8_LAYOUTS`): ``rows``, the ``[N, K]`` rows as
nn.Linear holds them; ``fragments``, each row's groups of 64 columns in the order a thread's
register fragments of the tensor cores read them (:func:`pack_fragments`: the 16 bytes of one
thread of a 16-column MMA step's fragment, k 2t, 2t+1, 2t+8, 2t+9 of each of the group's four
steps, contiguous), so that the GEMM reads a thread's weights with 16-byte loads and no shuffles.
Same values: this twin unpacks (:func:`unpack_fragments`) and computes as for rows.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from tileinfer.backends.reference.add import add
from tileinfer.backends.reference.silu_mul import silu_mul


def quantize_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric per-output-channel INT8: ``weight`` ``[N, K]`` -> (``q`` int8 ``[N, K]``,
    ``scale`` float32 ``[N]``) with ``weight ~= q * scale[:, None]`` and ``|q| <= 127``."""
    w = weight.float()
    scale = w.abs().amax(dim=1).clamp(min=1e-12) / 127.0
    q = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8)
    return q, scale


INT8_LAYOUTS = ("rows", "fragments")
FRAGMENT_K = 64  # columns of one group of the fragments layout (four 16-column MMA steps)


def pack_fragments(q: torch.Tensor) -> torch.Tensor:
    """int8 rows ``[N, K]`` (K a multiple of :data:`FRAGMENT_K`) -> the same ``[N, K]`` bytes with each
    row's groups of 64 columns reordered: byte ``16 t + 4 s + 2 h + l`` of a group holds column ``16 s +
    8 h + 2 t + l`` (t, s < 4; h, l < 2), i.e. the 16 bytes of thread t's fragment (k pairs ``2t, 2t+1``
    and ``2t+8, 2t+9`` of 16-column steps s = 0..3) are contiguous, in the order the fragment holds them."""
    n, k = q.shape
    assert k % FRAGMENT_K == 0, f"the fragments layout takes K a multiple of {FRAGMENT_K}, got {k}"
    return q.reshape(n, k // FRAGMENT_K, 4, 2, 4, 2).permute(0, 1, 4, 2, 3, 5).reshape(n, k).contiguous()


def unpack_fragments(p: torch.Tensor) -> torch.Tensor:
    """The inverse of :func:`pack_fragments`: the rows ``[N, K]``."""
    n, k = p.shape
    assert k % FRAGMENT_K == 0, f"the fragments layout takes K a multiple of {FRAGMENT_K}, got {k}"
    return p.reshape(n, k // FRAGMENT_K, 4, 4, 2, 2).permute(0, 1, 3, 4, 2, 5).reshape(n, k).contiguous()


def dequantize_int8(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``q * scale[:, None]`` computed in float32, returned in ``dtype``."""
    return (q.float() * scale[:, None]).to(dtype)


def matmul(x: torch.Tensor, weight: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    """``x`` ``[T, K]`` @ ``weight`` ``[N, K]``^T in ``out_dtype``: a float32 ``out_dtype`` on
    lower-precision inputs accumulates and writes float32 (lm_head logits)."""
    if out_dtype == x.dtype:
        return F.linear(x, weight)
    if out_dtype == torch.float32 and x.is_cuda:
        return torch.mm(x, weight.t(), out_dtype=torch.float32)
    return F.linear(x.to(out_dtype), weight.to(out_dtype))


def linear(x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor | None = None, *, out_dtype: torch.dtype | None = None,
           swiglu: bool = False, residual: torch.Tensor | None = None, int8_layout: str = "rows") -> torch.Tensor:
    """``y = x W^T`` (+ SwiGLU, + residual) in ``out_dtype`` (default x's dtype; float32 for the
    lm_head logits: accumulated and written in float32, never rounded through x's dtype).

    - ``x`` ``[T, K]`` (float16 / bfloat16 / float32); ``w`` ``[N, K]`` in x's dtype, or int8 (values
      in [-128, 127]) with ``scale`` float32 ``[N]``: ``round((x w^T) * scale)``.
    - ``swiglu``: ``w`` (and ``scale``) hold the fused ``[gate; up]`` rows; returns ``[T, N / 2]`` =
      ``silu(gate) * up`` of the two halves, each rounded to ``out_dtype`` first (silu_mul.py).
    - ``residual`` ``[T, N or N / 2]``: ``round(y + residual)`` (add.py).
    - ``int8_layout``: the int8 ``w``'s byte order, ``rows`` or ``fragments`` (:func:`pack_fragments`).
    """
    assert int8_layout in INT8_LAYOUTS, f"int8_layout is one of {', '.join(INT8_LAYOUTS)}, got {int8_layout!r}"
    assert int8_layout == "rows" or scale is not None, "the fragments layout is for int8 weights"
    if int8_layout == "fragments":
        w = unpack_fragments(w)
    out_dtype = out_dtype or x.dtype
    if scale is None:
        y = matmul(x, w, out_dtype)
    else:
        acc = matmul(x, w.to(x.dtype), torch.float32)  # exact operands, float32 accumulation
        y = (acc * scale.float()).to(out_dtype)
    if swiglu:
        y = silu_mul(y)
    return y if residual is None else add(y, residual)


__all__ = ["FRAGMENT_K", "INT8_LAYOUTS", "dequantize_int8", "linear", "matmul", "pack_fragments", "quantize_int8",
           "unpack_fragments"]
