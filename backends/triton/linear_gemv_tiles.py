"""The tiles of the GEMV (linear_gemv.py) and of the int8 GEMV (linear_int8_gemv.py) for steps of
1..16 tokens: one rule per path, measured on an H200 (records named in each docstring)."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import triton

from tileinfer.backends.triton import SMALL_STEP_MAX_TOKENS
from tileinfer.backends.triton.interpreter import DEFAULT_NUM_SMS


@dataclass(frozen=True)
class GemvConfig:
    block_n: int
    block_k: int
    split_k: int
    num_warps: int
    num_stages: int
    fused_reduce: bool = False  # split-K: the last split's program adds the partials (no reduce kernel)
    late_launch: bool = False  # with PDL: the next kernel may launch after the K loop, not at the start


LM_HEAD_ROWS = 32768  # weight rows from which a GEMV is an lm_head-sized stream (vocabulary rows)


@functools.lru_cache(maxsize=None)
def gemv_config(N: int, K: int, T: int, sms: int = DEFAULT_NUM_SMS) -> GemvConfig:
    """Tiles for the GEMV path; ``N`` = weight rows (2I for the fused SwiGLU weight), ``T`` <= 16.

    Rule (measured on an H200 over the Qwen3-0.6B / 4B layers, every weight out of L2, against
    ~30 alternatives per layer: bench/kernels/linear.py --sweep):

    - T = 1 (CUDA cores): BLOCK_N = 4, BLOCK_K = 512, 2 warps, 1 stage. Each thread keeps four
      16-byte loads in flight per step; small programs (4 KB per step, ~40 registers) give every
      layer >= 256 programs and up to 32 resident per SM, which hides DRAM latency better than
      bigger tiles or split-K did. Layers with fewer than 16 such programs per SM (Qwen3-4B's
      qkv, o_proj, down) take BLOCK_K = 1,024 and 4 warps: the same bytes in flight per thread,
      twice as many threads per SM. Measured over a whole Qwen3-4B step's linears in one graph,
      with PDL: 2.17 ms against 2.29 ms (bench/kernels/linear.py --decode-step).
    - T = 2..16 (tl.dot, M padded to 16; ``verify_tiles``): small programs again, 16 weight rows
      and 2 warps (32 rows for N >= 16,384, 64 rows and 4 warps for an lm_head), BLOCK_K = 128
      with 4 stages of cp.async in flight; layers with fewer row blocks than 2 per SM (o_proj,
      down) take BLOCK_K = 256 with 3 stages and split K until the grid has more than 1.5
      programs per SM. Within 4 % of the best swept tile on every layer but Qwen3-0.6B's o_proj
      (9 %); 32x128 / 4-warp tiles are 1-14 % slower (split-K 8 on o_proj and down). Records: bench/results/NVIDIA-H200/tiles_df4a228/.
    - ``late_launch`` at T = 2..16: with PDL the next kernel launches after the K loop, not at the
      start. A Qwen3-4B 16-token step after 1,024 positions 3.73 -> 3.27 ms, 2 tokens 3.67 -> 3.22
      (bench/pdl_probe.py, record bench/results/NVIDIA-H200/steps_4395a2d/pdl_probe.json); at T = 1 the
      early launch stays (2.73 against 2.75 ms).
    - BLOCK_K shrinks to next_pow2(K) for small K (never below 16).
    - SPLIT_K at T = 1 (``gemv_split_k``): only when the grid would leave a quarter of the SMs idle.
    """
    return GemvConfig(*gemv_tiles(N, K, T, sms), late_launch=T > 1)


def gemv_tiles(N: int, K: int, T: int, sms: int = DEFAULT_NUM_SMS, int8: bool = False) -> tuple[int, ...]:
    """The rule of :func:`gemv_config` (``int8``: of the int8 GEMV's, linear_int8_gemv.py
    ``gemv_int8_config``) as ``(block_n, block_k, split_k, num_warps, num_stages)``."""
    assert N >= 1 and K >= 1 and 1 <= T <= SMALL_STEP_MAX_TOKENS
    if T > 1:
        return verify_tiles(N, K, sms, int8)
    if int8:
        block_n, block_k, warps = (8 if N >= LM_HEAD_ROWS else 4), 512, 2
        if triton.cdiv(N, 4) < 8 * sms:
            block_k, warps = 2048, 4
    else:
        block_n, block_k, warps = 4, 512, 2
        if triton.cdiv(N, block_n) < 16 * sms:
            block_k, warps = 1024, 4
    block_k = min(block_k, max(16, triton.next_power_of_2(K)))
    return block_n, block_k, gemv_split_k(N, K, block_n, block_k, sms), warps, 1


def verify_tiles(N: int, K: int, sms: int = DEFAULT_NUM_SMS, int8: bool = False) -> tuple[int, ...]:
    """The T = 2..16 part of :func:`gemv_tiles`. The int8 GEMV keeps 32x128 tiles of 4 warps (64
    rows for an lm_head) with ``gemv_split_k``: its sweep (bench/kernels/linear_int8.py) had no
    smaller tile, and 128 int8 columns beat 256 on every layer."""
    if int8:
        block_n, block_k, warps, stages = (64 if N >= LM_HEAD_ROWS else 32), 128, 4, 4
        block_k = min(block_k, max(16, triton.next_power_of_2(K)))
        return block_n, block_k, gemv_split_k(N, K, block_n, block_k, sms), warps, stages
    if N >= LM_HEAD_ROWS:
        block_n, warps, stages = 64, 4, 3
    else:
        block_n, warps, stages = (32 if N >= 16384 else 16), 2, 4
    block_k, split = 128, 1
    programs = triton.cdiv(N, block_n)
    if programs < 2 * sms:
        block_k, stages = 256, 3
        k_blocks = triton.cdiv(K, min(block_k, max(16, triton.next_power_of_2(K))))
        while 2 * programs * split <= 3 * sms and k_blocks >= 4 * split:
            split *= 2
        split = triton.cdiv(k_blocks, triton.cdiv(k_blocks, split))  # no empty split
    block_k = min(block_k, max(16, triton.next_power_of_2(K)))
    return block_n, block_k, split, warps, stages


def gemv_split_k(N: int, K: int, block_n: int, block_k: int, sms: int = DEFAULT_NUM_SMS) -> int:
    """SPLIT_K for the given tiles: 1 when the grid has at least 3/4 as many programs as SMs (the
    reduce kernel costs ~2 us, more than the tail it would save); else doubled while the grid has
    fewer than 4 programs per SM and each split keeps at least 2 BLOCK_K chunks, then recomputed
    from the chunks per split (``cdiv``) so that no split is empty."""
    programs = triton.cdiv(N, block_n)
    k_blocks = triton.cdiv(K, block_k)
    if 4 * programs >= 3 * sms:
        return 1
    split = 1
    while programs * split < 4 * sms and k_blocks >= 4 * split:
        split *= 2
    return triton.cdiv(k_blocks, triton.cdiv(k_blocks, split))


__all__ = ["LM_HEAD_ROWS", "GemvConfig", "gemv_config", "gemv_split_k", "gemv_tiles", "verify_tiles"]
