"""The tile rules of the linear (backends/triton/linear_tiles.py) at the Qwen3-0.6B / 4B layer
shapes, for both weight formats: ``gemv_config`` / ``gemv_split_k``, ``gemm_config`` (the persistent
TMA kernel where the device has TMA, for launches without SwiGLU), ``counters_needed``."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from tileinfer.backends.triton import linear as triton_linear
from tileinfer.backends.triton.linear import rule_config
from tileinfer.backends.triton.linear_tiles import (
    GEMM_TILES,
    PERSISTENT_SWIGLU_TILES,
    PERSISTENT_TILES,
    SMEM_BYTES,
    GemvConfig,
    counters_needed,
    gemm_config,
    gemv_config,
)

from ..kernel_checks import QWEN3_LINEARS


@pytest.mark.parametrize("name", list(QWEN3_LINEARS))
@pytest.mark.parametrize("T", [1, 2, 16])
def test_gemv_config_rule(name, T):
    N, K = QWEN3_LINEARS[name]
    cfg = gemv_config(N, K, T)
    k_blocks = -(-K // cfg.block_k)
    per_split = -(-k_blocks // cfg.split_k)
    # the real shapes take the unmasked K loop, but T = 1 tiles of 1,024 (masked last chunk: measured faster)
    assert K % cfg.block_k == 0 or (T == 1 and cfg.block_k == 1024)
    assert cfg.split_k >= 1 and (cfg.split_k - 1) * per_split < k_blocks  # no empty split
    row_blocks = -(-N // cfg.block_n)
    if T == 1:
        assert 4 * row_blocks >= 3 * 132 and cfg.split_k == 1  # enough programs: no split at any layer
    elif row_blocks >= 2 * 132:
        assert cfg.split_k == 1 and cfg.block_k == 128  # qkv (4B), gate_up, lm_head
    else:  # o_proj, down: longer K chunks, split until the grid has more than 1.5 programs per SM
        assert cfg.block_k == 256 and 2 * row_blocks * cfg.split_k > 3 * 132 and per_split >= 2
    assert cfg.late_launch == (T > 1)  # PDL: a verify GEMV lets the next kernel launch after its K loop
    assert not cfg.fused_reduce  # the reduce kernel wherever a Qwen3 layer splits
    assert gemv_config(N, K, T) == cfg  # deterministic


def test_gemv_config_splits_small_n_layers():
    assert gemv_config(2560, 9728, 4).split_k > 1  # 4B down_proj: 160 row blocks of 16
    assert gemv_config(1024, 2048, 16).split_k > 1  # 0.6B o_proj
    assert gemv_config(6144, 2560, 4).split_k == 1  # 4B qkv: 384 row blocks
    assert gemv_config(64, 16, 4).split_k == 1  # one K chunk: nothing to split


def test_a_decode_gemv_that_splits_adds_its_partials_in_the_last_program():
    """T = 1 splits K only for layers with few rows (here on 132 SMs: 64 rows); it then takes the
    fused reduce, and the layer's counters cover its column blocks; verify steps keep the kernel."""
    cfg = gemv_config(64, 4096, 1)
    assert cfg.split_k > 1 and cfg.fused_reduce
    assert counters_needed(64, 4096) == -(-64 // cfg.block_n)
    assert gemv_config(64, 4096, 4).split_k > 1 and not gemv_config(64, 4096, 4).fused_reduce
    assert all(counters_needed(N, K) == 0 for N, K in QWEN3_LINEARS.values())


def test_int8_gemv_rule():
    """The tiles of the int8 row at Qwen3-4B's layers; split-K only for few-row layers."""
    assert gemv_config(151936, 2560, 1, int8=True) == GemvConfig(8, 512, 1, 2, 1)
    assert gemv_config(2560, 9728, 1, int8=True) == GemvConfig(4, 2048, 1, 4, 1)
    assert gemv_config(6144, 2560, 1, int8=True) == GemvConfig(4, 512, 1, 2, 1)
    assert gemv_config(6144, 2560, 4, int8=True).block_k == 128
    assert gemv_config(151936, 2560, 16, int8=True).block_n == 64
    assert gemv_config(1024, 3072, 16, int8=True).split_k > 1
    assert gemv_config(64, 40, 1, int8=True).block_k == 64
    assert not gemv_config(6144, 2560, 16, int8=True).late_launch  # not measured for int8


@pytest.mark.parametrize("int8", [False, True], ids=["none", "int8"])
@pytest.mark.parametrize("M", [17, 40, 64, 1024, 4096])
@pytest.mark.parametrize("name", list(QWEN3_LINEARS))
def test_gemm_config_rule(M, name, int8):
    N, K = QWEN3_LINEARS[name]
    cfg = gemm_config(M, N, K, int8=int8)
    fmt = "int8" if int8 else "none"
    assert (cfg.block_m, cfg.block_n, cfg.block_k) in [t[:3] for t in GEMM_TILES[fmt]]
    assert not cfg.persistent and cfg.swap_ab == int8  # no TMA (the interpreter): the tiled kernel
    assert K % cfg.block_k == 0
    if name.endswith("gate_up"):
        assert (N // 2) % cfg.block_n == 0  # fused tiles are exactly the per-op ones
    if M <= 64:
        assert cfg.block_m == 64  # no 128-row tile that is mostly padding
    assert gemm_config(40, 100, 20, int8=int8).block_k == 32


@pytest.mark.parametrize("name", list(QWEN3_LINEARS))
def test_persistent_gemm_where_tma_is_there(name):
    """At T = 1,024 with TMA the plain launches of the 4B layers take the persistent tiles the sweep
    measured fastest (128 x 128 for qkv, 128 x 256 for the others), flattened except the lm_head's
    float32 logits (whose epilogue tile does not fit beside the pipeline); SwiGLU keeps the tiled
    kernel. W8A16 (H100 sweep): the persistent tiles at BLOCK_K 128, transposed, never flattened,
    128 x 256 at the 4B layers but qkv (128 x 128), and 128 x 128 for its fused SwiGLU."""
    N, K = QWEN3_LINEARS[name]
    lm_head = name.endswith("lm_head")
    cfg = gemm_config(1024, N, K, tma=True, out_bytes=4 if lm_head else 2)
    if name.startswith("4B"):
        assert cfg.persistent and cfg.tma and (cfg.block_m, cfg.block_n) == (128, 128 if name == "4B.qkv" else 256)
        assert cfg.flatten == (not lm_head) and cfg.split_rows == 0
    if cfg.persistent:
        bm, bn, bk, warps, stages = cfg.block_m, cfg.block_n, cfg.block_k, cfg.num_warps, cfg.num_stages
        assert (bm, bn, bk, warps, stages) in [t[:5] for t in PERSISTENT_TILES["none"]]
        assert cfg.flatten == (stages * (bm + bn) * bk * 2 + bm * bn * (4 if lm_head else 2) <= SMEM_BYTES)
    assert gemm_config(1024, N, K, tma=True, swiglu=True) == gemm_config(1024, N, K, swiglu=True)
    q = gemm_config(1024, N, K, tma=True, int8=True)
    assert q.swap_ab and not q.flatten and q.block_k == 128
    if name.startswith("4B"):
        assert q.persistent and q.tma and q.block_n == (128 if name == "4B.qkv" else 256)
        assert gemm_config(1024, N, K, tma=True, int8=True, swiglu=True).block_n == 128
    assert not gemm_config(1024, N, K, int8=True).persistent  # no TMA: the tiled kernel


@pytest.mark.parametrize("M", [17, 50, 64, 65, 128, 129, 256])
@pytest.mark.parametrize("name", [n for n in QWEN3_LINEARS if not n.endswith("lm_head")])
def test_w8a16_short_prompts_with_tma(name, M):
    """W8A16 with TMA: persistent tiles only for a plain launch, at any M; the fused SwiGLU keeps the
    non-persistent tiles among its candidates (the 0.6B's at M <= 64 takes the 64 x 64 one, as
    measured); a plain launch of one row block splits K where the grid leaves SMs idle (the 4B o_proj
    and down at T = 50, measured), untransposed; a SwiGLU launch and two row blocks never split; the
    layer's counters cover every split tail."""
    N, K = QWEN3_LINEARS[name]
    swiglu = name.endswith("gate_up")
    cfg = gemm_config(M, N, K, int8=True, tma=True, swiglu=swiglu)
    if name == "0.6B.gate_up" and M <= 64:
        assert not cfg.persistent and (cfg.block_m, cfg.block_n) == (64, 64) and cfg.swap_ab
        return
    tiles = PERSISTENT_SWIGLU_TILES["int8"] if swiglu else PERSISTENT_TILES["int8"]
    assert cfg.persistent and cfg.tma and not cfg.flatten
    assert (cfg.block_m, cfg.block_n, cfg.block_k, cfg.num_warps, cfg.num_stages) in [t[:5] for t in tiles]
    if cfg.split_rows:
        assert M <= cfg.block_m and not swiglu and not cfg.swap_ab and cfg.split_k >= 2 and cfg.split_rows == 1
        assert counters_needed(N, K, int8=True) >= -(-N // cfg.block_n)
    else:
        assert cfg.swap_ab
    if name in ("4B.o_proj", "4B.down") and M <= 128:
        assert cfg.split_rows == 1
    if name == "4B.qkv" or M > 128:
        assert cfg.split_rows == 0
    assert gemm_config(M, N, K, int8=True).persistent is False  # no TMA: the tiled kernel


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_the_persistent_gemm_takes_16_bit_activations_only(monkeypatch, dtype):
    """``rule_config`` on a device with TMA: 16-bit activations take the persistent tiles at the 4B
    o_proj shape; float32 ones keep the tiled kernel (the persistent tiles and stages need twice
    the shared memory in float32, more than an H200 has)."""
    monkeypatch.setattr(triton_linear, "tma_supported", lambda device: True)
    N, K = QWEN3_LINEARS["4B.o_proj"]
    x, w = torch.zeros(1024, K, dtype=dtype), torch.zeros(N, K, dtype=dtype)
    assert rule_config(x, w).persistent == (dtype == torch.float16)


@pytest.mark.parametrize("T", [1, 2, 16])
def test_the_interpreter_runs_the_gemv_in_fewer_wider_programs(T):
    """CPU tensors (the interpreter): the GPU rule's tiles with at least INTERPRETER_BLOCK_N rows a
    program, its other choices (K tiles, split-K) kept."""
    N, K = QWEN3_LINEARS["0.6B.o_proj"]
    x, w = torch.zeros(T, K), torch.zeros(N, K)
    gpu = gemv_config(N, K, T)
    assert gpu.block_n < triton_linear.INTERPRETER_BLOCK_N
    assert rule_config(x, w) == dataclasses.replace(gpu, block_n=triton_linear.INTERPRETER_BLOCK_N)
