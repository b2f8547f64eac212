"""The persistent GEMM's ``warp_specialize`` option (backends/triton/linear_gemm_persistent.py):
the same bits as the same config without it, for both weight formats (transposed or not) and each
epilogue it takes (plain, residual, float32 logits), under the interpreter (which runs the loop
as written) and on the GPU at the Qwen3 shapes (where Triton splits it into a producer and two
consumer warp groups: tests/bench/test_gemm_build.py checks that it does); the configs and the
SwiGLU form it refuses. Outputs NaN-poisoned, inputs fresh per case, shapes odd (ODD) and
TMA-aligned (ALIGNED, as the option needs TMA descriptors)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from tileinfer.backends.reference.linear import linear as ref_linear
from tileinfer.backends.triton.linear import GemmConfig, linear
from tileinfer.backends.triton.linear_gemm_persistent import tma_ok

from ..kernel_checks import DEVICE, QWEN3_LINEARS, assert_close, generator, poisoned, randn

T = 40
ALIGNED = (64, 96)  # TMA-aligned in float16 and in int8
ODD = (72, 136)  # K rows of 272 bytes: TMA in float16; int8 rows of 136 bytes take pointers (flag dropped)


def config(swap_ab: bool = False, **extra) -> GemmConfig:
    return GemmConfig(32, 32, 32, 2, 4, 2, swap_ab=swap_ab, persistent=True, tma=True, programs=3, **extra)


def inputs(N: int, K: int, dtype: torch.dtype, *key, t: int = T):
    g = generator("ws", t, N, K, dtype, *key)
    x = randn((t, K), dtype, g)
    w = randn((N, K), dtype, g, K**-0.5)
    q = torch.randint(-128, 128, (N, K), generator=g, device=DEVICE, dtype=torch.int8)
    scale = (torch.rand(N, generator=g, device=DEVICE) + 0.5) / (K * 5461.5) ** 0.5
    return x, w, q, scale


def forms(x: torch.Tensor, weights: tuple, N: int, cfg: GemmConfig, r: torch.Tensor) -> list[torch.Tensor]:
    """The plain, residual and float32-logits outputs of ``cfg``, each into a NaN-poisoned buffer."""
    outs = []
    for kw in (dict(), dict(residual=r), dict(out_dtype=torch.float32)):
        out = poisoned((x.shape[0], N), kw.get("out_dtype", x.dtype))
        outs.append(linear(x, *weights, out=out, config=cfg, **kw))
    return outs


def assert_same_bits(a: list[torch.Tensor], b: list[torch.Tensor]) -> None:
    for u, v in zip(a, b):
        assert torch.equal(u, v), f"max diff {(u.float() - v.float()).abs().max().item()}"


@pytest.mark.parametrize("shape", [ALIGNED, ODD], ids=["aligned", "odd"])
@pytest.mark.parametrize("fmt", ["float16", "float32", "int8", "int8-swap_ab"])
def test_same_bits_as_without(fmt, shape):
    N, K = shape
    dtype = torch.float32 if fmt == "float32" else torch.float16
    x, w, q, scale = inputs(N, K, dtype, fmt)
    weights = (q, scale) if fmt.startswith("int8") else (w,)
    cfg = config(swap_ab=fmt.endswith("swap_ab"))
    r = randn((T, N), dtype, generator("ws-r", fmt, shape), 4.0)
    plain = forms(x, weights, N, cfg, r)
    assert_same_bits(forms(x, weights, N, dataclasses.replace(cfg, warp_specialize=True), r), plain)
    assert_close(plain[0], ref_linear(x, *weights))


def test_int8_rows_without_tma_take_pointers_and_the_same_bits():
    N, K = ODD
    x, _, q, scale = inputs(N, K, torch.float16, "ws-pointers")
    assert tma_ok(x) and not tma_ok(q)
    y = linear(x, q, scale, config=config(swap_ab=True, warp_specialize=True))
    assert torch.equal(y, linear(x, q, scale, config=config(swap_ab=True)))


@pytest.mark.parametrize("extra", [dict(num_warps=8), dict(tma=False), dict(flatten=True),
                                   dict(split_rows=1, split_k=2), dict(persistent=False, tma=False, programs=0)],
                         ids=["8-warps", "pointers", "flatten", "split", "tiled"])
def test_config_refuses_what_the_pass_would_drop(extra):
    with pytest.raises(AssertionError, match="warp_specialize"):
        dataclasses.replace(config(warp_specialize=True), **extra)


def test_swiglu_is_refused():
    N, K = ALIGNED
    x, w, _, _ = inputs(N, K, torch.float16, "ws-swiglu")
    with pytest.raises(AssertionError, match="not for the fused SwiGLU"):
        linear(x, w, swiglu=True, config=config(warp_specialize=True))


# -- GPU: bfloat16 at the real shapes ---------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("T", [17, 1024])
@pytest.mark.parametrize("fmt", ["bf16", "int8-swap_ab", "int8"])
@pytest.mark.parametrize("name", list(QWEN3_LINEARS))
def test_gpu_same_bits_as_without(name, fmt, T):
    N, K = QWEN3_LINEARS[name]
    x, w, q, scale = inputs(N, K, torch.bfloat16, "gpu", name, fmt, t=T)
    weights = (q, scale) if fmt.startswith("int8") else (w,)
    cfg = GemmConfig(128, 128, 64, 8, 4, 3, swap_ab=fmt.endswith("swap_ab"), persistent=True, tma=True)
    r = randn((T, N), torch.bfloat16, generator("gpu-ws-r", name))
    plain = forms(x, weights, N, cfg, r)
    assert_same_bits(forms(x, weights, N, dataclasses.replace(cfg, warp_specialize=True), r), plain)
    err = ((plain[0].double() - ref_linear(x, *weights).double()).norm() / ref_linear(x, *weights).double().norm())
    assert err.item() < 4e-3


@pytest.mark.parametrize("fmt", ["bf16", "int8"])
def test_sweep_times_warp_specialized_candidates_but_not_for_swiglu(fmt):
    from bench.kernels import linear as module

    for N, K in QWEN3_LINEARS.values():
        plain = [c for c in module.sweep_configs(N, K, 1024, 132, fmt) if c.warp_specialize]
        assert len(plain) == 4 and all(c.tma and c.num_warps == 4 for c in plain)
        assert not [c for c in module.sweep_configs(N, K, 1024, 132, fmt, swiglu=True) if c.warp_specialize]
        assert all(" ws" in module.describe(c.__dict__) for c in plain)
