"""linear (backends/triton/linear.py: the GEMV of linear_gemv.py, the GEMM of linear_gemm.py) against
its twin (backends/reference/linear.py, with silu_mul.py, rms_norm.py and add.py for the fused
parts), and the bit-identity of its fused forms (SwiGLU epilogue, RMSNorm prologue, residual
epilogue) with the chain of per-op kernels (per_op_chains.linear_per_op).

Under the interpreter tl.dot is numpy's matmul, whose result for an element can depend on its
column's place in the tile, so the bit-identity tests there use I a multiple of every block_n (as
in the real models: I = 3072, 9728), where the fused program's gate and up tiles are exactly the
plain program's tiles; on other widths they are compared with a tolerance.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from tileinfer.backends.triton import SMALL_STEP_MAX_TOKENS

from tileinfer.backends.reference import linear as ref
from tileinfer.backends.reference.add import add as ref_add
from tileinfer.backends.reference.rms_norm import rms_norm as ref_rms_norm
from tileinfer.backends.reference.silu_mul import silu_mul as ref_silu_mul
from tileinfer.backends.triton.linear import (
    GemmConfig,
    GemvConfig,
    gemv_config,
    linear,
    norm_warps,
)
from tileinfer.backends.triton.silu_mul import silu_mul

from ..kernel_checks import DEVICE, EPS, INTERPRETER_DTYPES, QWEN3_LINEARS, assert_close, generator, poisoned
from .per_op_chains import linear_per_op

DTYPES = INTERPRETER_DTYPES + ([torch.bfloat16] if DEVICE == "cuda" else [])
TOKENS = [1, 2, 7, 16, 17, 40]  # GEMV T=1 (CUDA cores), GEMV tl.dot (2..16), GEMM (17, 40)
# (N, K): N not a multiple of any block_n and K not a multiple of any block_k / GPU vector width
# multiple of 8; and an aligned shape (I = 64) for the bit-identity tests.
ODD = (200, 136)
ALIGNED = (128, 96)


def random_inputs(T: int, N: int, K: int, dtype: torch.dtype, *key) -> tuple[torch.Tensor, torch.Tensor]:
    """x ~ N(0, 1) and w ~ N(0, 1/K): y ~ N(0, 1)."""
    g = generator(T, N, K, dtype, *key)
    x = torch.randn(T, K, generator=g, device=DEVICE).to(dtype)
    w = (torch.randn(N, K, generator=g, device=DEVICE) / K**0.5).to(dtype)
    return x, w


def run(x, w, out_dtype, swiglu=False, config=None, pdl=False) -> torch.Tensor:
    n = w.shape[0] // 2 if swiglu else w.shape[0]
    out = poisoned((x.shape[0], n), out_dtype)
    y = linear(x, w, out_dtype=out_dtype, swiglu=swiglu, out=out, config=config, pdl=pdl)
    assert y is out
    return y


def assert_equal(fused: torch.Tensor, chain: torch.Tensor) -> None:
    assert torch.equal(fused, chain), f"max diff {(fused.float() - chain.float()).abs().max().item()}"


def out_dtypes(dtype):
    return [dtype] if dtype == torch.float32 else [dtype, torch.float32]


CASES = [(T, dtype, od) for T in TOKENS for dtype in DTYPES for od in out_dtypes(dtype)]
CASE_IDS = [f"T{T}-{str(dt)[6:]}-out_{str(od)[6:]}" for T, dt, od in CASES]


# -- against the twin ---------------------------------------------------------------------------


@pytest.mark.parametrize("T,dtype,out_dtype", CASES, ids=CASE_IDS)
def test_linear_matches_reference(T, dtype, out_dtype):
    N, K = ODD
    x, w = random_inputs(T, N, K, dtype, "plain", out_dtype)
    assert_close(run(x, w, out_dtype), ref.linear(x, w, out_dtype))


@pytest.mark.parametrize("T,dtype,out_dtype", CASES, ids=CASE_IDS)
def test_swiglu_epilogue_matches_reference(T, dtype, out_dtype):
    N, K = ODD  # I = 100: up rows start mid-tile
    x, w = random_inputs(T, N, K, dtype, "swiglu", out_dtype)
    expected = ref_silu_mul(ref.linear(x, w, out_dtype))
    assert_close(run(x, w, out_dtype, swiglu=True), expected, "two_roundings")


@pytest.mark.parametrize("T,dtype,out_dtype", CASES, ids=CASE_IDS)
def test_swiglu_epilogue_bit_identical_to_per_op(T, dtype, out_dtype):
    N, K = ALIGNED
    x, w = random_inputs(T, N, K, dtype, "identity", out_dtype)
    fused = run(x, w, out_dtype, swiglu=True)
    assert_equal(fused, silu_mul(run(x, w, out_dtype)))
    assert_close(fused, ref_silu_mul(ref.linear(x, w, out_dtype)), "two_roundings")


# -- RMSNorm prologue, residual epilogue -----------------------------------------------------------

def norm_residual_inputs(T, N, K, dtype, swiglu, *key):
    """x with a large, uneven scale (the norm must undo it), a norm weight that is not ones, a
    residual of the output's shape."""
    g = generator("norm-res", T, N, K, dtype, swiglu, *key)
    x = (torch.randn(T, K, generator=g, device=DEVICE) * torch.rand(T, 1, generator=g, device=DEVICE) * 30).to(dtype)
    w = (torch.randn(N, K, generator=g, device=DEVICE) / K**0.5).to(dtype)
    nw = (torch.rand(K, generator=g, device=DEVICE) + 0.5).to(dtype)
    n = N // 2 if swiglu else N
    r = (torch.randn(T, n, generator=g, device=DEVICE) * 4).to(dtype)
    return x, w, nw, r


def reference_chain(x, w, nw, r, swiglu, out_dtype=None):
    """The twins' chain: rms_norm, linear, silu_mul, add."""
    y = ref.linear(x if nw is None else ref_rms_norm(x, nw, EPS), w, out_dtype)
    y = ref_silu_mul(y) if swiglu else y
    return y if r is None else ref_add(y, r)


NORM_CASES = [(T, parts, sw) for T in (1, 2, 16, 17) for parts in ("norm", "residual", "both")
              for sw in (False, True)]


@pytest.mark.parametrize("dtype", INTERPRETER_DTYPES, ids=str)
@pytest.mark.parametrize("T,parts,swiglu", NORM_CASES,
                         ids=[f"T{t}-{p}-{'swiglu' if s else 'plain'}" for t, p, s in NORM_CASES])
def test_norm_prologue_and_residual_epilogue(T, parts, swiglu, dtype):
    """Fused == the per-op chain bit for bit, and both match the twins' chain."""
    N, K = ALIGNED
    x, w, nw, r = norm_residual_inputs(T, N, K, dtype, swiglu, parts)
    nw = nw if parts in ("norm", "both") else None
    r = r if parts in ("residual", "both") else None
    args = dict(swiglu=swiglu, residual=r) | ({} if nw is None else dict(norm_weight=nw, eps=EPS))
    out = poisoned(r.shape if r is not None else (T, N // 2 if swiglu else N), dtype)
    fused = linear(x, w, out=out, **args)
    if x.is_cuda and dtype == torch.float32 and nw is not None and T <= SMALL_STEP_MAX_TOKENS:
        # Compiled float32 only: the prologue's sum of squares differs from the row kernel's in the
        # last bit (no rounding to a narrower dtype hides it); model dtypes of 16 bits are exact.
        assert_close(fused, linear_per_op(x, w, **args), "one_rounding")
    else:
        assert_equal(fused, linear_per_op(x, w, **args))
    assert_close(fused, reference_chain(x, w, nw, r, swiglu), "norm_residual_matmul")


@pytest.mark.parametrize("T", [1, 2, 16])
def test_norm_prologue_with_split_k_odd_k_and_float32_logits(T):
    """The prologue in every split (K = 136: the last chunk partial), the residual in the reduce;
    and the lm_head form (norm, float32 output)."""
    dtype = torch.float16
    N, K = 96, 136
    cfg = GemvConfig(block_n=16, block_k=32, split_k=3, num_warps=4, num_stages=1)
    x, w, nw, r = norm_residual_inputs(T, N, K, dtype, False, "split")
    fused = linear(x, w, norm_weight=nw, eps=EPS, residual=r, config=cfg, out=poisoned((T, N), dtype))
    assert_equal(fused, linear_per_op(x, w, norm_weight=nw, eps=EPS, residual=r, config=cfg))
    assert_close(fused, reference_chain(x, w, nw, r, False), "norm_residual_matmul")
    logits = linear(x, w, norm_weight=nw, eps=EPS, out_dtype=torch.float32, out=poisoned((T, N), torch.float32))
    assert_equal(logits, linear_per_op(x, w, norm_weight=nw, eps=EPS, out_dtype=torch.float32))
    # float32 logits of float16 operands: the float16 roundings of the norm are the ones that matter
    assert_close(logits, reference_chain(x, w, nw, None, False, torch.float32), "norm_residual_matmul", dtype=dtype)


def test_residual_may_be_the_output():
    dtype = torch.float16
    x, w, _, r = norm_residual_inputs(2, 64, 96, dtype, False, "in-place")
    expected = linear(x, w, residual=r)
    y = linear(x, w, residual=r, out=r)
    assert y is r and torch.equal(y, expected)


def test_norm_warps_follow_the_gemv():
    assert norm_warps(1, 6144, 2560) == gemv_config(6144, 2560, 1).num_warps
    assert norm_warps(16, 6144, 2560) == gemv_config(6144, 2560, 16).num_warps
    assert norm_warps(17, 6144, 2560) is None


def test_rejects_bad_norm_and_residual():
    x, w = random_inputs(2, 64, 96, torch.float16, "bad-norm")
    with pytest.raises(AssertionError, match="norm_weight"):
        linear(x, w, norm_weight=torch.ones(95, dtype=torch.float16, device=DEVICE))
    with pytest.raises(AssertionError, match="residual"):
        linear(x, w, residual=torch.zeros(2, 63, dtype=torch.float16, device=DEVICE))
    with pytest.raises(AssertionError, match="residual"):
        linear(x, w, out_dtype=torch.float32, residual=torch.zeros(2, 64, dtype=torch.float16, device=DEVICE))


# -- split-K, explicit tiles, strided activations -------------------------------------------------


SPLIT_CASES = [(T, od, sw) for T in (1, 2, 16) for od in ("model", "float32") for sw in (False, True)]


@pytest.mark.parametrize("T,out,swiglu", SPLIT_CASES,
                         ids=[f"T{t}-{o}-{'swiglu' if s else 'plain'}" for t, o, s in SPLIT_CASES])
def test_split_k_gemv(T, out, swiglu):
    """K = 136 in 32-wide chunks (5 chunks, the last one partial) over 3 splits of 2, 2, 1 chunks."""
    dtype = torch.float16
    out_dtype = dtype if out == "model" else torch.float32
    N, K = 96, 136
    cfg = GemvConfig(block_n=16, block_k=32, split_k=3, num_warps=4, num_stages=1)
    x, w = random_inputs(T, N, K, dtype, "split", out, swiglu)
    y = run(x, w, out_dtype, swiglu, config=cfg)
    expected = ref.linear(x, w, out_dtype)
    if swiglu:
        assert_close(y, ref_silu_mul(expected), "two_roundings")
        # the split partials are the plain kernel's: bit-identical even though I = 48 is not a
        # multiple of block_n (the reduce kernel applies the epilogue, element by element)
        assert_equal(y, silu_mul(run(x, w, out_dtype, config=cfg)))
    else:
        assert_close(y, expected)


@pytest.mark.parametrize("T", [1, 2, 16])
def test_fused_split_reduce_is_the_reduce_kernel_bit_for_bit(T):
    """Split-K with the partials added by the last split's program (fused_reduce): the bits of the
    reduce kernel, with the norm prologue, the residual and a float32 output, over N tails (N = 88
    in 16-column blocks) and a partial last K chunk; the counters are left at 0 for the next launch."""
    from tileinfer.backends.triton.linear_split_counters import split_counters

    dtype = torch.float16
    N, K = 88, 136
    plain = GemvConfig(block_n=16, block_k=32, split_k=3, num_warps=4, num_stages=1)
    fused = GemvConfig(block_n=16, block_k=32, split_k=3, num_warps=4, num_stages=1, fused_reduce=True)
    x, w, nw, r = norm_residual_inputs(T, N, K, dtype, False, "fused-split")
    for kw in (dict(norm_weight=nw, eps=EPS, residual=r), dict(out_dtype=torch.float32), {}):
        out_dtype = kw.get("out_dtype", dtype)
        y = linear(x, w, config=fused, out=poisoned((T, N), out_dtype), **kw)
        assert_equal(y, linear(x, w, config=plain, out=poisoned((T, N), out_dtype), **kw))
        assert not split_counters(x.device, 6).any()
    assert_close(linear(x, w, config=fused), ref.linear(x, w, dtype))


@pytest.mark.parametrize("T", [1, 7, 40])
def test_gemv_and_gemm_with_explicit_tiles(T):
    """Tiles other than the rule's: several K chunks, unaligned K, M and N tails."""
    dtype = torch.float16
    N, K = 80, 100
    if T <= 16:
        cfg = GemvConfig(block_n=32, block_k=32, split_k=1, num_warps=4, num_stages=2)
    else:
        cfg = GemmConfig(block_m=32, block_n=32, block_k=32, group_m=2, num_warps=4, num_stages=2)
    x, w = random_inputs(T, N, K, dtype, "tiles")
    assert_close(run(x, w, dtype, config=cfg), ref.linear(x, w, dtype))


@pytest.mark.parametrize("T", [1, 7, 40])
def test_row_slice_activations(T):
    """x may be a column slice of a wider buffer (row stride > K); rows are read with x.stride(0)."""
    dtype = torch.float16
    N, K = 64, 96
    wide, w = random_inputs(T, N, K + 40, dtype, "strided")
    x = wide[:, 8 : 8 + K]
    w = w[:, :K].contiguous()
    assert x.stride(0) == K + 40
    assert_close(run(x, w, dtype), ref.linear(x, w, dtype))


def test_allocates_output_and_handles_empty_input():
    x, w = random_inputs(3, 64, 32, torch.float16, "allocates")
    y = linear(x, w)
    assert y.shape == (3, 64) and y.dtype == torch.float16 and y.is_contiguous()
    assert linear(x, w, swiglu=True, out_dtype=torch.float32).shape == (3, 32)
    assert linear(x[:0], w).shape == (0, 64)


def test_rejects_bad_input():
    x, w = random_inputs(2, 64, 32, torch.float16, "bad")
    with pytest.raises(AssertionError):
        linear(x, w.t().contiguous().t())  # w not row-major
    with pytest.raises(AssertionError):
        linear(x.float(), w)  # dtype mismatch
    with pytest.raises(AssertionError):
        linear(x, w[:, :16].contiguous())  # K mismatch
    with pytest.raises(AssertionError):
        linear(x, w[:63].contiguous(), swiglu=True)  # odd row count
    with pytest.raises(AssertionError):
        linear(x, w, swiglu="swiglu")  # a flag, not an epilogue name
    with pytest.raises(AssertionError):
        linear(x, w, out_dtype=torch.bfloat16)  # neither the model dtype nor float32


# -- GPU: bfloat16 at the real shapes -------------------------------------------------------------


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


@pytest.mark.gpu
@pytest.mark.parametrize("out", ["bfloat16", "float32"])
@pytest.mark.parametrize("T", [1, 4, 7, 16, 17, 40, 1024])
@pytest.mark.parametrize("name", list(QWEN3_LINEARS))
def test_gpu_bf16_real_shapes_match_reference(name, T, out):
    N, K = QWEN3_LINEARS[name]
    out_dtype = getattr(torch, out)
    x, w = random_inputs(T, N, K, torch.bfloat16, "gpu", name, out)
    y = run(x, w, out_dtype)
    expected = ref.linear(x, w, out_dtype)
    # bf16 operands, float32 accumulation on both sides in different orders (K up to 9728); the
    # relative error below bounds the float32 logits tightly
    assert_close(y, expected, dtype=torch.bfloat16)
    assert rel_err(y, expected) < (4e-3 if out_dtype == torch.bfloat16 else 1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("out", ["bfloat16", "float32"])
@pytest.mark.parametrize("T", [1, 4, 16, 64, 1024])
@pytest.mark.parametrize("name", list(QWEN3_LINEARS))
def test_gpu_swiglu_epilogue_bit_identical(name, T, out):
    """Every real shape as if it were a [gate; up] weight: covers the GEMV with and without
    split-K and every GEMM tile the rule picks."""
    N, K = QWEN3_LINEARS[name]
    out_dtype = getattr(torch, out)
    x, w = random_inputs(T, N, K, torch.bfloat16, "gpu-identity", name, out)
    fused = run(x, w, out_dtype, swiglu=True)
    assert_equal(fused, silu_mul(run(x, w, out_dtype)))
    if name.endswith("gate_up"):
        expected = ref_silu_mul(ref.linear(x, w, out_dtype))
        assert_close(fused, expected, "two_roundings", dtype=torch.bfloat16)


# How the decoder uses each weight: (RMSNorm before it, SwiGLU, residual added after it)
DECODER_USE = {"qkv": (True, False, False), "o_proj": (False, False, True), "gate_up": (True, True, False),
               "down": (False, False, True), "lm_head": (True, False, False)}


@pytest.mark.gpu
@pytest.mark.parametrize("pdl", [False, True], ids=["plain", "pdl"])
@pytest.mark.parametrize("T", [1, 2, 4, 16, 17, 1024])
@pytest.mark.parametrize("name", list(QWEN3_LINEARS))
def test_gpu_norm_and_residual_fused_bit_identical(name, T, pdl):
    """The decoder's use of each real shape (norm prologue, SwiGLU, residual epilogue, float32
    logits), fused against the per-op chain: equal bit for bit; and close to the torch twin."""
    N, K = QWEN3_LINEARS[name]
    has_norm, swiglu, has_residual = DECODER_USE[name.rsplit(".", 1)[1]]
    out_dtype = torch.float32 if name.endswith("lm_head") else torch.bfloat16
    x, w, nw, r = norm_residual_inputs(T, N, K, torch.bfloat16, swiglu, "gpu", name)
    args = dict(swiglu=swiglu, out_dtype=out_dtype, pdl=pdl)
    args |= dict(norm_weight=nw, eps=EPS) if has_norm else {}
    args |= dict(residual=r) if has_residual else {}
    n = N // 2 if swiglu else N
    fused = linear(x, w, out=poisoned((T, n), out_dtype), **args)
    assert_equal(fused, linear_per_op(x, w, **args))
    expected = reference_chain(x, w, nw if has_norm else None, r if has_residual else None, swiglu, out_dtype)
    assert rel_err(fused, expected) < (8e-3 if out_dtype == torch.bfloat16 else 4e-3)


@pytest.mark.gpu
@pytest.mark.parametrize("swiglu", [False, True], ids=["plain", "swiglu"])
@pytest.mark.parametrize("T", [1, 4, 16])
@pytest.mark.parametrize("name", list(QWEN3_LINEARS))
def test_gpu_pdl_launch_bit_identical(name, T, swiglu):
    """Programmatic dependent launch (weights prefetched before the grid dependency wait) gives
    the plain launch's bits, also in a CUDA graph right after a kernel that writes x."""
    N, K = QWEN3_LINEARS[name]
    x, w = random_inputs(T, N, K, torch.bfloat16, "gpu-pdl", name, swiglu)
    plain = run(x, w, torch.bfloat16, swiglu)
    assert torch.equal(run(x, w, torch.bfloat16, swiglu, pdl=True), plain)
    source = x.clone()
    x.zero_()
    n = N // 2 if swiglu else N
    out = poisoned((T, n), torch.bfloat16)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        x.copy_(source)  # the kernel before writes the activations the GEMV reads
        linear(x, w, swiglu=swiglu, out=out, pdl=True)
    x.zero_()
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, plain)


@pytest.mark.gpu
@pytest.mark.parametrize("late", [False, True], ids=["early", "late_launch"])
@pytest.mark.parametrize("T", [1, 16])
@pytest.mark.parametrize("name", ["4B.gate_up", "4B.o_proj", "0.6B.down"])
def test_gpu_pdl_chain_reads_the_previous_gemv_output(name, T, late):
    """Two dependent GEMVs, both launched with PDL (the second may start while the first runs;
    ``late``: once the first finished its K loop, ``late_launch``): the second must read the
    first's finished output, replayed from a graph many times."""
    N, K = QWEN3_LINEARS[name]
    x, w = random_inputs(T, N, K, torch.bfloat16, "gpu-pdl-chain", name)
    _, w2 = random_inputs(T, K, N, torch.bfloat16, "gpu-pdl-chain-2", name)
    expected = run(run(x, w, torch.bfloat16), w2, torch.bfloat16)
    mid = torch.empty((T, N), dtype=torch.bfloat16, device=DEVICE)
    out = torch.empty((T, K), dtype=torch.bfloat16, device=DEVICE)
    first, second = (dataclasses.replace(gemv_config(n, k, T), late_launch=late) for n, k in ((N, K), (K, N)))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        linear(x, w, out=mid, pdl=True, config=first)
        linear(mid, w2, out=out, pdl=True, config=second)
    for _ in range(20):
        mid.fill_(float("nan"))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, expected)
