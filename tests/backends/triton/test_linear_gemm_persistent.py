"""The persistent GEMM (backends/triton/linear_gemm_persistent.py), reached through ``linear`` with a
``persistent`` tile config for both weight formats: against the twin (backends/reference/linear.py)
on odd shapes with fresh random inputs and NaN-poisoned outputs, and its fused forms (SwiGLU,
residual, float32 logits) against the per-op chain on the same config, bit for bit (ALIGNED:
kernel_checks.py's policy); every option (TMA descriptors, several tiles per program, a flattened
tile loop, split tails with their last-arriver sums on the caller's counters) and the split rule
(``split_plan``, ``balance`` of linear_tiles.py).

Under the interpreter (float16 / float32 data) the TMA descriptors run too: the same kernel code
loads through them wherever the tensors are 16-byte aligned (tma_ok), else through pointers.
"""

from __future__ import annotations

import pytest
import torch

from tileinfer.backends.reference.linear import linear as ref_linear
from tileinfer.backends.triton import linear_gemm_persistent as persistent
from tileinfer.backends.triton.add import add
from tileinfer.backends.triton.linear import GemmConfig, linear
from tileinfer.backends.triton.linear_gemm_persistent import split_tiles, tma_ok
from tileinfer.backends.triton.linear_tiles import balance, split_plan
from tileinfer.backends.triton.silu_mul import silu_mul

from ..kernel_checks import DEVICE, INTERPRETER_DTYPES, QWEN3_LINEARS, assert_close, generator, poisoned, randn

T = 40  # two row blocks of 32: the second one partial
ODD = (72, 136)  # N, K: no multiple of block_n / block_k (K rows of 272 bytes: TMA-aligned in float16)
ALIGNED = (64, 96)  # I = 32, a multiple of block_n: the fused tiles are the plain ones
# name: the persistent options on 32 x 32 x 32 tiles (2 warps... 4 warps, 2 stages)
OPTIONS = {
    "pointers": {},
    "tma": dict(tma=True),
    "3-programs": dict(programs=3),  # several tiles a program, in swizzled order
    "flatten": dict(tma=True, flatten=True, programs=3),
    "split": dict(programs=5, split_rows=1, split_k=3),  # the partial row block in 3 ranges of K
    "split-all-tma": dict(tma=True, programs=4, split_rows=2, split_k=2),  # every tile split
}


def bf16_config(name: str, **extra) -> GemmConfig:
    return GemmConfig(32, 32, 32, 2, 4, 2, persistent=True, **OPTIONS[name], **extra)


def int8_config(name: str, swap_ab: bool) -> GemmConfig:
    return GemmConfig(32, 32, 32, 2, 4, 2, swap_ab=swap_ab, persistent=True, **OPTIONS[name])


# (option, swap_ab): every option both ways, but the split tail only untransposed (GemmConfig)
INT8_OPTIONS = [(name, swap) for name in OPTIONS for swap in (False, True) if not (swap and "split" in name)]
INT8_OPTION_IDS = [f"{name}-{'swap_ab' if swap else 'plain'}" for name, swap in INT8_OPTIONS]


def test_config_refuses_a_transposed_split_tail():
    with pytest.raises(AssertionError, match="swap_ab and split_rows exclude each other"):
        int8_config("split", True)


def inputs(N: int, K: int, dtype: torch.dtype, *key, t: int = T):
    g = generator("persistent", t, N, K, dtype, *key)
    x = torch.randn(t, K, generator=g, device=DEVICE).to(dtype)
    w = (torch.randn(N, K, generator=g, device=DEVICE) / K**0.5).to(dtype)
    q = torch.randint(-128, 128, (N, K), generator=g, device=DEVICE, dtype=torch.int8)
    scale = (torch.rand(N, generator=g, device=DEVICE) + 0.5) / (K * 5461.5) ** 0.5
    return x, w, q, scale


def run(fn, x, *weights, n: int, out_dtype=None, **kw) -> torch.Tensor:
    out = poisoned((x.shape[0], n), out_dtype or x.dtype)
    y = fn(x, *weights, out_dtype=out_dtype, out=out, **kw)
    assert y is out
    return y


def assert_equal(a: torch.Tensor, b: torch.Tensor) -> None:
    assert torch.equal(a, b), f"max diff {(a.float() - b.float()).abs().max().item()}"


# -- against the twins -----------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", INTERPRETER_DTYPES, ids=str)
@pytest.mark.parametrize("name", list(OPTIONS))
def test_matches_reference(name, dtype):
    N, K = ODD
    x, w, _, _ = inputs(N, K, dtype, "plain", name)
    cfg = bf16_config(name)
    assert_close(run(linear, x, w, n=N, config=cfg), ref_linear(x, w))
    y = run(linear, x, w, n=N // 2, config=cfg, swiglu=True)  # I = 36: up rows start mid-tile
    assert_close(y, ref_linear(x, w, swiglu=True), "two_roundings")


@pytest.mark.parametrize("name,swap_ab", INT8_OPTIONS, ids=INT8_OPTION_IDS)
def test_int8_matches_reference(name, swap_ab):
    dtype = torch.float16
    N, K = ODD  # int8 rows of 136 bytes: no TMA, the pointer path
    x, _, q, scale = inputs(N, K, dtype, "int8", name, swap_ab)
    cfg = int8_config(name, swap_ab)
    assert_close(run(linear, x, q, scale, n=N, config=cfg), ref_linear(x, q, scale))
    y = run(linear, x, q, scale, n=N // 2, config=cfg, swiglu=True)
    assert_close(y, ref_linear(x, q, scale, swiglu=True), "two_roundings")


@pytest.mark.parametrize("name", ["tma", "split-all-tma"])
def test_int8_weights_through_tma(name):
    """K = 96: int8 rows of 96 bytes, so the int8 tiles arrive through a TMA descriptor too."""
    N, K = ALIGNED
    x, _, q, scale = inputs(N, K, torch.float16, "int8-tma", name)
    assert tma_ok(x, q)
    cfg = int8_config(name, "split" not in name)  # the split tail only untransposed
    assert_close(run(linear, x, q, scale, n=N, config=cfg), ref_linear(x, q, scale))
    logits = run(linear, x, q, scale, n=N, config=cfg, out_dtype=torch.float32)
    assert_close(logits, ref_linear(x, q, scale, out_dtype=torch.float32), dtype=torch.float16)


# -- fused forms against the per-op chain -----------------------------------------------------------


@pytest.mark.parametrize("name", list(OPTIONS))
def test_fused_forms_bit_identical_to_per_op(name):
    """SwiGLU, residual and float32 logits against the plain kernel (same config) followed by
    silu_mul / add: equal bits; the split tails included (the split rows are the config's, the
    same for the fused call on I columns and the plain call on 2I)."""
    dtype = torch.float16
    N, K = ALIGNED
    x, w, _, _ = inputs(N, K, dtype, "fused", name)
    cfg = bf16_config(name)
    plain = run(linear, x, w, n=N, config=cfg)
    assert_equal(run(linear, x, w, n=N // 2, config=cfg, swiglu=True), silu_mul(plain))
    r = torch.randn(T, N, generator=generator("fused-r", name), device=DEVICE).to(dtype) * 4
    assert_equal(run(linear, x, w, n=N, config=cfg, residual=r), add(plain, r))
    logits = run(linear, x, w, n=N, config=cfg, out_dtype=torch.float32)
    assert_close(logits, ref_linear(x, w, out_dtype=torch.float32), dtype=dtype)


@pytest.mark.parametrize("name,swap_ab", INT8_OPTIONS[:2] + [c for c in INT8_OPTIONS if "split" in c[0]],
                         ids=INT8_OPTION_IDS[:2] + [i for i in INT8_OPTION_IDS if "split" in i])
def test_int8_fused_forms_bit_identical_to_per_op(name, swap_ab):
    dtype = torch.float16
    N, K = ALIGNED
    x, _, q, scale = inputs(N, K, dtype, "int8-fused", name, swap_ab)
    cfg = int8_config(name, swap_ab)
    plain = run(linear, x, q, scale, n=N, config=cfg)
    assert_equal(run(linear, x, q, scale, n=N // 2, config=cfg, swiglu=True), silu_mul(plain))
    r = torch.randn(T, N, generator=generator("int8-fused-r", name), device=DEVICE).to(dtype)
    assert_equal(run(linear, x, q, scale, n=N, config=cfg, residual=r), add(plain, r))


@pytest.mark.parametrize("dtype", INTERPRETER_DTYPES, ids=str)
def test_same_bits_as_the_tiled_kernel(dtype):
    """Whole tiles run the non-persistent kernel's tile code: the same bits on the same tiles,
    through pointers or TMA, with any number of programs."""
    N, K = ODD
    x, w, _, _ = inputs(N, K, dtype, "same-bits")
    tiled = run(linear, x, w, n=N, config=GemmConfig(32, 32, 32, 2, 4, 2))
    for name in ("pointers", "tma", "3-programs", "flatten"):
        assert_equal(run(linear, x, w, n=N, config=bf16_config(name)), tiled)


def test_tma_descriptors_are_used_where_aligned(monkeypatch):
    made = []

    class Spy(persistent.TensorDescriptor):
        def __init__(self, *args, **kwargs):
            made.append(args[0].dtype)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(persistent, "TensorDescriptor", Spy)
    x, w, q, scale = inputs(*ODD, torch.float16, "spy")
    y = linear(x, w, config=bf16_config("tma"))
    assert made == [torch.float16, torch.float16]
    made.clear()
    linear(x, q, scale, config=int8_config("tma", True))  # int8 rows of 136 bytes: pointers
    assert made == []
    assert_equal(linear(x, w, config=bf16_config("pointers")), y)
    assert not tma_ok(x[:, 1:]) and tma_ok(x) and not tma_ok(q)


def test_row_slice_activations_and_an_m_tail():
    """x a column slice of a wider buffer (row stride K + 40, TMA-aligned); 70 rows (the last
    block of 6); K = 100 (rows of 200 bytes: pointers, with a masked last K chunk)."""
    dtype = torch.float16
    N, K = 96, 96
    wide, w, _, _ = inputs(N, K + 40, dtype, "strided", t=70)
    x, w = wide[:, 8:8 + K], w[:, :K].contiguous()
    assert tma_ok(x, w)
    for name in ("tma", "split-all-tma"):
        assert_close(run(linear, x, w, n=N, config=bf16_config(name)), ref_linear(x, w))
    x2, w2, _, _ = inputs(80, 100, dtype, "odd-k", t=70)
    assert not tma_ok(x2)
    assert_close(run(linear, x2, w2, n=80, config=bf16_config("split")), ref_linear(x2, w2))


def test_split_runs_are_reproducible_and_leave_the_counters_at_zero():
    """The split tiles' sums go in split order whoever arrives last: the same bits every run; the
    last unit of each tile resets its counter, so that one counters tensor serves every launch."""
    x, w, _, _ = inputs(*ALIGNED, torch.float16, "repeat")
    cfg = bf16_config("split-all-tma")
    first = run(linear, x, w, n=ALIGNED[0], config=cfg)
    counters = torch.zeros(split_tiles(T, ALIGNED[0], cfg), dtype=torch.int32, device=DEVICE)
    assert counters.numel() == 4  # 2 row blocks x 2 column blocks
    for swiglu in (False, True, False):
        y = run(linear, x, w, n=ALIGNED[0] // (2 if swiglu else 1), config=cfg, swiglu=swiglu, counters=counters)
        assert not counters.any()
    assert_equal(y, first)
    with pytest.raises(AssertionError, match="the split tail needs 4 int32 counters"):
        linear(x, w, config=cfg, counters=counters[:3])


def test_config_options_need_persistent():
    with pytest.raises(AssertionError, match="tma need persistent"):
        GemmConfig(32, 32, 32, 2, 4, 2, tma=True)
    with pytest.raises(AssertionError, match="split_rows"):
        GemmConfig(32, 32, 32, 2, 4, 2, split_rows=1)
    with pytest.raises(AssertionError, match="flatten and split_rows"):
        GemmConfig(32, 32, 32, 2, 4, 2, persistent=True, flatten=True, split_rows=1)


# -- the split rule ---------------------------------------------------------------------------------


def simulate(dp_tiles: int, dp_cost: int, units: int, unit_cost: int, programs: int) -> list[int]:
    """Each program's chunks as the kernel assigns work: whole tiles round-robin, then its unit
    range (``balance``'s n_lo / n_hi); asserts that every unit is taken exactly once."""
    n_lo, n_hi, _ = balance(dp_tiles, dp_cost, units, unit_cost, programs)
    r = dp_tiles % programs
    taken, loads = [], []
    for p in range(programs):
        mine = len(range(p, dp_tiles, programs))
        lo = p * n_lo if p < r else r * n_lo + (p - r) * n_hi
        hi = min(lo + (n_lo if p < r else n_hi), units)
        taken += list(range(lo, hi))
        loads.append(mine * dp_cost + max(0, hi - lo) * unit_cost)
    assert sorted(taken) == list(range(units))
    return loads


@pytest.mark.parametrize("case", [(120, 64, 160, 16, 132), (0, 64, 128, 16, 132), (140, 32, 60, 16, 132),
                                  (7, 10, 30, 3, 4), (8, 10, 5, 5, 4), (3, 6, 0, 2, 5), (0, 4, 7, 2, 3)])
def test_balance_takes_every_unit_once(case):
    loads = simulate(*case)
    assert max(loads) == balance(*case)[2]


def test_balance_fills_the_tail_of_qwen3_4b_o_proj():
    """160 tiles of 64 chunks on 132 SMs: 120 whole tiles and 40 tiles in quarters end at 1.25
    tiles a program (whole tiles alone: 2)."""
    assert balance(120, 64, 160, 16, 132)[2] == 80
    assert balance(160, 64, 0, 16, 132)[2] == 128


@pytest.mark.parametrize("name", list(QWEN3_LINEARS))
def test_split_plan_at_the_qwen3_shapes(name):
    """T = 1,024 on 128 x 128 x 64 tiles: the short layers (N = hidden: o_proj, down) split their
    last row blocks; the others fill their waves and do not."""
    N, K = QWEN3_LINEARS[name]
    rows, splits = split_plan(1024, N, K, 128, 128, 64, 132)
    if N <= 2560:
        assert rows > 0 and splits > 1 and -(-K // 64) // splits >= 2
    else:
        assert (rows, splits) == (0, 1)
    assert split_plan(1024, 2560, 4096, 128, 128, 64, 132) == (2, 4)


@pytest.mark.parametrize("fmt", ["bf16", "int8"])
def test_sweep_candidates_at_t_1024(fmt):
    """The benchmark's prefill sweep: at most 20 candidates a layer, persistent ones with and
    without TMA and a flattened loop, split tails where the plan splits (N = hidden)."""
    from bench.kernels import linear as module

    for N, K in QWEN3_LINEARS.values():
        configs = list(module.sweep_configs(N, K, 1024, 132, fmt))
        persistent = [c for c in configs if c.persistent]
        assert len(configs) <= 20 and len(set(configs)) == len(configs)
        assert {c.tma for c in persistent} == {False, True} and any(c.flatten for c in persistent)
        if N <= 2560:
            assert any(c.split_rows for c in persistent)
        for c in persistent:  # each split candidate is the plan for its tile
            plan = split_plan(1024, N, K, c.block_m, c.block_n, c.block_k, 132)
            assert (c.split_rows, c.split_k) in [(0, 1), plan]


# -- GPU: bfloat16 at the real shapes ---------------------------------------------------------------

GPU_OPTIONS = {  # the sweep's kinds of candidate (PERSISTENT_TILES of bench/kernels/linear.py)
    "tma": dict(tma=True), "pointers": {}, "tma-flatten": dict(tma=True, flatten=True), "split": dict(tma=True),
}
DECODER_USE = {"qkv": (False, False), "o_proj": (False, True), "gate_up": (True, False), "down": (False, True),
               "lm_head": (False, False)}


def gpu_config(cls, name: str, M: int, N: int, K: int, **extra):
    options = dict(GPU_OPTIONS[name])
    if name == "split":
        rows, splits = split_plan(M, N, K, 128, 128, 64, torch.cuda.get_device_properties(0).multi_processor_count)
        options |= dict(split_rows=rows, split_k=splits) if rows else dict(split_rows=2, split_k=2)
    return cls(128, 128, 64, 8, 8, 3, persistent=True, **options, **extra)


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


@pytest.mark.gpu
@pytest.mark.parametrize("T", [17, 1024])
@pytest.mark.parametrize("option", list(GPU_OPTIONS))
@pytest.mark.parametrize("name", list(QWEN3_LINEARS))
def test_gpu_bf16_decoder_use(name, option, T):
    """Each real shape as the decoder uses it (SwiGLU, residual, float32 logits), fused == per-op
    bit for bit and close to the twin; the TMA and pointer paths give the same bits."""
    N, K = QWEN3_LINEARS[name]
    swiglu, has_residual = DECODER_USE[name.rsplit(".", 1)[1]]
    out_dtype = torch.float32 if name.endswith("lm_head") else torch.bfloat16
    x, w, _, _ = inputs(N, K, torch.bfloat16, "gpu", name, option, t=T)
    cfg = gpu_config(GemmConfig, option, T, N, K)
    n = N // 2 if swiglu else N
    r = randn((T, n), torch.bfloat16, generator("gpu-r", name)) if has_residual else None
    fused = run(linear, x, w, n=n, out_dtype=out_dtype, swiglu=swiglu, residual=r, config=cfg)
    plain = linear(x, w, out_dtype=out_dtype, config=cfg)
    chain = silu_mul(plain) if swiglu else plain
    assert_equal(fused, chain if r is None else add(chain, r))
    assert rel_err(plain, ref_linear(x, w, out_dtype=out_dtype)) < (4e-3 if out_dtype == torch.bfloat16 else 1e-5)
    if option == "tma":
        assert_equal(linear(x, w, out_dtype=out_dtype, config=gpu_config(GemmConfig, "pointers", T, N, K)), plain)


# transposed (the int8 rule's form) except the split tail, which GemmConfig allows only untransposed
INT8_CASES = [(option, option != "split") for option in GPU_OPTIONS] + [("tma", False)]
INT8_IDS = [f"{option}-{'swap_ab' if swap else 'plain'}" for option, swap in INT8_CASES]


@pytest.mark.gpu
@pytest.mark.parametrize("T", [17, 1024])
@pytest.mark.parametrize("option,swap_ab", INT8_CASES, ids=INT8_IDS)
@pytest.mark.parametrize("name", list(QWEN3_LINEARS))
def test_gpu_int8_decoder_use(name, option, swap_ab, T):
    N, K = QWEN3_LINEARS[name]
    swiglu, has_residual = DECODER_USE[name.rsplit(".", 1)[1]]
    out_dtype = torch.float32 if name.endswith("lm_head") else torch.bfloat16
    x, _, q, scale = inputs(N, K, torch.bfloat16, "gpu-int8", name, option, t=T)
    cfg = gpu_config(GemmConfig, option, T, N, K, swap_ab=swap_ab)
    n = N // 2 if swiglu else N
    r = randn((T, n), torch.bfloat16, generator("gpu-r8", name)) if has_residual else None
    fused = run(linear, x, q, scale, n=n, out_dtype=out_dtype, swiglu=swiglu, residual=r, config=cfg)
    plain = linear(x, q, scale, out_dtype=out_dtype, config=cfg)
    chain = silu_mul(plain) if swiglu else plain
    assert_equal(fused, chain if r is None else add(chain, r))
    assert rel_err(plain, ref_linear(x, q, scale, out_dtype=out_dtype)) < (4e-3 if out_dtype == torch.bfloat16 else 1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("T", [17, 50, 128, 256, 1024, 4096])
@pytest.mark.parametrize("name", list(QWEN3_LINEARS))
def test_gpu_int8_rule_tiles_in_decoder_use(name, T):
    """The W8A16 rule's own tiles (the persistent BLOCK_K 128 ones where it takes them): the call
    without a config runs them; fused == per-op (the plain call given the fused call's rule tile,
    as a per-op chain does) bit for bit and close to the twin."""
    from tileinfer.backends.triton.linear import rule_config

    N, K = QWEN3_LINEARS[name]
    swiglu, has_residual = DECODER_USE[name.rsplit(".", 1)[1]]
    out_dtype = torch.float32 if name.endswith("lm_head") else torch.bfloat16
    x, _, q, scale = inputs(N, K, torch.bfloat16, "gpu-int8-rule", name, t=T)
    cfg = rule_config(x, q, scale, swiglu=swiglu, out_dtype=out_dtype)
    n = N // 2 if swiglu else N
    r = randn((T, n), torch.bfloat16, generator("gpu-r8-rule", name)) if has_residual else None
    fused = run(linear, x, q, scale, n=n, out_dtype=out_dtype, swiglu=swiglu, residual=r)
    assert_equal(run(linear, x, q, scale, n=n, out_dtype=out_dtype, swiglu=swiglu, residual=r, config=cfg), fused)
    plain = linear(x, q, scale, out_dtype=out_dtype, config=cfg)
    chain = silu_mul(plain) if swiglu else plain
    assert_equal(fused, chain if r is None else add(chain, r))
    bound = 4e-3 if out_dtype == torch.bfloat16 else 1e-5
    assert rel_err(plain, ref_linear(x, q, scale, out_dtype=out_dtype)) < bound


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["4B.o_proj", "4B.down", "0.6B.down"])
def test_gpu_split_tail_is_deterministic_and_graphable(name):
    """The split plan's tiles summed by whichever unit arrives last: the same bits over many runs,
    eager and replayed from a CUDA graph (TMA descriptors and the counters' memset captured)."""
    N, K = QWEN3_LINEARS[name]
    x, w, _, _ = inputs(N, K, torch.bfloat16, "gpu-split", name, t=1024)
    cfg = gpu_config(GemmConfig, "split", 1024, N, K)
    assert cfg.split_rows > 0
    r = torch.randn(1024, N, generator=generator("gpu-split-r", name), device=DEVICE).to(torch.bfloat16)
    first = linear(x, w, residual=r, config=cfg)
    out = poisoned((1024, N), torch.bfloat16)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        linear(x, w, residual=r, config=cfg, out=out)
    for _ in range(20):
        assert_equal(linear(x, w, residual=r, config=cfg), first)
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert_equal(out, first)
