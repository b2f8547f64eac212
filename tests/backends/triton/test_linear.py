"""linear (tileinfer.backends.triton.linear) against its reference twin, and the bit-identity of its
fused forms (SwiGLU epilogue, RMSNorm prologue, residual epilogue) with the per-op chain
(silu_mul(linear(x, w)); linear_unfused).

Without a GPU the kernels run under the Triton interpreter (tests/conftest.py sets TRITON_INTERPRET
before this module imports them) on small float16 / float32 shapes; the GPU tests use bfloat16 at
the real Qwen3-0.6B / 4B layer shapes. Under the interpreter tl.dot is numpy's matmul, whose result
for an element can depend on its column's place in the tile, so the bit-identity tests there use
I a multiple of every block_n (as in the real models: I = 3072, 9728), where the fused program's gate
and up tiles are exactly the unfused program's tiles; on other widths they are compared with a
tolerance.
"""

from __future__ import annotations

import zlib

import pytest
import torch

from tileinfer.backends.reference import linear as ref
from tileinfer.backends.reference import norm as ref_norm
from tileinfer.backends.triton.linear import (
    GEMM_TILES,
    GemmConfig,
    GemvConfig,
    gemm_config,
    gemv_config,
    linear,
    linear_unfused,
    norm_warps,
)
from tileinfer.backends.triton.swiglu import silu_mul

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.float16, torch.float32] + ([torch.bfloat16] if DEVICE == "cuda" else [])
TOKENS = [1, 2, 7, 16, 17, 40]  # GEMV T=1 (CUDA cores), GEMV tl.dot (2..16), GEMM (17, 40)
# (atol, rtol) of the output dtype for y ~ N(0, 1): both sides accumulate in float32 in different
# orders and round once, so outputs in the model dtype are at most ~1 ulp apart; SwiGLU adds the
# twin's extra rounding of silu(gate) (and exp differences): ~2 ulps.
TOL = {torch.float32: (2e-5, 1e-5), torch.float16: (2e-3, 2e-3), torch.bfloat16: (1.6e-2, 1.6e-2)}
SWIGLU_TOL = {torch.float32: (2e-5, 2e-5), torch.float16: (4e-3, 4e-3), torch.bfloat16: (3.2e-2, 3.2e-2)}
# (N, K): N not a multiple of any block_n and K not a multiple of any block_k / GPU vector width
# multiple of 8; and an aligned shape (I = 64) for the bit-identity tests.
ODD = (200, 136)
ALIGNED = (128, 96)


def seed_of(*parts) -> int:
    """A different, reproducible seed per test case."""
    return zlib.crc32(repr(parts).encode()) % (2**31)


def random_inputs(T: int, N: int, K: int, dtype: torch.dtype, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x ~ N(0, 1) and w ~ N(0, 1/K): y ~ N(0, 1)."""
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    x = torch.randn(T, K, generator=g, device=DEVICE).to(dtype)
    w = (torch.randn(N, K, generator=g, device=DEVICE) / K**0.5).to(dtype)
    return x, w


def poisoned(shape, dtype) -> torch.Tensor:
    return torch.full(shape, float("nan"), dtype=dtype, device=DEVICE)


def check(out: torch.Tensor, expected: torch.Tensor, tol: dict) -> None:
    assert out.dtype == expected.dtype and out.shape == expected.shape
    assert not out.isnan().any(), f"{int(out.isnan().sum())} elements unwritten (NaN poison left)"
    atol, rtol = tol[expected.dtype]
    torch.testing.assert_close(out.float(), expected.float(), atol=atol, rtol=rtol)


def run(x, w, out_dtype, epilogue="none", config=None, pdl=False) -> torch.Tensor:
    n = w.shape[0] // 2 if epilogue == "swiglu" else w.shape[0]
    out = poisoned((x.shape[0], n), out_dtype)
    y = linear(x, w, out_dtype=out_dtype, epilogue=epilogue, out=out, config=config, pdl=pdl)
    assert y is out
    return y


def out_dtypes(dtype):
    return [dtype] if dtype == torch.float32 else [dtype, torch.float32]


CASES = [(T, dtype, od) for T in TOKENS for dtype in DTYPES for od in out_dtypes(dtype)]
CASE_IDS = [f"T{T}-{str(dt)[6:]}-out_{str(od)[6:]}" for T, dt, od in CASES]


# -- against the twin ---------------------------------------------------------------------------


@pytest.mark.parametrize("T,dtype,out_dtype", CASES, ids=CASE_IDS)
def test_linear_matches_reference(T, dtype, out_dtype):
    N, K = ODD
    x, w = random_inputs(T, N, K, dtype, seed_of("plain", T, dtype, out_dtype))
    check(run(x, w, out_dtype), ref.linear(x, w, out_dtype), TOL)


@pytest.mark.parametrize("T,dtype,out_dtype", CASES, ids=CASE_IDS)
def test_swiglu_epilogue_matches_reference(T, dtype, out_dtype):
    N, K = ODD  # I = 100: up rows start mid-tile
    x, w = random_inputs(T, N, K, dtype, seed_of("swiglu", T, dtype, out_dtype))
    expected = ref.silu_mul(ref.linear(x, w, out_dtype))
    check(run(x, w, out_dtype, "swiglu"), expected, SWIGLU_TOL)


@pytest.mark.parametrize("T,dtype,out_dtype", CASES, ids=CASE_IDS)
def test_swiglu_epilogue_bit_identical_to_unfused(T, dtype, out_dtype):
    N, K = ALIGNED
    x, w = random_inputs(T, N, K, dtype, seed_of("identity", T, dtype, out_dtype))
    fused = run(x, w, out_dtype, "swiglu")
    unfused = silu_mul(run(x, w, out_dtype))
    assert torch.equal(fused, unfused), f"max diff {(fused.float() - unfused.float()).abs().max().item()}"
    check(fused, ref.silu_mul(ref.linear(x, w, out_dtype)), SWIGLU_TOL)


# -- RMSNorm prologue, residual epilogue -----------------------------------------------------------

EPS = 1e-6


def norm_residual_inputs(T, N, K, dtype, epilogue, seed):
    """x with a large, uneven scale (the norm must undo it), a norm weight that is not ones, a
    residual of the output's shape."""
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    x = (torch.randn(T, K, generator=g, device=DEVICE) * torch.rand(T, 1, generator=g, device=DEVICE) * 30).to(dtype)
    w = (torch.randn(N, K, generator=g, device=DEVICE) / K**0.5).to(dtype)
    nw = (torch.rand(K, generator=g, device=DEVICE) + 0.5).to(dtype)
    n = N // 2 if epilogue == "swiglu" else N
    r = (torch.randn(T, n, generator=g, device=DEVICE) * 4).to(dtype)
    return x, w, nw, r


def reference_chain(x, w, nw, r, epilogue, out_dtype=None):
    y = ref.linear(x if nw is None else ref_norm.rms_norm(x, nw, EPS), w, out_dtype)
    y = ref.silu_mul(y) if epilogue == "swiglu" else y
    return y if r is None else y + r


NORM_CASES = [(T, parts, ep) for T in (1, 2, 16, 17) for parts in ("norm", "residual", "both")
              for ep in ("none", "swiglu")]


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("T,parts,epilogue", NORM_CASES, ids=[f"T{t}-{p}-{e}" for t, p, e in NORM_CASES])
def test_norm_prologue_and_residual_epilogue(T, parts, epilogue, dtype):
    """Fused == the per-op chain bit for bit, and both match the torch twin."""
    N, K = ALIGNED
    x, w, nw, r = norm_residual_inputs(T, N, K, dtype, epilogue, seed_of("norm-res", T, parts, epilogue, dtype))
    nw = nw if parts in ("norm", "both") else None
    r = r if parts in ("residual", "both") else None
    args = dict(epilogue=epilogue, residual=r) | ({} if nw is None else dict(norm_weight=nw, eps=EPS))
    out = poisoned(r.shape if r is not None else (T, N // 2 if epilogue == "swiglu" else N), dtype)
    fused = linear(x, w, out=out, **args)
    unfused = linear_unfused(x, w, **args)
    assert torch.equal(fused, unfused), f"max diff {(fused.float() - unfused.float()).abs().max().item()}"
    tol = {torch.float32: (1e-4, 1e-4), torch.float16: (1.6e-2, 8e-3)}  # the norm adds a rounding
    check(fused, reference_chain(x, w, nw, r, epilogue), tol)


@pytest.mark.parametrize("T", [1, 2, 16])
def test_norm_prologue_with_split_k_odd_k_and_float32_logits(T):
    """The prologue in every split (K = 136: the last chunk partial), the residual in the reduce;
    and the lm_head form (norm, float32 output)."""
    dtype = torch.float16
    N, K = 96, 136
    cfg = GemvConfig(block_n=16, block_k=32, split_k=3, num_warps=4, num_stages=1)
    x, w, nw, r = norm_residual_inputs(T, N, K, dtype, "none", seed_of("norm-split", T))
    fused = linear(x, w, norm_weight=nw, eps=EPS, residual=r, config=cfg)
    assert torch.equal(fused, linear_unfused(x, w, norm_weight=nw, eps=EPS, residual=r, config=cfg))
    check(fused, reference_chain(x, w, nw, r, "none"), {torch.float16: (1.6e-2, 8e-3)})
    logits = linear(x, w, norm_weight=nw, eps=EPS, out_dtype=torch.float32, out=poisoned((T, N), torch.float32))
    assert torch.equal(logits, linear_unfused(x, w, norm_weight=nw, eps=EPS, out_dtype=torch.float32))
    check(logits, reference_chain(x, w, nw, None, "none", torch.float32), {torch.float32: (1e-2, 1e-2)})


def test_residual_may_be_the_output():
    dtype = torch.float16
    x, w, _, r = norm_residual_inputs(2, 64, 96, dtype, "none", seed_of("in-place"))
    expected = linear(x, w, residual=r)
    y = linear(x, w, residual=r, out=r)
    assert y is r and torch.equal(y, expected)


def test_norm_warps_follow_the_gemv():
    assert norm_warps(1, 6144, 2560) == gemv_config(6144, 2560, 1).num_warps
    assert norm_warps(16, 6144, 2560) == gemv_config(6144, 2560, 16).num_warps
    assert norm_warps(17, 6144, 2560) is None


def test_rejects_bad_norm_and_residual():
    x, w = random_inputs(2, 64, 96, torch.float16, seed_of("bad-norm"))
    with pytest.raises(AssertionError, match="norm_weight"):
        linear(x, w, norm_weight=torch.ones(95, dtype=torch.float16, device=DEVICE))
    with pytest.raises(AssertionError, match="residual"):
        linear(x, w, residual=torch.zeros(2, 63, dtype=torch.float16, device=DEVICE))
    with pytest.raises(AssertionError, match="residual"):
        linear(x, w, out_dtype=torch.float32, residual=torch.zeros(2, 64, dtype=torch.float16, device=DEVICE))


# -- split-K, explicit tiles, strided activations -------------------------------------------------


SPLIT_CASES = [(T, od, ep) for T in (1, 2, 16) for od in ("model", "float32") for ep in ("none", "swiglu")]


@pytest.mark.parametrize("T,out,epilogue", SPLIT_CASES, ids=[f"T{t}-{o}-{e}" for t, o, e in SPLIT_CASES])
def test_split_k_gemv(T, out, epilogue):
    """K = 136 in 32-wide chunks (5 chunks, the last one partial) over 3 splits of 2, 2, 1 chunks."""
    dtype = torch.float16
    out_dtype = dtype if out == "model" else torch.float32
    N, K = 96, 136
    cfg = GemvConfig(block_n=16, block_k=32, split_k=3, num_warps=4, num_stages=1)
    x, w = random_inputs(T, N, K, dtype, seed_of("split", T, out, epilogue))
    y = run(x, w, out_dtype, epilogue, config=cfg)
    expected = ref.linear(x, w, out_dtype)
    if epilogue == "swiglu":
        check(y, ref.silu_mul(expected), SWIGLU_TOL)
        # the split partials are the unfused kernel's: bit-identical even though I = 48 is not a
        # multiple of block_n (the reduce kernel applies the epilogue, element by element)
        assert torch.equal(y, silu_mul(run(x, w, out_dtype, config=cfg)))
    else:
        check(y, expected, TOL)


@pytest.mark.parametrize("T", [1, 7, 40])
def test_gemv_and_gemm_with_explicit_tiles(T):
    """Tiles other than the rule's: several K chunks, unaligned K, M and N tails."""
    dtype = torch.float16
    N, K = 80, 100
    if T <= 16:
        cfg = GemvConfig(block_n=32, block_k=32, split_k=1, num_warps=4, num_stages=2)
    else:
        cfg = GemmConfig(block_m=32, block_n=32, block_k=32, group_m=2, num_warps=4, num_stages=2)
    x, w = random_inputs(T, N, K, dtype, seed_of("tiles", T))
    check(run(x, w, dtype, config=cfg), ref.linear(x, w, dtype), TOL)


@pytest.mark.parametrize("T", [1, 7, 40])
def test_row_slice_activations(T):
    """x may be a column slice of a wider buffer (row stride > K); rows are read with x.stride(0)."""
    dtype = torch.float16
    N, K = 64, 96
    wide, w = random_inputs(T, N, K + 40, dtype, seed_of("strided", T))
    x = wide[:, 8 : 8 + K]
    w = w[:, :K].contiguous()
    assert x.stride(0) == K + 40
    check(run(x, w, dtype), ref.linear(x, w, dtype), TOL)


def test_allocates_output_and_handles_empty_input():
    x, w = random_inputs(3, 64, 32, torch.float16, seed=11)
    y = linear(x, w)
    assert y.shape == (3, 64) and y.dtype == torch.float16 and y.is_contiguous()
    assert linear(x, w, epilogue="swiglu", out_dtype=torch.float32).shape == (3, 32)
    assert linear(x[:0], w).shape == (0, 64)


def test_rejects_bad_input():
    x, w = random_inputs(2, 64, 32, torch.float16, seed=12)
    with pytest.raises(AssertionError):
        linear(x, w.t().contiguous().t())  # w not row-major
    with pytest.raises(AssertionError):
        linear(x.float(), w)  # dtype mismatch
    with pytest.raises(AssertionError):
        linear(x, w[:, :16].contiguous())  # K mismatch
    with pytest.raises(AssertionError):
        linear(x, w[:63].contiguous(), epilogue="swiglu")  # odd row count
    with pytest.raises(AssertionError):
        linear(x, w, epilogue="gelu")
    with pytest.raises(AssertionError):
        linear(x, w, out_dtype=torch.bfloat16)  # neither the model dtype nor float32


# -- the config rules -------------------------------------------------------------------------------

QWEN3_LAYERS = {  # name: (N, K) of the weight, [gate; up] fused and q/k/v fused as loaded
    "4B.qkv": (6144, 2560), "4B.o_proj": (2560, 4096), "4B.gate_up": (19456, 2560),
    "4B.down": (2560, 9728), "4B.lm_head": (151936, 2560),
    "0.6B.qkv": (4096, 1024), "0.6B.o_proj": (1024, 2048), "0.6B.gate_up": (6144, 1024),
    "0.6B.down": (1024, 3072), "0.6B.lm_head": (151936, 1024),
}


@pytest.mark.parametrize("name", list(QWEN3_LAYERS))
@pytest.mark.parametrize("T", [1, 2, 16])
def test_gemv_config_rule(name, T):
    N, K = QWEN3_LAYERS[name]
    cfg = gemv_config(N, K, T)
    k_blocks = -(-K // cfg.block_k)
    per_split = -(-k_blocks // cfg.split_k)
    # the real shapes take the unmasked K loop, but T = 1 tiles of 1,024 (masked last chunk: measured faster)
    assert K % cfg.block_k == 0 or (T == 1 and cfg.block_k == 1024)
    assert cfg.split_k >= 1 and (cfg.split_k - 1) * per_split < k_blocks  # no empty split
    row_blocks = -(-N // cfg.block_n)
    if 4 * row_blocks >= 3 * 132:
        assert cfg.split_k == 1  # enough programs: no split (gate_up, lm_head; every layer at T=1)
    else:
        assert cfg.split_k > 1 and per_split >= 2  # few programs: split, >= 2 chunks per split
    assert gemv_config(N, K, T) == cfg  # deterministic


def test_gemv_config_splits_small_n_layers():
    assert gemv_config(2560, 9728, 4).split_k > 1  # 4B down_proj: 80 row blocks of 32
    assert gemv_config(1024, 2048, 16).split_k > 1  # 0.6B o_proj
    assert gemv_config(6144, 2560, 4).split_k == 1  # 4B qkv: 192 row blocks
    assert gemv_config(64, 16, 4).split_k == 1  # one K chunk: nothing to split


@pytest.mark.parametrize("M", [17, 40, 64, 1024, 4096])
@pytest.mark.parametrize("name", list(QWEN3_LAYERS))
def test_gemm_config_rule(M, name):
    N, K = QWEN3_LAYERS[name]
    cfg = gemm_config(M, N, K)
    assert (cfg.block_m, cfg.block_n, cfg.block_k) in [t[:3] for t in GEMM_TILES]
    assert K % cfg.block_k == 0
    if name.endswith("gate_up"):
        assert (N // 2) % cfg.block_n == 0  # fused tiles are exactly unfused ones
    if M <= 64:
        assert cfg.block_m == 64  # no 128-row tile that is mostly padding


# -- GPU: bfloat16 at the real shapes -------------------------------------------------------------


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


@pytest.mark.gpu
@pytest.mark.parametrize("out", ["bfloat16", "float32"])
@pytest.mark.parametrize("T", [1, 4, 7, 16, 17, 40, 1024])
@pytest.mark.parametrize("name", list(QWEN3_LAYERS))
def test_gpu_bf16_real_shapes_match_reference(name, T, out):
    N, K = QWEN3_LAYERS[name]
    out_dtype = getattr(torch, out)
    x, w = random_inputs(T, N, K, torch.bfloat16, seed_of("gpu", name, T, out))
    y = run(x, w, out_dtype)
    expected = ref.linear(x, w, out_dtype)
    # bf16 operands, float32 accumulation on both sides in different orders (K up to 9728)
    tol = {torch.bfloat16: (1.6e-2, 1.6e-2), torch.float32: (1e-3, 1e-3)}
    check(y, expected, tol)
    assert rel_err(y, expected) < (4e-3 if out_dtype == torch.bfloat16 else 1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("out", ["bfloat16", "float32"])
@pytest.mark.parametrize("T", [1, 4, 16, 64, 1024])
@pytest.mark.parametrize("name", list(QWEN3_LAYERS))
def test_gpu_swiglu_epilogue_bit_identical(name, T, out):
    """Every real shape as if it were a [gate; up] weight: covers the GEMV with and without
    split-K and every GEMM tile the rule picks."""
    N, K = QWEN3_LAYERS[name]
    out_dtype = getattr(torch, out)
    x, w = random_inputs(T, N, K, torch.bfloat16, seed_of("gpu-identity", name, T, out))
    fused = run(x, w, out_dtype, "swiglu")
    unfused = silu_mul(run(x, w, out_dtype))
    assert torch.equal(fused, unfused), f"max diff {(fused.float() - unfused.float()).abs().max().item()}"
    if name.endswith("gate_up"):
        expected = ref.silu_mul(ref.linear(x, w, out_dtype))
        check(fused, expected, {torch.bfloat16: (3.2e-2, 3.2e-2), torch.float32: (1e-3, 1e-3)})


# How the decoder uses each weight: (RMSNorm before it, epilogue, residual added after it)
DECODER_USE = {"qkv": (True, "none", False), "o_proj": (False, "none", True), "gate_up": (True, "swiglu", False),
               "down": (False, "none", True), "lm_head": (True, "none", False)}


@pytest.mark.gpu
@pytest.mark.parametrize("pdl", [False, True], ids=["plain", "pdl"])
@pytest.mark.parametrize("T", [1, 2, 4, 16, 17, 1024])
@pytest.mark.parametrize("name", list(QWEN3_LAYERS))
def test_gpu_norm_and_residual_fused_bit_identical(name, T, pdl):
    """The decoder's use of each real shape (norm prologue, SwiGLU, residual epilogue, float32
    logits), fused against the per-op chain: equal bit for bit; and close to the torch twin."""
    N, K = QWEN3_LAYERS[name]
    has_norm, epilogue, has_residual = DECODER_USE[name.rsplit(".", 1)[1]]
    out_dtype = torch.float32 if name.endswith("lm_head") else torch.bfloat16
    x, w, nw, r = norm_residual_inputs(T, N, K, torch.bfloat16, epilogue, seed_of("gpu-norm-res", name, T))
    args = dict(epilogue=epilogue, out_dtype=out_dtype, pdl=pdl)
    args |= dict(norm_weight=nw, eps=EPS) if has_norm else {}
    args |= dict(residual=r) if has_residual else {}
    n = N // 2 if epilogue == "swiglu" else N
    fused = linear(x, w, out=poisoned((T, n), out_dtype), **args)
    unfused = linear_unfused(x, w, **args)
    assert torch.equal(fused, unfused), f"max diff {(fused.float() - unfused.float()).abs().max().item()}"
    expected = reference_chain(x, w, nw if has_norm else None, r if has_residual else None, epilogue, out_dtype)
    assert rel_err(fused, expected) < (8e-3 if out_dtype == torch.bfloat16 else 4e-3)


@pytest.mark.gpu
@pytest.mark.parametrize("epilogue", ["none", "swiglu"])
@pytest.mark.parametrize("T", [1, 4, 16])
@pytest.mark.parametrize("name", list(QWEN3_LAYERS))
def test_gpu_pdl_launch_bit_identical(name, T, epilogue):
    """Programmatic dependent launch (weights prefetched before the grid dependency wait) gives
    the plain launch's bits, also in a CUDA graph right after a kernel that writes x."""
    N, K = QWEN3_LAYERS[name]
    x, w = random_inputs(T, N, K, torch.bfloat16, seed_of("gpu-pdl", name, T, epilogue))
    plain = run(x, w, torch.bfloat16, epilogue)
    assert torch.equal(run(x, w, torch.bfloat16, epilogue, pdl=True), plain)
    source = x.clone()
    x.zero_()
    n = N // 2 if epilogue == "swiglu" else N
    out = poisoned((T, n), torch.bfloat16)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        x.copy_(source)  # the kernel before writes the activations the GEMV reads
        linear(x, w, epilogue=epilogue, out=out, pdl=True)
    x.zero_()
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, plain)


@pytest.mark.gpu
@pytest.mark.parametrize("T", [1, 16])
@pytest.mark.parametrize("name", ["4B.gate_up", "4B.o_proj", "0.6B.down"])
def test_gpu_pdl_chain_reads_the_previous_gemv_output(name, T):
    """Two dependent GEMVs, both launched with PDL (the second may start while the first runs):
    the second must read the first's finished output, replayed from a graph many times."""
    N, K = QWEN3_LAYERS[name]
    x, w = random_inputs(T, N, K, torch.bfloat16, seed_of("gpu-pdl-chain", name, T))
    _, w2 = random_inputs(T, K, N, torch.bfloat16, seed_of("gpu-pdl-chain-2", name, T))
    expected = run(run(x, w, torch.bfloat16), w2, torch.bfloat16)
    mid = torch.empty((T, N), dtype=torch.bfloat16, device=DEVICE)
    out = torch.empty((T, K), dtype=torch.bfloat16, device=DEVICE)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        linear(x, w, out=mid, pdl=True)
        linear(mid, w2, out=out, pdl=True)
    for _ in range(20):
        mid.fill_(float("nan"))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, expected)
