"""linear_int8 (backends/triton/linear_int8.py: the W8A16 GEMV of linear_int8_gemv.py, the GEMM of
linear_int8_gemm.py) against its twin (backends/reference/linear_int8.py), and its fused forms
(SwiGLU, RMSNorm prologue, residual epilogue) against the chain of per-op kernels.

Weights are random int8 over the whole range [-128, 127] (a compressed-tensors checkpoint may hold
-128) with random per-row scales, so that a scale applied to the wrong row, or a conversion off by
one code, fails. Fresh inputs per case, outputs poisoned with NaN before the launch.
"""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from tileinfer.backends.reference.linear_int8 import linear_int8 as ref_linear_int8
from tileinfer.backends.triton.add import add
from tileinfer.backends.triton.linear_int8 import (
    Int8GemmConfig,
    Int8GemvConfig,
    gemm_int8_config,
    gemv_int8_config,
    linear_int8,
    norm_warps_int8,
)
from tileinfer.backends.triton.linear_int8_gemv import int8_to
from tileinfer.backends.triton.rms_norm import rms_norm
from tileinfer.backends.triton.silu_mul import silu_mul

from ..kernel_checks import DEVICE, EPS, INTERPRETER_DTYPES, QWEN3_LINEARS, assert_close, generator, poisoned

DTYPES = INTERPRETER_DTYPES + ([torch.bfloat16] if DEVICE == "cuda" else [])
TOKENS = [1, 2, 7, 16, 17, 40]  # GEMV T = 1 (CUDA cores), GEMV tl.dot (2..16), GEMM (17, 40)
ODD = (200, 136)  # N, K: no multiple of any block_n / block_k; I = 100 starts mid-tile
ALIGNED = (128, 96)


def random_int8(T: int, N: int, K: int, dtype: torch.dtype, *key):
    """x ~ N(0, 1); q uniform over [-128, 127]; scales in [0.5, 1.5) x 1/sqrt(K E[q^2]): y ~ N(0, 1)."""
    g = generator("int8", T, N, K, dtype, *key)
    x = torch.randn(T, K, generator=g, device=DEVICE).to(dtype)
    q = torch.randint(-128, 128, (N, K), generator=g, device=DEVICE, dtype=torch.int8)
    scale = (torch.rand(N, generator=g, device=DEVICE) + 0.5) / (K * 5461.5) ** 0.5
    return x, q, scale


def run(x, q, scale, out_dtype, swiglu=False, config=None, **kw) -> torch.Tensor:
    n = q.shape[0] // 2 if swiglu else q.shape[0]
    out = poisoned((x.shape[0], n), out_dtype)
    y = linear_int8(x, q, scale, out_dtype=out_dtype, swiglu=swiglu, out=out, config=config, **kw)
    assert y is out
    return y


def per_op(x, q, scale, *, out_dtype=None, swiglu=False, norm_weight=None, residual=None, config=None):
    """One Triton kernel per op: rms_norm (with the GEMV prologue's warps), linear_int8, silu_mul, add."""
    if norm_weight is not None:
        x = rms_norm(x, norm_weight, EPS, num_warps=norm_warps_int8(x.shape[0], q.shape[0], q.shape[1], config))
    y = linear_int8(x, q, scale, out_dtype=out_dtype, config=config)
    y = silu_mul(y) if swiglu else y
    return y if residual is None else add(y, residual)


def assert_equal(a: torch.Tensor, b: torch.Tensor) -> None:
    assert torch.equal(a, b), f"max diff {(a.float() - b.float()).abs().max().item()}"


CASES = [(T, dt, od) for T in TOKENS for dt in DTYPES for od in ([dt] if dt == torch.float32 else [dt, torch.float32])]
CASE_IDS = [f"T{T}-{str(dt)[6:]}-out_{str(od)[6:]}" for T, dt, od in CASES]


@pytest.mark.parametrize("T,dtype,out_dtype", CASES, ids=CASE_IDS)
def test_matches_reference(T, dtype, out_dtype):
    N, K = ODD
    x, q, scale = random_int8(T, N, K, dtype, "plain", out_dtype)
    assert_close(run(x, q, scale, out_dtype), ref_linear_int8(x, q, scale, out_dtype))


@pytest.mark.parametrize("T,dtype,out_dtype", CASES, ids=CASE_IDS)
def test_swiglu_epilogue_matches_reference(T, dtype, out_dtype):
    N, K = ODD
    x, q, scale = random_int8(T, N, K, dtype, "swiglu", out_dtype)
    expected = ref_linear_int8(x, q, scale, out_dtype, swiglu=True)
    assert_close(run(x, q, scale, out_dtype, swiglu=True), expected, "two_roundings")


@pytest.mark.parametrize("T", [1, 2, 16, 17])
@pytest.mark.parametrize("dtype", INTERPRETER_DTYPES, ids=str)
def test_swiglu_epilogue_bit_identical_to_per_op(T, dtype):
    N, K = ALIGNED
    x, q, scale = random_int8(T, N, K, dtype, "identity")
    assert_equal(run(x, q, scale, dtype, swiglu=True), silu_mul(run(x, q, scale, dtype)))


NORM_CASES = [(T, parts, sw) for T in (1, 2, 16, 17) for parts in ("norm", "both") for sw in (False, True)]


@pytest.mark.parametrize("T,parts,swiglu", NORM_CASES,
                         ids=[f"T{t}-{p}-{'swiglu' if s else 'plain'}" for t, p, s in NORM_CASES])
def test_norm_prologue_and_residual_epilogue(T, parts, swiglu):
    """Fused == the per-op chain bit for bit (float16), and both close to the twin's chain."""
    dtype = torch.float16
    N, K = ALIGNED
    x, q, scale = random_int8(T, N, K, dtype, "norm", parts, swiglu)
    g = generator("norm-extra", T, parts, swiglu)
    x = (x.float() * torch.rand(T, 1, generator=g, device=DEVICE) * 30).to(dtype)  # the norm must undo a scale
    nw = (torch.rand(K, generator=g, device=DEVICE) + 0.5).to(dtype)
    n = N // 2 if swiglu else N
    r = (torch.randn(T, n, generator=g, device=DEVICE) * 4).to(dtype) if parts == "both" else None
    fused = linear_int8(x, q, scale, swiglu=swiglu, norm_weight=nw, eps=EPS, residual=r, out=poisoned((T, n), dtype))
    assert_equal(fused, per_op(x, q, scale, swiglu=swiglu, norm_weight=nw, residual=r))
    expected = ref_linear_int8(x, q, scale, swiglu=swiglu, norm_weight=nw, eps=EPS, residual=r)
    assert_close(fused, expected, "norm_residual_matmul")


@pytest.mark.parametrize("T", [1, 2, 16])
@pytest.mark.parametrize("swiglu", [False, True], ids=["plain", "swiglu"])
def test_split_k(T, swiglu):
    """K = 136 in 32-wide chunks over 3 splits (the last chunk partial): scaled partials, the
    epilogues in the reduce, float32 logits and the residual too."""
    dtype = torch.float16
    N, K = 96, 136
    cfg = Int8GemvConfig(block_n=16, block_k=32, split_k=3, num_warps=4, num_stages=1)
    x, q, scale = random_int8(T, N, K, dtype, "split", swiglu)
    y = run(x, q, scale, dtype, swiglu, config=cfg)
    assert_close(y, ref_linear_int8(x, q, scale, dtype, swiglu=swiglu), "two_roundings" if swiglu else "one_rounding")
    if swiglu:
        assert_equal(y, silu_mul(run(x, q, scale, dtype, config=cfg)))
    logits = run(x, q, scale, torch.float32, swiglu, config=cfg)
    assert_close(logits, ref_linear_int8(x, q, scale, torch.float32, swiglu=swiglu), dtype=dtype)
    r = torch.randn(T, N // 2 if swiglu else N, generator=generator("split-r", T), device=DEVICE).to(dtype)
    fused = run(x, q, scale, dtype, swiglu, config=cfg, residual=r)
    assert_equal(fused, per_op(x, q, scale, swiglu=swiglu, residual=r, config=cfg))


@pytest.mark.parametrize("T", [1, 7, 40])
def test_explicit_tiles_and_the_plain_conversion(T):
    """Other tiles than the rule's (several K chunks, unaligned K, M and N tails); the conversion
    on the bit patterns and Triton's cast give the same bits."""
    dtype = torch.float16
    N, K = 80, 100
    x, q, scale = random_int8(T, N, K, dtype, "tiles")
    if T <= 16:
        bits, cast = (Int8GemvConfig(32, 32, 1, 4, 2, bit_convert=b) for b in (True, False))
    else:
        bits, cast = (Int8GemmConfig(32, 32, 32, 2, 4, 2, bit_convert=b) for b in (True, False))
    y = run(x, q, scale, dtype, config=bits)
    assert_close(y, ref_linear_int8(x, q, scale, dtype))
    assert_equal(y, run(x, q, scale, dtype, config=cast))


@pytest.mark.parametrize("T", [1, 16])
def test_fused_split_reduce_is_the_reduce_kernel_bit_for_bit(T):
    """Split-K with the partials added by the last split's program: the reduce kernel's bits, with
    the residual, over an N tail and a partial last K chunk."""
    dtype = torch.float16
    N, K = ODD
    x, q, scale = random_int8(T, N, K, dtype, "fused-split")
    r = torch.randn(T, N, generator=generator("fused-split-r", T), device=DEVICE).to(dtype)
    plain, fused = (Int8GemvConfig(32, 32, 3, 4, 1, fused_reduce=f) for f in (False, True))
    y = run(x, q, scale, dtype, config=fused, residual=r)
    assert_equal(y, run(x, q, scale, dtype, config=plain, residual=r))
    assert_close(run(x, q, scale, dtype, config=fused), ref_linear_int8(x, q, scale, dtype))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_swapped_gemm_tiles(dtype):
    """The GEMM computed transposed (``swap_ab``: q x^T) against the twin on odd shapes; its fused
    SwiGLU and residual forms equal the chain of per-op kernels on the same tiles."""
    T, (N, K) = 40, ODD
    swapped = Int8GemmConfig(32, 64, 32, 2, 4, 2, swap_ab=True)
    x, q, scale = random_int8(T, N, K, dtype, "swap")
    assert_close(run(x, q, scale, dtype, config=swapped), ref_linear_int8(x, q, scale, dtype))
    fused = run(x, q, scale, dtype, swiglu=True, config=swapped)
    assert_equal(fused, per_op(x, q, scale, out_dtype=dtype, swiglu=True, config=swapped))
    r = torch.randn(T, N, generator=generator("swap-r", dtype), device=DEVICE).to(dtype)
    y = run(x, q, scale, dtype, config=swapped, residual=r)
    assert_equal(y, per_op(x, q, scale, out_dtype=dtype, residual=r, config=swapped))


@pytest.mark.parametrize("T", [1, 7, 40])
def test_row_slice_activations(T):
    dtype = torch.float16
    N, K = 64, 96
    wide, q, scale = random_int8(T, N, K + 40, dtype, "strided")
    x, q = wide[:, 8:8 + K], q[:, :K].contiguous()
    assert x.stride(0) == K + 40
    assert_close(run(x, q, scale, dtype), ref_linear_int8(x, q, scale, dtype))


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


def test_rules():
    """The tiles of gemv_int8_config's rule at Qwen3-4B's layers; split-K only for few-row layers."""
    assert gemv_int8_config(151936, 2560, 1) == Int8GemvConfig(8, 512, 1, 2, 1)
    assert gemv_int8_config(2560, 9728, 1) == Int8GemvConfig(4, 2048, 1, 4, 1)
    assert gemv_int8_config(6144, 2560, 1) == Int8GemvConfig(4, 512, 1, 2, 1)
    assert gemv_int8_config(6144, 2560, 4).block_k == 128
    assert gemv_int8_config(151936, 2560, 16).block_n == 64
    assert gemv_int8_config(1024, 3072, 16).split_k > 1
    assert gemv_int8_config(64, 40, 1).block_k == 64
    assert gemm_int8_config(1024, 19456, 2560).block_m == 128
    assert gemm_int8_config(40, 100, 20).block_k == 32


def test_allocates_output_and_handles_empty_input():
    x, q, scale = random_int8(3, 64, 32, torch.float16, "alloc")
    y = linear_int8(x, q, scale)
    assert y.shape == (3, 64) and y.dtype == torch.float16 and y.is_contiguous()
    assert linear_int8(x, q, scale, swiglu=True, out_dtype=torch.float32).shape == (3, 32)
    assert linear_int8(x[:0], q, scale).shape == (0, 64)


def test_rejects_bad_input():
    x, q, scale = random_int8(2, 64, 32, torch.float16, "bad")
    with pytest.raises(AssertionError, match="int8"):
        linear_int8(x, q.to(torch.int16), scale)
    with pytest.raises(AssertionError, match="scale"):
        linear_int8(x, q, scale[:63].contiguous())
    with pytest.raises(AssertionError, match="scale"):
        linear_int8(x, q, scale.half())
    with pytest.raises(AssertionError):
        linear_int8(x, q.t().contiguous().t(), scale)  # not row-major
    with pytest.raises(AssertionError):
        linear_int8(x, q[:, :16].contiguous(), scale)  # K mismatch
    with pytest.raises(AssertionError):
        linear_int8(x, q[:63].contiguous(), scale[:63].contiguous(), swiglu=True)  # odd rows
    with pytest.raises(AssertionError):
        linear_int8(x, q, scale, out_dtype=torch.bfloat16)


# -- GPU: bfloat16 at the real shapes -------------------------------------------------------------


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


@pytest.mark.gpu
@pytest.mark.parametrize("out", ["bfloat16", "float32"])
@pytest.mark.parametrize("T", [1, 4, 16, 17, 1024])
@pytest.mark.parametrize("name", list(QWEN3_LINEARS))
def test_gpu_bf16_real_shapes_match_reference(name, T, out):
    N, K = QWEN3_LINEARS[name]
    out_dtype = getattr(torch, out)
    x, q, scale = random_int8(T, N, K, torch.bfloat16, "gpu", name, out)
    y = run(x, q, scale, out_dtype)
    expected = ref_linear_int8(x, q, scale, out_dtype)
    assert_close(y, expected, dtype=torch.bfloat16)
    assert rel_err(y, expected) < (4e-3 if out_dtype == torch.bfloat16 else 1e-5)


DECODER_USE = {"qkv": (True, False, False), "o_proj": (False, False, True), "gate_up": (True, True, False),
               "down": (False, False, True), "lm_head": (True, False, False)}


@pytest.mark.gpu
@pytest.mark.parametrize("T", [1, 2, 16, 17, 1024])
@pytest.mark.parametrize("name", list(QWEN3_LINEARS))
def test_gpu_decoder_use_fused_bit_identical(name, T):
    """Each real shape as the decoder uses it (norm prologue, SwiGLU, residual, float32 logits),
    fused against the per-op chain (equal bits) and close to the twin; PDL and Triton's plain
    int8 cast give the same bits."""
    N, K = QWEN3_LINEARS[name]
    has_norm, swiglu, has_residual = DECODER_USE[name.rsplit(".", 1)[1]]
    out_dtype = torch.float32 if name.endswith("lm_head") else torch.bfloat16
    x, q, scale = random_int8(T, N, K, torch.bfloat16, "gpu-use", name)
    g = generator("gpu-use-extra", name, T)
    nw = (torch.rand(K, generator=g, device=DEVICE) + 0.5).to(torch.bfloat16) if has_norm else None
    n = N // 2 if swiglu else N
    r = torch.randn(T, n, generator=g, device=DEVICE).to(torch.bfloat16) if has_residual else None
    args = dict(out_dtype=out_dtype, swiglu=swiglu, norm_weight=nw, residual=r)
    fused = linear_int8(x, q, scale, eps=EPS, out=poisoned((T, n), out_dtype), **args)
    assert_equal(fused, per_op(x, q, scale, **args))
    assert_equal(linear_int8(x, q, scale, eps=EPS, pdl=True, **args), fused)
    cfg = gemv_int8_config(N, K, T) if T <= 16 else gemm_int8_config(T, N, K)
    cast = type(cfg)(**{**cfg.__dict__, "bit_convert": False})
    assert_equal(linear_int8(x, q, scale, eps=EPS, config=cast, **args), fused)
    expected = ref_linear_int8(x, q, scale, eps=EPS, **args)
    assert rel_err(fused, expected) < (8e-3 if out_dtype == torch.bfloat16 else 4e-3)


@pytest.mark.gpu
@pytest.mark.parametrize("T", [1, 16])
@pytest.mark.parametrize("name", ["4B.gate_up", "4B.o_proj", "0.6B.down"])
def test_gpu_cuda_graph_with_pdl(name, T):
    """Replayed from a CUDA graph right after a kernel that writes x, with PDL: the eager bits."""
    N, K = QWEN3_LINEARS[name]
    x, q, scale = random_int8(T, N, K, torch.bfloat16, "gpu-graph", name)
    plain = run(x, q, scale, torch.bfloat16)
    source, out = x.clone(), poisoned((T, N), torch.bfloat16)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        x.copy_(source)
        linear_int8(x, q, scale, out=out, pdl=True)
    x.zero_()
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, plain)
