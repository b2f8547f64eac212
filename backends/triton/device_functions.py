"""The ``@triton.jit`` device functions that more than one kernel file calls, so that every kernel
doing the same arithmetic does it with the same code, hence rounds alike.

- Programmatic dependent launch at the start of a kernel that reads nothing before its wait:
  :func:`launch_dependents_then_wait` (add.py, kv_write.py, rope.py, silu_mul.py, the split-K
  reduce of linear_gemv.py, the paged attention kernels).
- RMSNorm of vectors loaded as two halves (channels ``0..N/2`` and ``N/2..N``, ``[BLOCK_H,
  BLOCK_HALF]`` float32 tiles, 0 where masked; the q/k kernels of attention_inputs.py rotate those
  halves for RoPE without a shuffle): :func:`load_row_halves`, :func:`load_weight_halves`,
  :func:`rstd_halves`, :func:`scale_normalized`, :func:`rms_norm_halves` (rms_norm.py,
  attention_inputs.py). Arithmetic of Hugging Face Qwen3: ``round(w * round(x * rsqrt(mean(x^2) +
  eps)))``.
- The residual add, ``round(x + r)``: :func:`add_round`, :func:`add_residual` (add.py, the GEMV and
  GEMM epilogues).
- SwiGLU, ``silu(g) * u`` in float32: :func:`silu_mul_f32` (silu_mul.py, the GEMV and GEMM
  epilogues; which is what makes the fused epilogue bit-identical to the chain), and
  :func:`round_to`, the rounding of an accumulator that a store and a load would give.
- RoPE, rotate-half: :func:`rope_rotate` (rope.py, attention_inputs.py).
- The paged KV layout, page ``block_table[p // page_size]`` at slot ``p % page_size``:
  :func:`page_slot` (kv_write.py, attention_inputs.py).
- Symmetric int8 of the KV cache (``LayerKV``'s int8 layout), the quantizer of
  backends/reference/kv_quant.py: :func:`int8_scale` and :func:`quantize_int8` (attention_inputs.py,
  kv_write.py); a key (smoothed) and a value stored as int8 halves with their scales:
  :func:`store_int8_halves`, :func:`store_kv_int8` (attention_inputs.py, persistent_items.py).
- The linear's tiles (linear_gemv.py, linear_gemm.py, linear_gemm_persistent.py): int8 weights
  converted exactly to the activation dtype (:func:`int8_to`), a K chunk loaded (:func:`load_chunk`)
  and multiplied into a float32 accumulator (:func:`dot_chunk`), and an output tile stored through
  the residual epilogue (:func:`store_tile`).

The tile loops of the paged attention are in paged_attention_tiles.py. Every function returns once,
at its end: the compiler would also build the code after a return inside a constexpr branch.
"""
from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

# -- programmatic dependent launch -------------------------------------------------------------------


@triton.jit
def launch_dependents_then_wait(PDL: tl.constexpr):
    """With ``PDL``: let the next kernel launch, then wait for the kernel before (pdl.py), first
    thing in a kernel that reads nothing before the wait; nothing without."""
    if PDL:
        gdc_launch_dependents()
        gdc_wait()


# -- RMSNorm ---------------------------------------------------------------------------------------


@triton.jit
def rstd_halves(a, b, N: tl.constexpr, eps):
    """``rsqrt(mean(x^2) + eps)`` of the rows of ``(a, b)`` (float32 ``[BLOCK_H, BLOCK_HALF]`` halves
    of vectors of length ``N``, 0 where masked): ``[BLOCK_H, 1]``. The order of the sum depends on
    the tiles and ``num_warps`` only: every caller that must round alike uses the same ones."""
    ss = tl.sum(a * a, axis=1, keep_dims=True) + tl.sum(b * b, axis=1, keep_dims=True)
    return tl.math.rsqrt(ss / N + eps)


@triton.jit
def scale_normalized(x, rstd, w, DTYPE: tl.constexpr):
    """``round(w * round(x * rstd))`` in DTYPE, from float32 ``x`` and ``w`` (the model-dtype
    weight's values); elementwise, so any tile of ``x`` gives the same bits."""
    return (w * (x * rstd).to(DTYPE).to(tl.float32)).to(DTYPE)


@triton.jit
def rms_norm_halves(a, b, wa, wb, N: tl.constexpr, eps, DTYPE: tl.constexpr):
    """RMSNorm of the rows of ``(a, b)``: float32 ``[BLOCK_H, BLOCK_HALF]`` tiles holding the two
    halves of ``BLOCK_H`` vectors of length ``N`` (0 where masked), with weight halves ``wa``,
    ``wb`` (``[1, BLOCK_HALF]``, float32 values of the model-dtype weight). Returns both halves in
    ``DTYPE``: ``round(w * round(x * rsqrt(mean(x^2) + eps)))``."""
    rstd = rstd_halves(a, b, N, eps)
    return scale_normalized(a, rstd, wa, DTYPE), scale_normalized(b, rstd, wb, DTYPE)


@triton.jit
def load_row_halves(row_ptr, N: tl.constexpr, BLOCK_HALF: tl.constexpr):
    """The two halves of the ``[N]`` vector at ``row_ptr`` as float32 ``[1, BLOCK_HALF]`` tiles (0
    where masked), the row kernel of rms_norm.py's layout."""
    offs = tl.arange(0, BLOCK_HALF)[None, :]
    mask = offs < N // 2
    a = tl.load(row_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(row_ptr + N // 2 + offs, mask=mask, other=0.0).to(tl.float32)
    return a, b


@triton.jit
def load_weight_halves(w_ptr, offs, D: tl.constexpr):
    """The two halves of a ``[D]`` norm weight as float32 ``[1, BLOCK_HALF]`` tiles."""
    wa = tl.load(w_ptr + offs, mask=offs < D // 2, other=0.0).to(tl.float32)
    wb = tl.load(w_ptr + D // 2 + offs, mask=offs < D // 2, other=0.0).to(tl.float32)
    return wa, wb


# -- residual add, SwiGLU, roundings ------------------------------------------------------------------


@triton.jit
def add_round(x, r, DTYPE: tl.constexpr):
    """``round(x + r)`` to the model dtype, from float32 operands (the residual add)."""
    return (x + r).to(DTYPE)


@triton.jit
def add_residual(y, r_ptrs, mask, RESIDUAL: tl.constexpr):
    """The residual epilogue: ``round(y + r)`` (``y`` already in the output dtype), as add.py's kernel."""
    if RESIDUAL:
        r = tl.load(r_ptrs, mask=mask, other=0.0).to(tl.float32)
        y = add_round(y.to(tl.float32), r, y.dtype)
    return y


@triton.jit
def round_to(acc, dtype: tl.constexpr):
    """The float32 value that a store of ``acc`` in ``dtype`` followed by a load would give."""
    return acc.to(dtype).to(tl.float32)


@triton.jit
def silu_mul_f32(g, u):
    """silu(g) * u in float32: ``g / (1 + exp(-g)) * u``, rounded once by the caller's store.

    ``g`` and ``u`` are float32 values already rounded to the model (output) dtype, exactly as they
    would be stored by the linear that produced them. Every SwiGLU of the kernels goes through here.
    """
    return g / (1.0 + tl.exp(-g)) * u


# -- RoPE, paged KV ----------------------------------------------------------------------------------


@triton.jit
def rope_rotate(a, b, c, s, DTYPE: tl.constexpr):
    """Rotate the float32 halves ``a``, ``b`` by angles with cosines ``c`` and sines ``s``; returns
    both halves rounded to ``DTYPE``."""
    return (a * c - b * s).to(DTYPE), (b * c + a * s).to(DTYPE)


@triton.jit
def page_slot(bt_ptr, pos, PAGE_SIZE: tl.constexpr):
    """``(page, slot)`` (int64) of position ``pos`` through the block table."""
    page = tl.load(bt_ptr + pos // PAGE_SIZE).to(tl.int64)
    return page, pos % PAGE_SIZE


# -- symmetric int8 of the KV cache ------------------------------------------------------------------


@triton.jit
def int8_scale(amax):
    """Per-vector scale of symmetric INT8 from the float32 absmax: ``max(amax, 1e-12) * float32(1 /
    127)``, as ``quantize_per_vector`` computes it."""
    return tl.maximum(amax, 1e-12) * (1.0 / 127.0)


@triton.jit
def quantize_int8(x, scale):
    """``round_half_even(x / scale)`` clamped to ``[-127, 127]``, as int8, from float32 ``x`` and a
    ``scale`` that broadcasts against it: an IEEE division (``div_rn``; Triton's ``/`` is an
    approximate one on the GPU), then rounding by adding and subtracting 1.5 * 2**23 (exact for
    ``|x / scale| < 2**22``, in the interpreter too, where libdevice's ``rint`` does not run). The
    kernels that call it are compiled without FMA contraction."""
    y = tl.math.div_rn(x, scale)
    y = (y + 12582912.0) - 12582912.0
    y = tl.minimum(tl.maximum(y, -127.0), 127.0)
    return y.to(tl.int8)


@triton.jit
def store_int8_halves(dst, scale_dst, a, b, mask, row_ok, D: tl.constexpr):
    """Quantize the vectors whose float32 halves are the rows of ``a``, ``b`` (``[R, HALF]``, 0
    where masked) as ``quantize_per_vector`` does, and store them (int8, at ``dst`` and ``dst +
    D/2``, ``mask``) and their float32 scales (``scale_dst``, ``[R, 1]``, ``row_ok``)."""
    amax = tl.maximum(tl.max(tl.abs(a), 1, keep_dims=True), tl.max(tl.abs(b), 1, keep_dims=True))
    scale = int8_scale(amax)
    tl.store(dst, quantize_int8(a, scale), mask=mask)
    tl.store(dst + D // 2, quantize_int8(b, scale), mask=mask)
    tl.store(scale_dst, scale, mask=row_ok)


@triton.jit
def store_kv_int8(k_dst, v_dst, ks_dst, vs_dst, ka, kb, va, vb, smooth_ptr, offs, mask, row_ok,
                  SMOOTH: tl.constexpr, D: tl.constexpr):
    """A key and a value per row into int8 pages, as ``write_quantized`` of
    backends/reference/kv_quant.py: the key's float32 halves ``ka``, ``kb`` (``[R, HALF]``, the
    rotated key rounded to the model dtype) divided by the smoothing (``smooth_ptr``, ``[D]``
    float32, an IEEE division; 1 in the lanes ``offs >= D/2``) where SMOOTH, then the key and the
    value halves ``va``, ``vb`` quantized with one scale per vector (:func:`store_int8_halves`):
    int8 at ``k_dst``, ``v_dst``, scales at ``ks_dst``, ``vs_dst`` (``[R, 1]``)."""
    if SMOOTH:
        ka = tl.math.div_rn(ka, tl.load(smooth_ptr + offs, mask=offs < D // 2, other=1.0))
        kb = tl.math.div_rn(kb, tl.load(smooth_ptr + D // 2 + offs, mask=offs < D // 2, other=1.0))
    store_int8_halves(k_dst, ks_dst, ka, kb, mask, row_ok, D)
    store_int8_halves(v_dst, vs_dst, va, vb, mask, row_ok, D)


# -- the linear's tiles -----------------------------------------------------------------------------


# int8 x 4 (one 32-bit register) -> the float32 patterns 0x4B0000uu of u = q + 128 (q ^ 0x80 as a
# byte): one xor a register, one byte permute an element (PTX ``prmt``, selectors 0x7540 + j: byte j of
# t, then bytes 0, 1 and 3 of 0x4B000000).
INT8_TO_F32_PATTERNS = tl.constexpr(
    "{ .reg .b32 t; xor.b32 t, $4, 0x80808080; prmt.b32 $0, t, 0x4B000000, 0x7540; "
    "prmt.b32 $1, t, 0x4B000000, 0x7541; prmt.b32 $2, t, 0x4B000000, 0x7542; prmt.b32 $3, t, 0x4B000000, 0x7543; }")


@triton.jit
def int8_to(q, DTYPE: tl.constexpr, BITS: tl.constexpr):
    """The int8 tile ``q`` as exact ``DTYPE`` values (float16 / bfloat16 / float32).

    ``BITS`` 0: Triton's cast. 1: on the bit patterns, with no conversion instruction. float32:
    ``0x4B000080 + q`` (sign-extended) is the float ``2^23 + 128 + q``, minus ``2^23 + 128`` gives q
    exactly. float16: ``0x6480 + q`` is ``1152 + q`` (the float16 unit at 1024 is 1), minus 1152.
    bfloat16: the top half of q's float32 pattern (q has at most 8 significant bits, the low half is
    zero). 2 (a GPU only: inline PTX): the float32 patterns of 1 built four at a time by byte
    permutes (:data:`INT8_TO_F32_PATTERNS`: per element one ``prmt``, where 1 takes a sign-extending
    permute and an add), float16 as 1. All give the same values."""
    if BITS == 2 and DTYPE != tl.float16:
        v = tl.inline_asm_elementwise(INT8_TO_F32_PATTERNS, "=r,=r,=r,=r,r", [q], dtype=tl.int32, is_pure=True,
                                      pack=4).to(tl.float32, bitcast=True) - 8388736.0
        if DTYPE == tl.bfloat16:
            v = (v.to(tl.int32, bitcast=True) >> 16).to(tl.int16).to(tl.bfloat16, bitcast=True)
    elif BITS:
        if DTYPE == tl.float16:
            v = (q.to(tl.int16) + 0x6480).to(tl.float16, bitcast=True) - 1152.0
        else:
            v = (q.to(tl.int32) + 0x4B000080).to(tl.float32, bitcast=True) - 8388736.0
            if DTYPE == tl.bfloat16:
                v = (v.to(tl.int32, bitcast=True) >> 16).to(tl.int16).to(tl.bfloat16, bitcast=True)
    else:
        v = q.to(DTYPE)
    return v


@triton.jit
def load_chunk(ptrs, k0, offs_k, K, EVEN_K: tl.constexpr):
    """The ``[rows, BLOCK_K]`` chunk at ``ptrs + k0`` (columns ``k0 + offs_k``), 0 past ``K`` unless
    EVEN_K (K a multiple of BLOCK_K)."""
    if EVEN_K:
        t = tl.load(ptrs + k0)
    else:
        t = tl.load(ptrs + k0, mask=(offs_k < K - k0)[None, :], other=0)
    return t


@triton.jit
def dot_chunk(a, b, acc, DOT_F32: tl.constexpr, INT8: tl.constexpr, BITS: tl.constexpr, SWAP_AB: tl.constexpr):
    """``acc + a b^T`` for activations ``a`` ``[M, BLOCK_K]`` and weights ``b`` ``[N, BLOCK_K]`` (int8
    where INT8, converted exactly to a's dtype by :func:`int8_to`), float32 accumulator ``[M, N]``;
    with SWAP_AB ``acc + b a^T`` (``[N, M]``: the converted weight is the first operand, which
    Hopper's tensor cores read from registers). DOT_F32: float32 operands (the interpreter)."""
    if DOT_F32:
        a = a.to(tl.float32)
        if not INT8:
            b = b.to(tl.float32)
    if INT8:
        b = int8_to(b, a.dtype, BITS)
    if SWAP_AB:
        acc = tl.dot(b, tl.trans(a), acc, input_precision="ieee")
    else:
        acc = tl.dot(a, tl.trans(b), acc, input_precision="ieee")
    return acc


@triton.jit
def store_tile(acc, y_ptr, r_ptr, offs_m, offs_n, M, N, stride_ym, stride_rm, RESIDUAL: tl.constexpr):
    """The store of the float32 output tile ``acc`` (rows ``offs_m``, columns ``offs_n``): rounded to
    y's dtype, plus ``r`` where RESIDUAL (add.py's rounding)."""
    out_ty = y_ptr.dtype.element_ty
    mask = (offs_m < M)[:, None] & (offs_n < N)[None, :]
    r_ptrs = r_ptr + offs_m.to(tl.int64)[:, None] * stride_rm + offs_n[None, :]
    y = add_residual(acc.to(out_ty), r_ptrs, mask, RESIDUAL)
    tl.store(y_ptr + offs_m.to(tl.int64)[:, None] * stride_ym + offs_n[None, :], y, mask=mask)
