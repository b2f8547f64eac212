"""causal_attention and paged_attention (backends/reference/paged_attention.py) against torch's SDPA
and a float64 loop."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tileinfer.backends.reference.paged_attention import causal_attention, paged_attention


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
