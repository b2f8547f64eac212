"""causal_attention and paged_attention (backends/reference/paged_attention.py) against torch's SDPA
and a float64 loop; sdpa_attention and gather_heads against causal_attention and gather_pages."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tileinfer.backends.reference.paged_attention import (causal_attention, gather_heads, gather_pages,
                                                          paged_attention, sdpa_attention)


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@pytest.mark.parametrize("heads,kv_heads,d", [(4, 4, 16), (4, 2, 32), (8, 2, 64), (4, 1, 128)])
def test_causal_attention_full_prompt_matches_sdpa(heads, kv_heads, d):
    t = 37
    g = gen(19)
    q, k, v = (torch.randn(t, h, d, generator=g) for h in (heads, kv_heads, kv_heads))
    out = causal_attention(q, k, v, 0, d**-0.5)
    group = heads // kv_heads
    ref = F.scaled_dot_product_attention(
        q.transpose(0, 1)[None], k.repeat_interleave(group, 1).transpose(0, 1)[None],
        v.repeat_interleave(group, 1).transpose(0, 1)[None], is_causal=True)[0].transpose(0, 1)
    assert out.shape == (t, heads, d)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("start,t", [(5, 1), (20, 4), (31, 8)])
def test_causal_attention_with_cached_prefix_matches_loop(start, t):
    heads, kv_heads, d = 6, 2, 16
    g = gen(20 + start)
    q = torch.randn(t, heads, d, generator=g)
    k = torch.randn(start + t, kv_heads, d, generator=g)
    v = torch.randn(start + t, kv_heads, d, generator=g)
    scale = 0.3
    out = causal_attention(q, k, v, start, scale)
    ref = torch.empty(t, heads, d, dtype=torch.float64)
    for i in range(t):
        for h in range(heads):
            kh = h // (heads // kv_heads)
            keys = k[: start + i + 1, kh].double()
            w = torch.softmax(keys @ q[i, h].double() * scale, 0)
            ref[i, h] = w @ v[: start + i + 1, kh].double()
    torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=1e-5)


def test_causal_attention_keeps_dtype():
    q = torch.randn(3, 2, 8, dtype=torch.bfloat16)
    k = torch.randn(5, 1, 8, dtype=torch.bfloat16)
    assert causal_attention(q, k, k, 2, 0.5).dtype == torch.bfloat16


@pytest.mark.parametrize("start,t", [(0, 7), (13, 1), (30, 4)])
def test_paged_attention_is_causal_attention_over_the_pages(start, t):
    """Through a permuted block table, with poisoned (NaN) page slots past the context; ``start``
    as an int or as the queries' positions."""
    heads, kv_heads, d, page, num_pages = 4, 2, 16, 8, 7
    g = gen(30 + start)
    length = start + t
    k = torch.randn(length, kv_heads, d, generator=g)
    v = torch.randn(length, kv_heads, d, generator=g)
    q = torch.randn(t, heads, d, generator=g)
    block_table = torch.randperm(num_pages, generator=g).to(torch.int32)
    k_pages = torch.full((num_pages, kv_heads, page, d), float("nan"))
    v_pages = torch.full_like(k_pages, float("nan"))
    for p in range(length):
        k_pages[block_table[p // page], :, p % page] = k[p]
        v_pages[block_table[p // page], :, p % page] = v[p]
    expected = causal_attention(q, k, v, start, 0.25)
    assert torch.equal(paged_attention(q, k_pages, v_pages, block_table, start, 0.25), expected)
    positions = torch.arange(start, length)
    got = paged_attention(q, k_pages, v_pages, block_table, positions, 0.25)
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-6)


# (heads, kv_heads, head_dim, start, new tokens): GQA groups of 1, 3 and 4, decode (T = 1) and
# steps of several tokens, from position 0 (a prompt) and after a cached prefix (verify steps).
SDPA_CASES = [(4, 4, 16, 0, 9), (6, 2, 64, 0, 37), (6, 2, 64, 0, 1), (6, 2, 64, 41, 1), (8, 2, 32, 17, 5),
              (4, 1, 128, 63, 1), (4, 1, 128, 30, 16)]
SDPA_IDS = [f"h{h}-kv{kv}-d{d}-start{s}-t{t}" for h, kv, d, s, t in SDPA_CASES]


@pytest.mark.parametrize("heads,kv_heads,d,start,t", SDPA_CASES, ids=SDPA_IDS)
def test_sdpa_attention_is_causal_attention(heads, kv_heads, d, start, t):
    g = gen(40 + start + t)
    q = torch.randn(t, heads, d, generator=g)
    k = torch.randn(start + t, kv_heads, d, generator=g)
    v = torch.randn(start + t, kv_heads, d, generator=g)
    expected = causal_attention(q, k, v, start, d**-0.5)
    got = sdpa_attention(q, k, v, start, d**-0.5)
    assert got.shape == (t, heads, d) and got.dtype == q.dtype
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("heads,kv_heads,d,start,t", SDPA_CASES, ids=SDPA_IDS)
def test_sdpa_attention_by_positions_ignores_the_rows_past_them(heads, kv_heads, d, start, t):
    """``start`` as the positions tensor (a step replayed from a CUDA graph): K and V hold more
    rows than the queries see, poisoned with NaN, and only the device tensor says where they stop."""
    g = gen(50 + start + t)
    q = torch.randn(t, heads, d, generator=g)
    k = torch.randn(start + t + 11, kv_heads, d, generator=g)
    v = torch.randn(start + t + 11, kv_heads, d, generator=g)
    expected = causal_attention(q, k[: start + t], v[: start + t], start, 0.2)
    k[start + t:], v[start + t:] = float("nan"), float("nan")
    got = sdpa_attention(q, k, v, torch.arange(start, start + t), 0.2)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_sdpa_attention_in_half_precision_is_close_to_float32(dtype):
    """Inputs rounded to ``dtype``: within a few of its ulps of the float32 oracle on the same
    rounded inputs (the CPU kernel accumulates in float32; the output is rounded once)."""
    heads, kv_heads, d, start, t = 6, 2, 64, 29, 3
    g = gen(60)
    q, k, v = (torch.randn(n, h, d, generator=g).to(dtype)
               for n, h in ((t, heads), (start + t, kv_heads), (start + t, kv_heads)))
    got = sdpa_attention(q, k, v, start, d**-0.5)
    assert got.dtype == dtype
    expected = causal_attention(q.float(), k.float(), v.float(), start, d**-0.5)
    tol = {torch.bfloat16: 1.6e-2, torch.float16: 2e-3}[dtype]
    torch.testing.assert_close(got.float(), expected, atol=tol, rtol=tol)


@pytest.mark.parametrize("length", [1, 8, 13, 50])
def test_gather_heads_is_gather_pages_heads_first(length):
    """Through a permuted block table; the result is [Hkv, L, D], and its transpose (the layout
    sdpa_attention takes) gives causal_attention's result over the gathered pages."""
    heads, kv_heads, d, page, num_pages = 4, 2, 16, 8, 7
    g = gen(70 + length)
    pages = torch.randn(num_pages, kv_heads, page, d, generator=g)
    block_table = torch.randperm(num_pages, generator=g).to(torch.int32)
    dense = gather_pages(pages, block_table, length)
    heads_first = gather_heads(pages, block_table, length)
    assert heads_first.shape == (kv_heads, length, d)
    assert torch.equal(heads_first.transpose(0, 1), dense)
    q = torch.randn(1, heads, d, generator=g)
    keys = heads_first.transpose(0, 1)
    torch.testing.assert_close(sdpa_attention(q, keys, keys, length - 1, 0.3),
                               causal_attention(q, dense, dense, length - 1, 0.3), atol=1e-5, rtol=1e-5)


def test_gather_heads_into_a_larger_buffer_leaves_the_result_unchanged():
    """``out`` (a flat buffer the size of all the pages, reused across calls) gives the same result
    as a fresh copy, for a short and then a long context."""
    kv_heads, d, page, num_pages = 2, 16, 8, 7
    g = gen(80)
    pages = torch.randn(num_pages, kv_heads, page, d, generator=g)
    block_table = torch.randperm(num_pages, generator=g).to(torch.int32)
    out = torch.full((pages.numel(),), float("nan"))
    for length in (3, 50, 9):
        got = gather_heads(pages, block_table, length, out)
        assert got.data_ptr() == out.data_ptr()
        assert torch.equal(got, gather_heads(pages, block_table, length))


@pytest.mark.parametrize("start,t", [(0, 1), (0, 9), (13, 1), (20, 7), (31, 16)])
def test_non_causal_attention_matches_a_loop_over_all_keys(start, t):
    """``causal=False`` (``Step.causal``): every query sees all ``start + T`` keys, the step's later
    ones included; the same through the positions tensor with NaN rows past the step, and through
    SDPA."""
    heads, kv_heads, d = 6, 2, 16
    g = gen(90 + start + t)
    q = torch.randn(t, heads, d, generator=g)
    k = torch.randn(start + t + 5, kv_heads, d, generator=g)
    v = torch.randn(start + t + 5, kv_heads, d, generator=g)
    k[start + t:], v[start + t:] = float("nan"), float("nan")
    ref = torch.empty(t, heads, d, dtype=torch.float64)
    for i in range(t):
        for h in range(heads):
            kh = h // (heads // kv_heads)
            w = torch.softmax(k[: start + t, kh].double() @ q[i, h].double() * 0.3, 0)
            ref[i, h] = w @ v[: start + t, kh].double()
    positions = torch.arange(start, start + t)
    for got in (causal_attention(q, k[: start + t], v[: start + t], start, 0.3, causal=False),
                causal_attention(q, k, v, positions, 0.3, causal=False),
                sdpa_attention(q, k, v, start, 0.3, causal=False),
                sdpa_attention(q, k, v, positions, 0.3, causal=False)):
        torch.testing.assert_close(got.double(), ref, atol=1e-5, rtol=1e-5)
    if t > 1:  # and the causal result differs from it where a query has later keys to see
        assert not torch.allclose(causal_attention(q, k[: start + t], v[: start + t], start, 0.3)[0].double(),
                                  ref[0], atol=1e-3)
