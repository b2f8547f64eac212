"""The quantizing writes of the INT8 KV cache: the fused attention inputs
(backends/triton/attention_inputs.py with ``k_scale``, ``v_scale``, ``k_smooth``) and the per-op
``write_kv_int8`` (backends/triton/kv_write.py), bit for bit against the reference quantizer
(``write_quantized`` of backends/reference/kv_quant.py) on the same keys and values.

The keys the fused kernel quantizes are its own rotated keys: the same launch into pages in the
model dtype writes them (the dtype path is checked against the twin in test_attention_inputs.py),
and ``write_quantized`` of those gives the expected int8 pages and scales. Int8 slots start at -128
(never written by the quantizer) and scales as NaN, so a slot written that should not be, or left
unwritten, fails; q must be the bits of the dtype path.
"""

from __future__ import annotations

import pytest
import torch

from tileinfer.backends.reference.kv_quant import INV_127, key_smoothing, write_quantized
from tileinfer.backends.reference.paged_attention import gather_pages
from tileinfer.backends.triton.attention_inputs import attention_inputs, k_norm_rope_write
from tileinfer.backends.triton.kv_write import write_kv_int8

from ..kernel_checks import BF16, DEVICE, F16, F32, assert_same, generator, poisoned, randn, step_positions
from .test_attention_inputs import Case


def int8_pool(num_pages, kv_heads, page_size, head_dim):
    """Poisoned int8 pages and scales: ``(k_pages, v_pages, k_scale, v_scale)``."""
    shape = (num_pages, kv_heads, page_size, head_dim)
    pages = [torch.full(shape, -128, dtype=torch.int8, device=DEVICE) for _ in range(2)]
    return (*pages, poisoned(shape[:-1], F32), poisoned(shape[:-1], F32))


def assert_same_pool(actual, expected):
    for a, e in zip(actual, expected):
        assert_same(a, e) if a.is_floating_point() else torch.testing.assert_close(a, e, atol=0, rtol=0)


def fused_int8(case: Case, smooth: torch.Tensor | None, fn=attention_inputs):
    """The launch into int8 pages, and the expected pool from the dtype launch's own keys."""
    num_pages, kv_heads, page_size, d = case.page_shape
    got = int8_pool(num_pages, kv_heads, page_size, d)
    kw = dict(k_scale=got[2], v_scale=got[3], k_smooth=smooth)
    if fn is attention_inputs:
        q = attention_inputs(case.qkv, case.q_w, case.k_w, case.table.cos, case.table.sin, case.positions,
                             got[0], got[1], case.block_table, *case.args(), out=case.nan_q(), **kw)
        q_dtype, k_pages, v_pages = case.fused()
        assert torch.equal(q, q_dtype)  # q does not depend on the page format
    else:
        k_norm_rope_write(case.qkv, case.k_w, case.table.cos, case.table.sin, case.positions, got[0], got[1],
                          case.block_table, *case.args(), **kw)
        _, k_pages, v_pages = case.parts()
    length = num_pages * page_size
    k, v = gather_pages(k_pages, case.block_table, length), gather_pages(v_pages, case.block_table, length)
    expected = int8_pool(num_pages, kv_heads, page_size, d)
    write_quantized(*expected, case.block_table, case.positions, k[case.positions], v[case.positions], smooth)
    return got, expected


# (T, heads, kv_heads, head_dim, dtype): two launches (few heads) and one launch (masked kv columns)
CASES = [
    (1, 2, 2, 128, F16),
    (7, 4, 2, 64, F32),
    (16, 8, 2, 128, F16),
    (17, 4, 1, 64, F32),
    (3, 16, 8, 128, F16),   # one launch
    (5, 24, 12, 128, F32),  # one launch, 4 kv heads masked
    (2, 8, 2, 64, BF16),    # no dot: bfloat16 runs on the interpreter too
]


@pytest.mark.parametrize("smoothed", [True, False], ids=["smoothed", "plain"])
@pytest.mark.parametrize("t,heads,kv_heads,head_dim,dtype", CASES,
                         ids=[f"T{c[0]}-H{c[1]}-Hkv{c[2]}-D{c[3]}-{str(c[4])[6:]}" for c in CASES])
def test_attention_inputs_int8_is_the_reference_quantizer(t, heads, kv_heads, head_dim, dtype, smoothed):
    case = Case(t, heads, kv_heads, head_dim, dtype, page_size=8, num_pages=8,
                key=("attention_inputs_int8", t, heads, kv_heads, head_dim, dtype))
    g = generator("smooth", t, heads, head_dim)
    smooth = key_smoothing(torch.rand(head_dim, generator=g, device=DEVICE) * 3 + 0.1) if smoothed else None
    got, expected = fused_int8(case, smooth)
    assert_same_pool(got, expected)
    written = (got[0] != -128).any(-1)  # the slots of the step, every kv head
    assert int(written.sum()) == t * kv_heads


def test_k_norm_rope_write_int8_is_the_reference_quantizer():
    case = Case(6, 4, 2, 64, F16, page_size=8, num_pages=8, key=("k_norm_rope_write_int8",))
    smooth = key_smoothing(torch.rand(64, generator=generator("kw"), device=DEVICE) + 0.5)
    got, expected = fused_int8(case, smooth, k_norm_rope_write)
    assert_same_pool(got, expected)


@pytest.mark.parametrize("dtype", [F16, F32, BF16], ids=str)
@pytest.mark.parametrize("t,kv_heads,head_dim", [(1, 1, 64), (7, 2, 128), (33, 8, 64), (5, 3, 96)])
def test_write_kv_int8_is_the_reference_quantizer(t, kv_heads, head_dim, dtype):
    g = generator("write_kv_int8", t, kv_heads, head_dim, dtype)
    num_pages, page_size = 8, 16
    block_table = torch.randperm(num_pages, generator=g, device=DEVICE).to(torch.int32)
    positions = step_positions(t, num_pages * page_size, g)
    k = randn((t, kv_heads, head_dim), dtype, g, 3.0)
    v = randn((t, kv_heads, head_dim), dtype, g)
    smooth = key_smoothing(torch.rand(head_dim, generator=g, device=DEVICE) * 3 + 0.1)
    got, expected = int8_pool(num_pages, kv_heads, page_size, head_dim), int8_pool(num_pages, kv_heads, page_size,
                                                                                   head_dim)
    write_kv_int8(*got, block_table, positions, k, v, k_smooth=smooth)
    write_quantized(*expected, block_table, positions, k, v, smooth)
    assert_same_pool(got, expected)


def test_write_kv_int8_rounds_half_to_even_and_clamps():
    """Values at exactly half a step round to the even integer, as torch.round does, and a vector
    of zeros gets the floor scale (no division by zero)."""
    assert torch.tensor(127.0) * INV_127 == 1.0  # so the values below are the quotients themselves
    row = torch.tensor([127.0, 0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 126.5, -127.0, 3.4999, 0.0] + [0.0] * 5)
    v = torch.stack([row, torch.zeros(16)])[None].to(DEVICE)  # [1 token, 2 heads, 16]
    got = int8_pool(2, 2, 16, 16)
    write_kv_int8(*got, torch.tensor([1, 0], dtype=torch.int32, device=DEVICE), torch.tensor([3], device=DEVICE),
                  v, v)
    ints = got[1][1, 0, 3].tolist()
    assert ints[:11] == [127, 0, 2, 2, 0, -2, -2, 126, -127, 3, 0]
    assert got[3][1, 0, 3] == 1.0 and got[3][1, 1, 3] == torch.tensor(1e-12) * INV_127
    assert (got[1][1, 1, 3] == 0).all()


def test_int8_writes_reject_bad_layouts():
    case = Case(2, 4, 2, 64, F32, page_size=8, num_pages=8, key=("bad",))
    k_pages, v_pages, k_scale, v_scale = int8_pool(8, 2, 8, 64)
    args = (case.qkv, case.q_w, case.k_w, case.table.cos, case.table.sin, case.positions, k_pages, v_pages,
            case.block_table, *case.args())
    with pytest.raises(AssertionError, match="both k_scale and v_scale"):
        attention_inputs(*args, k_scale=k_scale)
    with pytest.raises(AssertionError, match="k_scale must be"):
        attention_inputs(*args, k_scale=k_scale[:, :1], v_scale=v_scale)
    with pytest.raises(AssertionError, match="int8 pages expected"):
        attention_inputs(*args[:6], k_pages.float(), v_pages.float(), *args[8:], k_scale=k_scale, v_scale=v_scale)
    with pytest.raises(AssertionError, match="k_smooth must be"):
        attention_inputs(*args, k_scale=k_scale, v_scale=v_scale, k_smooth=torch.ones(64, dtype=F16, device=DEVICE))


# -- GPU: bfloat16 at Qwen3-4B's shape: the division and rounding of the compiled kernel -------------


@pytest.mark.gpu
@pytest.mark.parametrize("t", [1, 16, 1024])
def test_gpu_attention_inputs_int8_bf16(t):
    case = Case(t, 32, 8, 128, BF16, page_size=64, num_pages=40, key=("gpu_int8", t))
    smooth = key_smoothing(torch.rand(128, generator=generator("gpu", t), device=DEVICE) * 3 + 0.1)
    got, expected = fused_int8(case, smooth)
    assert_same_pool(got, expected)


@pytest.mark.gpu
@pytest.mark.parametrize("t", [1, 16, 1024])
def test_gpu_write_kv_int8_bf16(t):
    g = generator("gpu_write_kv_int8", t)
    block_table = torch.randperm(40, generator=g, device=DEVICE).to(torch.int32)
    positions = step_positions(t, 40 * 64, g)
    k, v = randn((t, 8, 128), BF16, g, 3.0), randn((t, 8, 128), BF16, g)
    smooth = key_smoothing(torch.rand(128, generator=g, device=DEVICE) * 3 + 0.1)
    got, expected = int8_pool(40, 8, 64, 128), int8_pool(40, 8, 64, 128)
    write_kv_int8(*got, block_table, positions, k, v, k_smooth=smooth)
    write_quantized(*expected, block_table, positions, k, v, smooth)
    assert_same_pool(got, expected)
