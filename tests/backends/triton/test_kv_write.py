"""Triton write_kv / write_pages (backends/triton/kv_write.py) against the twin ``write_pages``
(backends/reference/kv_write.py): the write copies bits, so bit for bit. Pages are poisoned with NaN
before each launch (slots nobody writes must stay NaN); block tables are random page permutations
and positions cross pages.
"""

from __future__ import annotations

import pytest
import torch

from tileinfer.backends.reference.kv_write import write_pages as ref_write_pages
from tileinfer.backends.triton.kv_write import write_kv, write_pages

from ..kernel_checks import DEVICE, INTERPRETER_DTYPES, assert_same, generator, poisoned, randn, step_positions


def pages_case(t, kv_heads, head_dim, page_size, num_pages, dtype, g):
    block_table = torch.randperm(num_pages, generator=g, device=DEVICE).to(torch.int32)
    positions = step_positions(t, num_pages * page_size, g)
    k_pages = poisoned((num_pages, kv_heads, page_size, head_dim), dtype)
    return block_table, positions, k_pages, k_pages.clone()


def check_write_kv(k_pages, v_pages, block_table, positions, k, v):
    ref_k, ref_v = k_pages.clone(), v_pages.clone()
    ref_write_pages(ref_k, block_table, positions, k)
    ref_write_pages(ref_v, block_table, positions, v)
    write_kv(k_pages, v_pages, block_table, positions, k, v)
    assert_same(k_pages, ref_k)
    assert_same(v_pages, ref_v)


@pytest.mark.parametrize("dtype", INTERPRETER_DTYPES, ids=str)
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("kv_heads", [1, 2, 8])
@pytest.mark.parametrize("t", [1, 2, 7, 16, 33])
def test_write_kv(t, kv_heads, head_dim, dtype):
    g = generator("write_kv", t, kv_heads, head_dim, dtype)
    block_table, positions, k_pages, v_pages = pages_case(t, kv_heads, head_dim, 8, 8, dtype, g)
    k, v = randn((t, kv_heads, head_dim), dtype, g), randn((t, kv_heads, head_dim), dtype, g)
    check_write_kv(k_pages, v_pages, block_table, positions, k, v)


@pytest.mark.parametrize("dtype", INTERPRETER_DTYPES, ids=str)
def test_write_kv_strided_views_scattered_positions(dtype):
    """k and v as views of the fused projection output; positions out of order over many pages."""
    g = generator("write_kv_strided", dtype)
    t, heads, kv_heads, d, page_size, num_pages = 9, 4, 2, 64, 4, 6
    qkv = randn((t, (heads + 2 * kv_heads) * d), dtype, g)
    k = qkv[:, heads * d:(heads + kv_heads) * d].view(t, kv_heads, d)
    v = qkv[:, (heads + kv_heads) * d:].view(t, kv_heads, d)
    block_table, _, k_pages, v_pages = pages_case(t, kv_heads, d, page_size, num_pages, dtype, g)
    positions = torch.randperm(num_pages * page_size, generator=g, device=DEVICE)[:t]
    check_write_kv(k_pages, v_pages, block_table, positions, k, v)


@pytest.mark.parametrize("dtype", INTERPRETER_DTYPES, ids=str)
@pytest.mark.parametrize("t", [1, 16, 33])
def test_write_pages(t, dtype):
    g = generator("write_pages", t, dtype)
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


@pytest.mark.gpu
@pytest.mark.parametrize("t", [1, 16, 1024])
def test_gpu_write_kv_bf16(t):
    g = generator("gpu_write_kv", t)
    block_table, positions, k_pages, v_pages = pages_case(t, 8, 128, 64, 64, torch.bfloat16, g)
    k, v = randn((t, 8, 128), torch.bfloat16, g), randn((t, 8, 128), torch.bfloat16, g)
    check_write_kv(k_pages, v_pages, block_table, positions, k, v)
