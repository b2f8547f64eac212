"""Triton apply_rope (backends/triton/rope.py) and the paged KV write (backends/triton/kv_write.py)
against their reference twins (backends/reference/rope.py ``apply_rope``, kv_cache.py ``write_pages``).

RoPE runs the twin's float32 operations one by one (no fused multiply-add), so it must match the
twin exactly; the KV write copies bits. Outputs and pages are poisoned with NaN before each launch
so an unwritten element fails; block tables are random page permutations and positions cross pages.
"""

from __future__ import annotations

import zlib

import pytest
import torch

from tileinfer.backends.reference.kv_cache import write_pages as ref_write_pages
from tileinfer.backends.reference.rope import apply_rope as ref_apply_rope
from tileinfer.backends.triton.kv_write import write_kv, write_pages
from tileinfer.backends.triton.rope import apply_rope
from tileinfer.model import rope_table

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
THETA = 1_000_000.0  # Qwen3's rope_theta
CPU_DTYPES = [torch.float16, torch.float32]


def gen(*key) -> torch.Generator:
    """A generator seeded from the test case, so every case draws fresh inputs."""
    return torch.Generator(device=DEVICE).manual_seed(zlib.crc32(repr(key).encode()))


def randn(shape, dtype, g) -> torch.Tensor:
    return torch.randn(shape, generator=g, device=DEVICE).to(dtype)


def poisoned(shape, dtype) -> torch.Tensor:
    return torch.full(shape, float("nan"), dtype=dtype, device=DEVICE)


def run_positions(t: int, capacity: int, g: torch.Generator) -> torch.Tensor:
    """``t`` consecutive positions from a random start (a prefill or decode step)."""
    start = int(torch.randint(0, capacity - t + 1, (1,), generator=g, device=DEVICE))
    return torch.arange(start, start + t, device=DEVICE)


def assert_same(actual, expected):
    """Bit for bit, NaN where the expected is NaN (pages nobody writes stay poisoned)."""
    torch.testing.assert_close(actual, expected, atol=0, rtol=0, equal_nan=True)


# -- apply_rope -----------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", CPU_DTYPES, ids=str)
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("heads", [1, 2, 8, 20])
@pytest.mark.parametrize("t", [1, 2, 7, 16, 33])
def test_apply_rope(t, heads, head_dim, dtype):
    g = gen("rope", t, heads, head_dim, dtype)
    table = rope_table(head_dim, THETA, 512, torch.device(DEVICE))
    x = randn((t, heads, head_dim), dtype, g)
    positions = torch.randint(0, 512, (t,), generator=g, device=DEVICE)  # any order, repeats allowed
    out = apply_rope(x, table.cos, table.sin, positions, out=poisoned(x.shape, dtype))
    expected = ref_apply_rope(x, table.cos[positions], table.sin[positions])
    assert not out.isnan().any()
    assert_same(out, expected)


@pytest.mark.parametrize("dtype", CPU_DTYPES, ids=str)
def test_apply_rope_strided_and_in_place(dtype):
    """q heads as a view of the fused projection output; then the same rotation in place."""
    g = gen("rope_strided", dtype)
    t, heads, kv_heads, d = 6, 4, 2, 64
    qkv = randn((t, (heads + 2 * kv_heads) * d), dtype, g)
    table = rope_table(d, THETA, 64, torch.device(DEVICE))
    positions = run_positions(t, 64, g)
    q = qkv[:, : heads * d].view(t, heads, d)
    expected = ref_apply_rope(q, table.cos[positions], table.sin[positions])
    assert_same(apply_rope(q, table.cos, table.sin, positions), expected)
    before = qkv.clone()
    apply_rope(q, table.cos, table.sin, positions, out=q)
    assert_same(q, expected)
    assert torch.equal(qkv[:, heads * d:], before[:, heads * d:])  # k and v untouched


# -- write_kv / write_pages -----------------------------------------------------------------------


def pages_case(t, kv_heads, head_dim, page_size, num_pages, dtype, g):
    block_table = torch.randperm(num_pages, generator=g, device=DEVICE).to(torch.int32)
    positions = run_positions(t, num_pages * page_size, g)
    k_pages = poisoned((num_pages, kv_heads, page_size, head_dim), dtype)
    return block_table, positions, k_pages, k_pages.clone()


@pytest.mark.parametrize("dtype", CPU_DTYPES, ids=str)
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("kv_heads", [1, 2, 8])
@pytest.mark.parametrize("t", [1, 2, 7, 16, 33])
def test_write_kv(t, kv_heads, head_dim, dtype):
    g = gen("write_kv", t, kv_heads, head_dim, dtype)
    page_size, num_pages = 8, 8
    block_table, positions, k_pages, v_pages = pages_case(t, kv_heads, head_dim, page_size, num_pages, dtype, g)
    k, v = randn((t, kv_heads, head_dim), dtype, g), randn((t, kv_heads, head_dim), dtype, g)
    ref_k, ref_v = k_pages.clone(), v_pages.clone()
    ref_write_pages(ref_k, block_table, positions, k)
    ref_write_pages(ref_v, block_table, positions, v)
    write_kv(k_pages, v_pages, block_table, positions, k, v)
    assert_same(k_pages, ref_k)
    assert_same(v_pages, ref_v)


@pytest.mark.parametrize("dtype", CPU_DTYPES, ids=str)
def test_write_kv_strided_views_scattered_positions(dtype):
    """k and v as views of the fused projection output; positions out of order over many pages."""
    g = gen("write_kv_strided", dtype)
    t, heads, kv_heads, d, page_size, num_pages = 9, 4, 2, 64, 4, 6
    qkv = randn((t, (heads + 2 * kv_heads) * d), dtype, g)
    k = qkv[:, heads * d:(heads + kv_heads) * d].view(t, kv_heads, d)
    v = qkv[:, (heads + kv_heads) * d:].view(t, kv_heads, d)
    block_table, _, k_pages, v_pages = pages_case(t, kv_heads, d, page_size, num_pages, dtype, g)
    positions = torch.randperm(num_pages * page_size, generator=g, device=DEVICE)[:t]
    ref_k, ref_v = k_pages.clone(), v_pages.clone()
    ref_write_pages(ref_k, block_table, positions, k)
    ref_write_pages(ref_v, block_table, positions, v)
    write_kv(k_pages, v_pages, block_table, positions, k, v)
    assert_same(k_pages, ref_k)
    assert_same(v_pages, ref_v)


@pytest.mark.parametrize("dtype", CPU_DTYPES, ids=str)
@pytest.mark.parametrize("t", [1, 16, 33])
def test_write_pages(t, dtype):
    g = gen("write_pages", t, dtype)
    block_table, positions, pages, _ = pages_case(t, 2, 64, 16, 4, dtype, g)
    x = randn((t, 2, 64), dtype, g)
    expected = pages.clone()
    ref_write_pages(expected, block_table, positions, x)
    write_pages(pages, block_table, positions, x)
    assert_same(pages, expected)


def test_rejects_bad_inputs():
    pages = torch.zeros(4, 2, 8, 64, device=DEVICE)
    block_table = torch.arange(4, dtype=torch.int32, device=DEVICE)
    positions = torch.arange(3, device=DEVICE)
    x = torch.zeros(3, 2, 64, device=DEVICE)
    with pytest.raises(AssertionError):
        write_pages(pages, block_table.long(), positions, x)  # block table must be int32
    with pytest.raises(AssertionError):
        write_pages(pages, block_table, positions.int(), x)  # positions must be int64
    with pytest.raises(AssertionError):
        write_pages(pages, block_table, positions, x.half())  # dtype of the pages
    table = rope_table(64, THETA, 16, torch.device(DEVICE))
    with pytest.raises(AssertionError):
        apply_rope(x, table.cos.half(), table.sin.half(), positions)  # tables are float32


# -- GPU: bfloat16 at Qwen3-4B shapes ---------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("heads", [8, 32])
@pytest.mark.parametrize("t", [1, 16, 1024])
def test_gpu_apply_rope_bf16(t, heads):
    dtype = torch.bfloat16
    g = gen("gpu_rope", t, heads)
    table = rope_table(128, THETA, 4096, torch.device(DEVICE))
    x = randn((t, heads, 128), dtype, g)
    positions = run_positions(t, 4096, g)
    out = apply_rope(x, table.cos, table.sin, positions, out=poisoned(x.shape, dtype))
    expected = ref_apply_rope(x, table.cos[positions], table.sin[positions])
    assert not out.isnan().any()
    torch.testing.assert_close(out, expected, atol=1.6e-2, rtol=1.6e-2)
    assert_same(out, expected)  # same float32 operations, no contraction: exact on the GPU too


@pytest.mark.gpu
@pytest.mark.parametrize("t", [1, 16, 1024])
def test_gpu_write_kv_bf16(t):
    dtype = torch.bfloat16
    g = gen("gpu_write_kv", t)
    block_table, positions, k_pages, v_pages = pages_case(t, 8, 128, 64, 64, dtype, g)
    k, v = randn((t, 8, 128), dtype, g), randn((t, 8, 128), dtype, g)
    ref_k, ref_v = k_pages.clone(), v_pages.clone()
    ref_write_pages(ref_k, block_table, positions, k)
    ref_write_pages(ref_v, block_table, positions, v)
    write_kv(k_pages, v_pages, block_table, positions, k, v)
    assert_same(k_pages, ref_k)
    assert_same(v_pages, ref_v)
