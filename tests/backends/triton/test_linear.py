"""linear (backends/triton/linear.py) for both weight formats, model dtype and int8 with row scales,
against its twin (backends/reference/linear.py), and its fused forms (SwiGLU and residual
epilogues) against the chain of per-op kernels (per_op_chains.linear_per_op) under the bit-identity
policy of kernel_checks.py: ``torch.equal`` on ALIGNED shapes (I = 64, a multiple of every
BLOCK_N), the policy's tolerance where the SwiGLU up half starts mid-tile (ODD). Split-K, the tile
rules and the persistent GEMM are tested in test_linear_gemv.py, test_linear_tiles.py and
test_linear_gemm_persistent.py.

Int8 weights are random over the whole range [-128, 127] (a compressed-tensors checkpoint may hold
-128) with random per-row scales, so that a scale applied to the wrong row, or a conversion off by
one code, fails. Fresh inputs per case, outputs poisoned with NaN before the launch.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import triton
import triton.language as tl

from tileinfer.backends.reference.linear import linear as ref_linear
from tileinfer.backends.reference.rms_norm import rms_norm as ref_rms_norm
from tileinfer.backends.triton.device_functions import int8_to
from tileinfer.backends.triton.linear import GemmConfig, GemvConfig, gemv_config, linear, rule_config

from ..kernel_checks import (DEVICE, EPS, INTERPRETER_DTYPES, QWEN3_LINEARS, assert_close, assert_fused, generator,
                             poisoned)
from .per_op_chains import linear_fused, linear_per_op

DTYPES = INTERPRETER_DTYPES + ([torch.bfloat16] if DEVICE == "cuda" else [])
FORMATS = ["none", "int8"]
# int8 -> float conversions (linear_tiles.INT8_CONVERTS), the rule's first; byte permutes are inline PTX (a GPU)
CONVERTS = ["bits", "cast"] + (["permute"] if DEVICE == "cuda" else [])
# GEMV T=1 (CUDA cores); GEMV tl.dot (T = 2..16 in one 16-row tile: 2 masked, 16 full); GEMM (17: one masked
# block of the rule's 64-row tile at these shapes, as every T up to 64)
TOKENS = [1, 2, 16, 17]
# (N, K): N not a multiple of any block_n and K not a multiple of any block_k (I = 100 starts
# mid-tile); and an aligned shape (I = 64) for the bit-identity tests.
ODD = (200, 136)
ALIGNED = (128, 96)


def weights(fmt: str, T: int, N: int, K: int, dtype: torch.dtype, *key):
    """``(x, w, scale)``: x ~ N(0, 1); w ~ N(0, 1/K) in x's dtype (scale None), or int8 uniform over
    [-128, 127] with scales in [0.5, 1.5) x 1/sqrt(K E[q^2]): y ~ N(0, 1) either way."""
    g = generator(fmt, T, N, K, dtype, *key)
    x = torch.randn(T, K, generator=g, device=DEVICE).to(dtype)
    if fmt == "none":
        return x, (torch.randn(N, K, generator=g, device=DEVICE) / K**0.5).to(dtype), None
    q = torch.randint(-128, 128, (N, K), generator=g, device=DEVICE, dtype=torch.int8)
    return x, q, (torch.rand(N, generator=g, device=DEVICE) + 0.5) / (K * 5461.5) ** 0.5


def run(x, w, scale, out_dtype=None, swiglu=False, config=None, **kw) -> torch.Tensor:
    n = w.shape[0] // 2 if swiglu else w.shape[0]
    out = poisoned((x.shape[0], n), out_dtype or x.dtype)
    y = linear(x, w, scale, out_dtype=out_dtype, swiglu=swiglu, out=out, config=config, **kw)
    assert y is out
    return y


def out_dtypes(dtype):
    return [dtype] if dtype == torch.float32 else [dtype, torch.float32]


CASES = [(T, dtype, od) for T in TOKENS for dtype in DTYPES for od in out_dtypes(dtype)]
CASE_IDS = [f"T{T}-{str(dt)[6:]}-out_{str(od)[6:]}" for T, dt, od in CASES]


# -- against the twin ---------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("T,dtype,out_dtype", CASES, ids=CASE_IDS)
def test_linear_matches_reference(T, dtype, out_dtype, fmt):
    x, w, scale = weights(fmt, T, *ODD, dtype, "plain", out_dtype)
    assert_close(run(x, w, scale, out_dtype), ref_linear(x, w, scale, out_dtype=out_dtype))


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("T,dtype,out_dtype", CASES, ids=CASE_IDS)
def test_swiglu_epilogue_matches_reference(T, dtype, out_dtype, fmt):
    x, w, scale = weights(fmt, T, *ODD, dtype, "swiglu", out_dtype)
    expected = ref_linear(x, w, scale, out_dtype=out_dtype, swiglu=True)
    assert_close(run(x, w, scale, out_dtype, swiglu=True), expected, "two_roundings")


# -- fused epilogues against the per-op chain --------------------------------------------------------


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("T,dtype,out_dtype", CASES, ids=CASE_IDS)
def test_swiglu_epilogue_bit_identical_to_per_op(T, dtype, out_dtype, fmt):
    x, w, scale = weights(fmt, T, *ALIGNED, dtype, "identity", out_dtype)
    fused = run(x, w, scale, out_dtype, swiglu=True)
    assert_fused(fused, linear_per_op(x, w, scale, out_dtype=out_dtype, swiglu=True))


RESIDUAL_CASES = [(T, sw) for T in (1, 2, 16, 17) for sw in (False, True)]


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dtype", INTERPRETER_DTYPES, ids=str)
@pytest.mark.parametrize("T,swiglu", RESIDUAL_CASES, ids=[f"T{t}-{'swiglu' if s else 'plain'}" for t, s in RESIDUAL_CASES])
def test_residual_epilogue_bit_identical_to_per_op(T, swiglu, dtype, fmt):
    """Fused == the per-op chain bit for bit, and both match the twins' chain."""
    N, K = ALIGNED
    x, w, scale = weights(fmt, T, N, K, dtype, "residual", swiglu)
    n = N // 2 if swiglu else N
    r = (torch.randn(T, n, generator=generator("residual-r", T, swiglu), device=DEVICE) * 4).to(dtype)
    fused = run(x, w, scale, swiglu=swiglu, residual=r)
    assert_fused(fused, linear_per_op(x, w, scale, swiglu=swiglu, residual=r))
    assert_close(fused, ref_linear(x, w, scale, swiglu=swiglu, residual=r), "two_roundings")


@pytest.mark.parametrize("fmt", FORMATS)
def test_residual_may_be_the_output(fmt):
    x, w, scale = weights(fmt, 2, 64, 96, torch.float16, "in-place")
    r = torch.randn(2, 64, generator=generator("in-place-r"), device=DEVICE).to(torch.float16)
    expected = linear(x, w, scale, residual=r)
    y = linear(x, w, scale, residual=r, out=r)
    assert y is r and torch.equal(y, expected)


# -- explicit tiles, the int8 conversion, strided activations ---------------------------------------


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("T", [1, 7, 40])
def test_gemv_and_gemm_with_explicit_tiles(T, fmt):
    """Tiles other than the rule's (several K chunks, unaligned K, M and N tails); for int8 the
    conversion on the bit patterns and Triton's cast give the same bits."""
    dtype = torch.float16
    N, K = 80, 100
    x, w, scale = weights(fmt, T, N, K, dtype, "tiles")
    if T <= 16:
        bits, *others = (GemvConfig(32, 32, 1, 4, 2, int8_convert=c) for c in CONVERTS)
    else:
        bits, *others = (GemmConfig(32, 32, 32, 2, 4, 2, int8_convert=c) for c in CONVERTS)
    y = run(x, w, scale, config=bits)
    assert_close(y, ref_linear(x, w, scale))
    for other in others:
        assert torch.equal(y, run(x, w, scale, config=other))


@pytest.mark.skipif(DEVICE == "cuda", reason="the interpreter's refusal")
def test_byte_permutes_are_refused_under_the_interpreter():
    x, w, scale = weights("int8", 1, 32, 64, torch.float16, "permute")
    with pytest.raises(AssertionError, match="inline PTX: it runs on a GPU"):
        run(x, w, scale, config=GemvConfig(32, 32, 1, 4, 2, int8_convert="permute"))


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("T", [1, 7, 40])
def test_row_slice_activations(T, fmt):
    """x may be a column slice of a wider buffer (row stride > K); rows are read with x.stride(0)."""
    N, K = 64, 96
    wide, w, scale = weights(fmt, T, N, K + 40, torch.float16, "strided")
    x, w = wide[:, 8:8 + K], w[:, :K].contiguous()
    assert x.stride(0) == K + 40
    assert_close(run(x, w, scale), ref_linear(x, w, scale))


@triton.jit
def _convert_kernel(q_ptr, out_ptr, DTYPE: tl.constexpr, BITS: tl.constexpr):
    offs = tl.arange(0, 256)
    tl.store(out_ptr + offs, int8_to(tl.load(q_ptr + offs), DTYPE, BITS).to(tl.float32))


@pytest.mark.parametrize("bits", [True, False], ids=["bits", "cast"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
def test_int8_to_is_exact_for_every_code(dtype, bits):
    if DEVICE == "cpu" and dtype == torch.bfloat16 and not bits:
        pytest.skip("the interpreter casts int8 to bfloat16 wrongly (the kernels never ask it to: DOT_F32)")
    q = torch.arange(-128, 128, dtype=torch.int8, device=DEVICE)
    out = poisoned((256,), torch.float32)
    tl_dtype = {torch.float16: tl.float16, torch.bfloat16: tl.bfloat16, torch.float32: tl.float32}[dtype]
    _convert_kernel[(1,)](q, out, DTYPE=tl_dtype, BITS=bits)
    assert torch.equal(out, q.float())


# -- shapes and bad arguments -------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", FORMATS)
def test_allocates_output_and_handles_empty_input(fmt):
    x, w, scale = weights(fmt, 3, 64, 32, torch.float16, "allocates")
    y = linear(x, w, scale)
    assert y.shape == (3, 64) and y.dtype == torch.float16 and y.is_contiguous()
    assert linear(x, w, scale, swiglu=True, out_dtype=torch.float32).shape == (3, 32)
    assert linear(x[:0], w, scale).shape == (0, 64)


@pytest.mark.parametrize("fmt", FORMATS)
def test_rejects_bad_input(fmt):
    x, w, scale = weights(fmt, 2, 64, 32, torch.float16, "bad")
    half = None if scale is None else scale[:32].contiguous()
    with pytest.raises(AssertionError):
        linear(x, w.t().contiguous().t(), scale)  # w not row-major
    with pytest.raises(AssertionError):
        linear(x.float() if scale is None else x.to(torch.int8), w, scale)  # dtype mismatch / not a float
    with pytest.raises(AssertionError):
        linear(x, w[:, :16].contiguous(), scale)  # K mismatch
    with pytest.raises(AssertionError):
        linear(x, w[:63].contiguous(), None if scale is None else scale[:63].contiguous(), swiglu=True)  # odd rows
    with pytest.raises(AssertionError):
        linear(x, w, scale, swiglu="swiglu")  # a flag, not an epilogue name
    with pytest.raises(AssertionError):
        linear(x, w, scale, out_dtype=torch.bfloat16)  # neither the model dtype nor float32
    with pytest.raises(AssertionError, match="residual"):
        linear(x, w, scale, residual=torch.zeros(2, 63, dtype=torch.float16, device=DEVICE))
    with pytest.raises(AssertionError, match="residual"):
        linear(x, w, scale, out_dtype=torch.float32, residual=torch.zeros(2, 64, dtype=torch.float16, device=DEVICE))
    if scale is None:
        with pytest.raises(AssertionError, match="int8 weights come with their scale"):
            linear(x, w.to(torch.int8))
        return
    with pytest.raises(AssertionError, match="int8"):
        linear(x, w.to(torch.int16), scale)
    with pytest.raises(AssertionError, match="scale"):
        linear(x, w, half)
    with pytest.raises(AssertionError, match="scale"):
        linear(x, w, scale.half())


# -- GPU: bfloat16 at the real shapes -------------------------------------------------------------


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("out", ["bfloat16", "float32"])
@pytest.mark.parametrize("T", [1, 4, 7, 16, 17, 40, 1024])
@pytest.mark.parametrize("name", list(QWEN3_LINEARS))
def test_gpu_real_shapes_match_reference(name, T, out, fmt):
    out_dtype = getattr(torch, out)
    x, w, scale = weights(fmt, T, *QWEN3_LINEARS[name], torch.bfloat16, "gpu", name, out)
    y = run(x, w, scale, out_dtype)
    expected = ref_linear(x, w, scale, out_dtype=out_dtype)
    # bf16 operands, float32 accumulation on both sides in different orders (K up to 9728); the
    # relative error below bounds the float32 logits tightly
    assert_close(y, expected, dtype=torch.bfloat16)
    assert rel_err(y, expected) < (4e-3 if out_dtype == torch.bfloat16 else 1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("out", ["bfloat16", "float32"])
@pytest.mark.parametrize("T", [1, 4, 16, 64, 1024])
@pytest.mark.parametrize("name", list(QWEN3_LINEARS))
def test_gpu_swiglu_epilogue_bit_identical(name, T, out, fmt):
    """Every real shape as if it were a [gate; up] weight: covers the GEMV with and without split-K
    and every GEMM tile the rule picks (the lm_head's I = 75,968 starts the up half mid-tile)."""
    out_dtype = getattr(torch, out)
    x, w, scale = weights(fmt, T, *QWEN3_LINEARS[name], torch.bfloat16, "gpu-identity", name, out)
    fused = run(x, w, scale, out_dtype, swiglu=True)
    assert_fused(fused, linear_per_op(x, w, scale, out_dtype=out_dtype, swiglu=True))
    if name.endswith("gate_up"):
        expected = ref_linear(x, w, scale, out_dtype=out_dtype, swiglu=True)
        assert_close(fused, expected, "two_roundings", dtype=torch.bfloat16)


# How the decoder uses each weight: (RMSNorm before it, SwiGLU, residual added after it)
DECODER_USE = {"qkv": (True, False, False), "o_proj": (False, False, True), "gate_up": (True, True, False),
               "down": (False, False, True), "lm_head": (True, False, False)}


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("T", [1, 2, 4, 16, 17, 1024])
@pytest.mark.parametrize("name", list(QWEN3_LINEARS))
def test_gpu_decoder_use_bit_identical(name, T, fmt):
    """The decoder's use of each real shape (the norm kernel, SwiGLU, residual epilogue, float32
    logits), fused against the per-op chain: equal bit for bit, with PDL too and with Triton's
    plain int8 cast; and close to the twins' chain."""
    N, K = QWEN3_LINEARS[name]
    has_norm, swiglu, has_residual = DECODER_USE[name.rsplit(".", 1)[1]]
    out_dtype = torch.float32 if name.endswith("lm_head") else torch.bfloat16
    x, w, scale = weights(fmt, T, N, K, torch.bfloat16, "gpu-use", name)
    g = generator("gpu-use-extra", name, T)
    nw = (torch.rand(K, generator=g, device=DEVICE) + 0.5).to(torch.bfloat16) if has_norm else None
    n = N // 2 if swiglu else N
    r = torch.randn(T, n, generator=g, device=DEVICE).to(torch.bfloat16) if has_residual else None
    args = dict(out_dtype=out_dtype, swiglu=swiglu, residual=r, norm_weight=nw, eps=EPS)
    fused = linear_fused(x, w, scale, out=poisoned((T, n), out_dtype), **args)
    assert_fused(fused, linear_per_op(x, w, scale, **args))
    assert torch.equal(linear_fused(x, w, scale, pdl=True, **args), fused)
    if scale is not None:
        cfg = rule_config(x, w, scale, swiglu=swiglu, out_dtype=out_dtype)
        for convert in CONVERTS[1:]:
            other = dataclasses.replace(cfg, int8_convert=convert)
            assert torch.equal(linear_fused(x, w, scale, config=other, **args), fused)
    xn = x if nw is None else ref_rms_norm(x, nw, EPS)
    expected = ref_linear(xn, w, scale, out_dtype=out_dtype, swiglu=swiglu, residual=r)
    assert rel_err(fused, expected) < (8e-3 if out_dtype == torch.bfloat16 else 4e-3)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("swiglu", [False, True], ids=["plain", "swiglu"])
@pytest.mark.parametrize("T", [1, 4, 16])
@pytest.mark.parametrize("name", list(QWEN3_LINEARS))
def test_gpu_pdl_launch_bit_identical(name, T, swiglu, fmt):
    """Programmatic dependent launch (weights prefetched before the grid dependency wait) gives
    the plain launch's bits, also in a CUDA graph right after a kernel that writes x."""
    N, K = QWEN3_LINEARS[name]
    x, w, scale = weights(fmt, T, N, K, torch.bfloat16, "gpu-pdl", name, swiglu)
    plain = run(x, w, scale, swiglu=swiglu)
    assert torch.equal(run(x, w, scale, swiglu=swiglu, pdl=True), plain)
    source = x.clone()
    x.zero_()
    out = poisoned(plain.shape, torch.bfloat16)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        x.copy_(source)  # the kernel before writes the activations the GEMV reads
        linear(x, w, scale, swiglu=swiglu, out=out, pdl=True)
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
    x, w, _ = weights("none", T, N, K, torch.bfloat16, "gpu-pdl-chain", name)
    _, w2, _ = weights("none", T, K, N, torch.bfloat16, "gpu-pdl-chain-2", name)
    expected = run(run(x, w, None), w2, None)
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
