"""The ``fragments`` layout of int8 weights (backends/triton/linear_layout.py; defined by the twin's
``pack_fragments``): every kernel that reads int8 weights (the tiled and the persistent GEMM, with
pointers and with TMA descriptors, the GEMV at T = 1 and T = 2..16, split K) gives on the packed
weight what it gives on the rows.

- Every byte code in every position: a weight whose columns hold every code, times one-hot
  activations, is the weight itself exactly (one nonzero product a sum), through each kernel.
- GEMMs: bit for bit the rows' result (the tile is put back in column order before the same dot).
- GEMV: the same exact products summed in another order in float32, so within the bound of any two
  orders: ``|y_frag - y_rows| <= scale * 2 gamma_K sum_k |x_k q_k| + u (|y_frag| + |y_rows|)`` for
  float32 outputs (gamma_K = K u / (1 - K u), u = 2^-24: the error of a float32 sum of K terms in any
  order, FMA or not, against the exact sum, on each side; then one rounding of the scaled result);
  the fused epilogues bit-identical to the chain on the same layout, and the twin's values.
Odd token counts and row counts, K multiples of 64 (the layout has whole groups), outputs poisoned.
"""

from __future__ import annotations

import pytest
import torch

from tileinfer.backends.reference.linear import linear as ref_linear
from tileinfer.backends.reference.linear import pack_fragments, unpack_fragments
from tileinfer.backends.triton.add import add
from tileinfer.backends.triton.linear import GemmConfig, GemvConfig, linear, rule_config
from tileinfer.backends.triton.silu_mul import silu_mul

from ..kernel_checks import DEVICE, assert_close, generator, poisoned

DTYPES = [torch.float16, torch.float32] + ([torch.bfloat16] if DEVICE == "cuda" else [])
GEMMS = {
    "tiled": GemmConfig(32, 32, 64, 8, 4, 2, swap_ab=True),
    "tiled-k128": GemmConfig(32, 64, 128, 8, 4, 2, swap_ab=True),
    "tiled-not-swapped": GemmConfig(32, 32, 64, 8, 4, 2),
    "persistent": GemmConfig(32, 32, 64, 8, 4, 2, swap_ab=True, persistent=True, programs=3),
    "persistent-tma": GemmConfig(32, 32, 64, 8, 4, 2, swap_ab=True, persistent=True, tma=True, programs=3),
}
GEMVS = {
    "rule": None,
    "split-k": GemvConfig(16, 64, 3, 4, 1),
    "split-k-fused": GemvConfig(16, 64, 3, 4, 1, fused_reduce=True),
    "k128": GemvConfig(32, 128, 1, 4, 2),
}
U = 2.0**-24


def weights(T: int, N: int, K: int, dtype: torch.dtype, *key):
    g = generator("layout", T, N, K, dtype, *key)
    x = torch.randn(T, K, generator=g, device=DEVICE).to(dtype)
    q = torch.randint(-128, 128, (N, K), generator=g, device=DEVICE, dtype=torch.int8)
    return x, q, (torch.rand(N, generator=g, device=DEVICE) + 0.5) / (K * 5461.5) ** 0.5


def run(x, w, scale, **kw) -> torch.Tensor:
    n = w.shape[0] // 2 if kw.get("swiglu") else w.shape[0]
    out = poisoned((x.shape[0], n), kw.pop("out_dtype", None) or x.dtype)
    y = linear(x, w, scale, out=out, out_dtype=out.dtype, **kw)
    assert y is out and not y.isnan().any()
    return y


# -- the layout -----------------------------------------------------------------------------------


def test_pack_puts_each_thread_s_fragment_bytes_together():
    q = torch.arange(128, dtype=torch.int32).reshape(1, 128) % 128
    p = pack_fragments(q)[0].tolist()
    for pos in range(128):
        g, t, s, h, lo = pos // 64, pos % 64 // 16, pos % 16 // 4, pos % 4 // 2, pos % 2
        assert p[pos] == 64 * g + 16 * s + 8 * h + 2 * t + lo
    x = torch.randint(-128, 128, (7, 192), dtype=torch.int8)
    assert torch.equal(unpack_fragments(pack_fragments(x)), x) and not torch.equal(pack_fragments(x), x)
    with pytest.raises(AssertionError, match="multiple of 64"):
        pack_fragments(x[:, :96])


def test_twin_unpacks():
    x, q, scale = weights(5, 33, 128, torch.float32, "twin")
    assert torch.equal(ref_linear(x, pack_fragments(q), scale, int8_layout="fragments"), ref_linear(x, q, scale))


# -- every byte code in every position, exactly -------------------------------------------------------


def every_code(K: int = 128) -> torch.Tensor:
    """int8 ``[256, K]``: row r, column c holds code ``(r + 7 c) mod 256`` (each column every code)."""
    r, c = torch.arange(256)[:, None], torch.arange(K)[None, :]
    return ((r + 7 * c) % 256 - 128).to(torch.int8).to(DEVICE)


EXACT_CASES = ([("rule", t) for t in (1, 5, 16, 40)] + [(c, 40) for c in GEMMS]
               + [(c, t) for c in GEMVS if c != "rule" for t in (1, 16)])


@pytest.mark.parametrize("config,tokens", EXACT_CASES, ids=[f"{c}-T{t}" for c, t in EXACT_CASES])
def test_every_code_in_every_position_is_exact(config, tokens):
    cfg = (GEMMS if tokens > 16 else GEMVS).get(config)
    K = 128
    q = every_code(K)
    cols = torch.arange(tokens, device=DEVICE) * 3 % K  # token t: one-hot on column cols[t]
    x = torch.zeros(tokens, K, dtype=torch.float16, device=DEVICE)
    x[torch.arange(tokens), cols] = 1.0
    scale = torch.ones(256, dtype=torch.float32, device=DEVICE)
    y = run(x, pack_fragments(q), scale, out_dtype=torch.float32, config=cfg, int8_layout="fragments")
    assert torch.equal(y, q.float().t()[cols])


# -- the GEMMs: the rows' bits ---------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("config", GEMMS)
@pytest.mark.parametrize("epilogue", ["plain", "swiglu", "residual", "logits"])
def test_gemm_gives_the_rows_bits(epilogue, config, dtype):
    T, N, K = 37, 66, 192
    x, q, scale = weights(T, N, K, dtype, "gemm", epilogue, config)
    kw = dict(config=GEMMS[config])
    if epilogue == "swiglu":
        kw["swiglu"] = True
    elif epilogue == "residual":
        kw["residual"] = torch.randn(T, N, generator=generator("r", T), device=DEVICE).to(dtype)
    elif epilogue == "logits":
        kw["out_dtype"] = torch.float32
    rows = run(x, q, scale, **dict(kw))
    assert torch.equal(run(x, pack_fragments(q), scale, int8_layout="fragments", **kw), rows)


def test_the_rule_s_gemm_gives_the_rows_bits():
    x, q, scale = weights(45, 97, 320, torch.float16, "rule-gemm")
    assert torch.equal(run(x, pack_fragments(q), scale, int8_layout="fragments"), run(x, q, scale))


# -- the GEMV: the same products in another order ----------------------------------------------------------


def order_bound(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, a: torch.Tensor, b: torch.Tensor):
    K = x.shape[1]
    gamma = K * U / (1 - K * U)
    magnitude = x.double().abs() @ q.double().abs().t()  # sum_k |x_k q_k|
    return scale.double() * 2 * gamma * magnitude + U * (a.double().abs() + b.double().abs())


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("tokens", [1, 3, 16])
@pytest.mark.parametrize("config", GEMVS)
def test_gemv_sums_the_same_products_within_the_order_bound(config, tokens, dtype):
    N, K = 97, 320
    x, q, scale = weights(tokens, N, K, dtype, "gemv", config)
    cfg = GEMVS[config]
    rows = run(x, q, scale, out_dtype=torch.float32, config=cfg)
    frag = run(x, pack_fragments(q), scale, out_dtype=torch.float32, config=cfg, int8_layout="fragments")
    assert ((frag.double() - rows.double()).abs() <= order_bound(x, q, scale, frag, rows)).all()
    assert_close(frag, ref_linear(x, q, scale, out_dtype=torch.float32), dtype=dtype)


@pytest.mark.parametrize("tokens", [1, 5, 16, 21])
@pytest.mark.parametrize("swiglu", [False, True], ids=["plain", "swiglu"])
def test_fused_epilogues_equal_the_chain_on_the_layout(swiglu, tokens):
    N, K = 128, 192
    x, q, scale = weights(tokens, N, K, torch.float16, "fused", swiglu)
    p, n = pack_fragments(q), N // 2 if swiglu else N
    r = torch.randn(tokens, n, generator=generator("fused-r", tokens), device=DEVICE).to(x.dtype)
    cfg = rule_config(x, p, scale, swiglu=swiglu)
    fused = run(x, p, scale, swiglu=swiglu, residual=r, config=cfg, int8_layout="fragments")
    y = run(x, p, scale, config=cfg, int8_layout="fragments")
    chain = add(silu_mul(y) if swiglu else y, r)
    assert torch.equal(fused, chain)
    twin = ref_linear(x, p, scale, swiglu=swiglu, residual=r, int8_layout="fragments")
    assert_close(fused, twin, "two_roundings")


# -- what the layout refuses ---------------------------------------------------------------------------------


def test_refuses_what_it_cannot_read():
    x, q, scale = weights(2, 32, 128, torch.float16, "refuse")
    p = pack_fragments(q)
    with pytest.raises(AssertionError, match="one of rows, fragments"):
        linear(x, p, scale, int8_layout="columns")
    with pytest.raises(AssertionError, match="int8 weights"):
        linear(x, q.half(), None, int8_layout="fragments")
    with pytest.raises(AssertionError, match="K a multiple of 64"):
        linear(x[:, :96].contiguous(), q[:, :96].contiguous(), scale, int8_layout="fragments")
    with pytest.raises(AssertionError, match="block_k a multiple of 64"):
        linear(x, p, scale, int8_layout="fragments", config=GemvConfig(16, 32, 1, 4, 1))

