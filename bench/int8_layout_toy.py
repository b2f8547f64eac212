"""A toy of the W8A16 prefill GEMM's main loop for the prepacked int8 layouts of issue 29, built for
sm_90a on any machine (bench/sm90_build.py; no GPU, no run): ``python -m bench.int8_layout_toy``
prints, per layout and conversion, the instructions per main-loop iteration (one BLOCK_K = 64 step
of one warp) as ``bench gemm-build`` reports them for the engine's kernels.

Tiling and grid: one 128 x 128 x 64 tile a program, 8 warps, 3 stages, grid ``(cdiv(M, 128),
cdiv(N, 128))``, computed transposed (``w x^T``: the converted weight is the register operand of
the HGMMA), as the INT8 rule's tiled kernel (linear_gemm.py with ``swap_ab``), without its
epilogues. Layouts of the weight bytes (LAYOUT): 0 rows (today's); 1 fragment order within each 64
columns (backends/reference/linear.py ``pack_fragments``: a thread's 16 bytes of a row contiguous,
un-permuted in registers by a reshape and a permute). Conversions (CONVERT): 0 the bit patterns
(``int8_to`` BITS 1: sign extension, add, subtract); 1 offset-binary bytes ``q + 128`` stored as
uint8, zero-extended and or-ed under 0x4B000000 by Triton's integer ops; 2 the byte permutes of
``int8_to`` BITS 2 (inline PTX: an xor a register, a ``prmt`` a weight); 3 offset-binary bytes and
one ``prmt`` a weight, no xor (the log's lever (a)).

Every figure is the compiler's, never a measurement.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import sm90_build
from .gemm_build import describe_loop, inspect_build

PRMT_XOR = tl.constexpr(
    "{ .reg .b32 t; xor.b32 t, $4, 0x80808080; prmt.b32 $0, t, 0x4B000000, 0x7540; "
    "prmt.b32 $1, t, 0x4B000000, 0x7541; prmt.b32 $2, t, 0x4B000000, 0x7542; prmt.b32 $3, t, 0x4B000000, 0x7543; }")
PRMT_OFFSET = tl.constexpr(
    "{ prmt.b32 $0, $4, 0x4B000000, 0x7540; prmt.b32 $1, $4, 0x4B000000, 0x7541; "
    "prmt.b32 $2, $4, 0x4B000000, 0x7542; prmt.b32 $3, $4, 0x4B000000, 0x7543; }")
NAMES = {0: "bits", 1: "offset, Triton ops", 2: "byte permutes", 3: "offset, one prmt"}


@triton.jit
def _to_bf16(b, CONVERT: tl.constexpr):
    if CONVERT == 0:
        v = (b.to(tl.int32) + 0x4B000080).to(tl.float32, bitcast=True)
    elif CONVERT == 1:
        v = (b.to(tl.int32) | 0x4B000000).to(tl.float32, bitcast=True)
    elif CONVERT == 2:
        v = tl.inline_asm_elementwise(PRMT_XOR, "=r,=r,=r,=r,r", [b], dtype=tl.int32, is_pure=True,
                                      pack=4).to(tl.float32, bitcast=True)
    else:
        v = tl.inline_asm_elementwise(PRMT_OFFSET, "=r,=r,=r,=r,r", [b], dtype=tl.int32, is_pure=True,
                                      pack=4).to(tl.float32, bitcast=True)
    v = v - 8388736.0
    return (v.to(tl.int32, bitcast=True) >> 16).to(tl.int16).to(tl.bfloat16, bitcast=True)


@triton.jit
def _toy_kernel(x_ptr, w_ptr, y_ptr, M, N, K, stride_xm, stride_wn, stride_ym, BLOCK_M: tl.constexpr,
                BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, LAYOUT: tl.constexpr, CONVERT: tl.constexpr):
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = x_ptr + (offs_m % M).to(tl.int64)[:, None] * stride_xm + offs_k[None, :]
    b_ptrs = w_ptr + (offs_n % N).to(tl.int64)[:, None] * stride_wn + offs_k[None, :]
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for kb in range(0, tl.cdiv(K, BLOCK_K)):
        a = tl.load(a_ptrs + kb * BLOCK_K)
        b = _to_bf16(tl.load(b_ptrs + kb * BLOCK_K), CONVERT)
        if LAYOUT == 1:
            b = tl.reshape(tl.permute(tl.reshape(b, (BLOCK_N, BLOCK_K // 64, 4, 4, 2, 2)), (0, 1, 3, 4, 2, 5)),
                           (BLOCK_N, BLOCK_K))
        acc = tl.dot(b, tl.trans(a), acc)
    acc = tl.trans(acc)
    tl.store(y_ptr + offs_m.to(tl.int64)[:, None] * stride_ym + offs_n[None, :], acc.to(tl.bfloat16),
             mask=(offs_m < M)[:, None] & (offs_n < N)[None, :])


def build(layout: int, convert: int, M: int = 1024, N: int = 6144, K: int = 2560) -> dict:
    """The toy at Qwen3-4B's qkv shape (``N`` x ``K``, ``M`` tokens) built for sm_90a: what
    :func:`bench.gemm_build.inspect_build` reads of it."""
    meta = dict(device="meta")
    x = torch.empty(M, K, dtype=torch.bfloat16, **meta)
    w = torch.empty(N, K, dtype=torch.uint8 if convert in (1, 3) else torch.int8, **meta)
    y = torch.empty(M, N, dtype=torch.bfloat16, **meta)
    build = sm90_build.compile_launch(_toy_kernel, (x, w, y, M, N, K, x.stride(0), w.stride(0), y.stride(0)), dict(
        BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, LAYOUT=layout, CONVERT=convert, num_warps=8, num_stages=3))
    return inspect_build(build)


def main() -> None:
    for layout in (0, 1):
        for convert in NAMES:
            r = build(layout, convert)
            print(f"{'fragments' if layout else 'rows'}, {NAMES[convert]}: {r['registers']} registers, "
                  f"{r['shared_bytes']} bytes shared")
            for loop in r["main_loops"]:
                print(f"  main loop, per iteration: {describe_loop(loop)}")


if __name__ == "__main__":
    main()
