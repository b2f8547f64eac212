"""The tile rules of the linear: ``gemv_config`` / ``gemv_split_k`` (linear_gemv.py) and
``gemm_config`` (linear_gemm.py), at the Qwen3-0.6B / 4B layer shapes."""

from __future__ import annotations

import pytest

from tileinfer.backends.triton.linear_gemm import GEMM_TILES, gemm_config
from tileinfer.backends.triton.linear_gemv import gemv_config

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
        if 4 * row_blocks >= 3 * 132:
            assert cfg.split_k == 1  # enough programs: no split (every layer at T = 1)
        else:
            assert cfg.split_k > 1 and per_split >= 2  # few programs: split, >= 2 chunks per split
    elif row_blocks >= 2 * 132:
        assert cfg.split_k == 1 and cfg.block_k == 128  # qkv (4B), gate_up, lm_head
    else:  # o_proj, down: longer K chunks, split until the grid has more than 1.5 programs per SM
        assert cfg.block_k == 256 and 2 * row_blocks * cfg.split_k > 3 * 132 and per_split >= 2
    assert cfg.late_launch == (T > 1)  # PDL: a verify GEMV lets the next kernel launch after its K loop
    assert gemv_config(N, K, T) == cfg  # deterministic


def test_gemv_config_splits_small_n_layers():
    assert gemv_config(2560, 9728, 4).split_k > 1  # 4B down_proj: 160 row blocks of 16
    assert gemv_config(1024, 2048, 16).split_k > 1  # 0.6B o_proj
    assert gemv_config(6144, 2560, 4).split_k == 1  # 4B qkv: 384 row blocks
    assert gemv_config(64, 16, 4).split_k == 1  # one K chunk: nothing to split


@pytest.mark.parametrize("M", [17, 40, 64, 1024, 4096])
@pytest.mark.parametrize("name", list(QWEN3_LINEARS))
def test_gemm_config_rule(M, name):
    N, K = QWEN3_LINEARS[name]
    cfg = gemm_config(M, N, K)
    assert (cfg.block_m, cfg.block_n, cfg.block_k) in [t[:3] for t in GEMM_TILES]
    assert K % cfg.block_k == 0
    if name.endswith("gate_up"):
        assert (N // 2) % cfg.block_n == 0  # fused tiles are exactly the per-op ones
    if M <= 64:
        assert cfg.block_m == 64  # no 128-row tile that is mostly padding
