"""Unit tests of the reference twins in tileinfer.backends.reference, each against an independent
computation (a hand loop, float64 arithmetic, torch's own SDPA, complex numbers)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from tileinfer.backends.reference.attention import causal_attention
from tileinfer.backends.reference.kv_cache import (
    dequantize_per_vector,
    gather_pages,
    quantize_per_vector,
    write_pages,
)
from tileinfer.backends.reference.linear import dequantize_int8, linear_int8, quantize_int8, silu_mul
from tileinfer.backends.reference.ngram import ngram_lookup
from tileinfer.backends.reference.norm import rms_norm
from tileinfer.backends.reference.rope import apply_rope
from tileinfer.backends.reference.sampling import sampling_probs
from tileinfer.model import rope_table


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def support(row: torch.Tensor) -> set[int]:
    return set(torch.nonzero(row > 0).flatten().tolist())


# -- sampling_probs ---------------------------------------------------------------------------------


def test_greedy_is_one_hot_at_argmax():
    logits = torch.randn(6, 50, generator=gen(1)) * 3
    probs = sampling_probs(logits, temperature=0.0, top_k=5, top_p=0.5, min_p=0.2)
    assert probs.dtype == torch.float32
    assert torch.equal(probs, F.one_hot(logits.argmax(-1), 50).float())


@pytest.mark.parametrize("temperature", [0.3, 1.0, 2.5])
def test_temperature_is_softmax_of_scaled_logits(temperature):
    logits = torch.randn(4, 40, generator=gen(2)) * 2
    probs = sampling_probs(logits, temperature)
    expected = torch.softmax(logits.double() / temperature, -1)
    torch.testing.assert_close(probs.double(), expected, atol=1e-6, rtol=1e-5)
    assert (probs > 0).all()


@pytest.mark.parametrize("top_k", [1, 3, 17])
def test_top_k_keeps_exactly_the_k_largest(top_k):
    logits = torch.randn(8, 64, generator=gen(3)) * 2
    probs = sampling_probs(logits, 0.7, top_k=top_k)
    for row, lrow in zip(probs, logits):
        assert support(row) == set(torch.topk(lrow, top_k).indices.tolist())
        kept = torch.topk(lrow, top_k).indices
        expected = torch.softmax(lrow[kept].double() / 0.7, -1)
        torch.testing.assert_close(row[kept].double(), expected, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(probs.sum(-1), torch.ones(8))


def test_top_k_at_or_above_vocab_is_off():
    logits = torch.randn(3, 10, generator=gen(4))
    torch.testing.assert_close(sampling_probs(logits, 1.0, top_k=10), torch.softmax(logits, -1))
    torch.testing.assert_close(sampling_probs(logits, 1.0, top_k=99), torch.softmax(logits, -1))


def _smallest_set_reaching(probs: torch.Tensor, top_p: float) -> set[int]:
    """Hand loop, float64: add tokens by decreasing probability until the mass reaches top_p."""
    order = sorted(range(len(probs)), key=lambda i: -float(probs[i]))
    kept, mass = set(), 0.0
    for i in order:
        kept.add(i)
        mass += float(probs[i])
        if mass >= top_p:
            break
    return kept


@pytest.mark.parametrize("top_p", [0.05, 0.3, 0.6, 0.9, 0.99])
def test_top_p_keeps_the_smallest_set_reaching_p(top_p):
    logits = torch.randn(16, 32, generator=gen(5)) * 2
    full = torch.softmax(logits.double(), -1)
    probs = sampling_probs(logits, 1.0, top_p=top_p)
    for row, frow in zip(probs, full):
        kept = _smallest_set_reaching(frow, top_p)
        assert support(row) == kept
        idx = sorted(kept)
        torch.testing.assert_close(row[idx].double(), frow[idx] / frow[idx].sum(), atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(probs.sum(-1), torch.ones(16))


def test_top_p_hand_picked_values():
    p = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    logits = p.log()
    assert support(sampling_probs(logits, 1.0, top_p=0.45)[0]) == {0}
    assert support(sampling_probs(logits, 1.0, top_p=0.7)[0]) == {0, 1}
    assert support(sampling_probs(logits, 1.0, top_p=0.81)[0]) == {0, 1, 2}
    assert support(sampling_probs(logits, 1.0, top_p=0.97)[0]) == {0, 1, 2, 3}
    torch.testing.assert_close(sampling_probs(logits, 1.0, top_p=0.7), torch.tensor([[0.625, 0.375, 0.0, 0.0]]))


def test_top_p_exact_boundary_keeps_the_smallest_set():
    """Equal logits give exactly representable probabilities: a set whose mass equals top_p
    exactly already reaches it, so nothing more is kept."""
    four = torch.zeros(1, 4)  # 0.25 each
    assert len(support(sampling_probs(four, 1.0, top_p=0.5)[0])) == 2
    assert len(support(sampling_probs(four, 1.0, top_p=0.75)[0])) == 3
    assert len(support(sampling_probs(four, 1.0, top_p=0.25)[0])) == 1
    assert len(support(sampling_probs(torch.zeros(1, 2), 1.0, top_p=0.5)[0])) == 1


@pytest.mark.parametrize("min_p", [0.01, 0.1, 0.5])
def test_min_p_keeps_tokens_above_a_fraction_of_the_top(min_p):
    logits = torch.randn(8, 48, generator=gen(6)) * 2
    full = torch.softmax(logits.double(), -1)
    probs = sampling_probs(logits, 1.0, min_p=min_p)
    for row, frow in zip(probs, full):
        expected = {i for i in range(48) if frow[i] >= min_p * frow.max()}
        assert support(row) == expected
        assert frow.argmax().item() in support(row)
    torch.testing.assert_close(probs.sum(-1), torch.ones(8))


def test_filters_compose_in_order_top_k_top_p_min_p():
    logits = torch.randn(12, 30, generator=gen(7)) * 2
    temperature, top_k, top_p, min_p = 0.8, 10, 0.8, 0.05
    probs = sampling_probs(logits, temperature, top_k=top_k, top_p=top_p, min_p=min_p)
    for row, lrow in zip(probs, logits):
        scaled = lrow.double() / temperature
        keep_k = set(torch.topk(scaled, top_k).indices.tolist())
        masked = scaled.masked_fill(torch.tensor([i not in keep_k for i in range(30)]), -math.inf)
        p = torch.softmax(masked, -1)
        keep_p = _smallest_set_reaching(p, top_p)
        kept = {i for i in keep_p if p[i] >= min_p * max(p[j] for j in keep_p)}
        assert support(row) == kept
        assert len(kept) <= top_k
    torch.testing.assert_close(probs.sum(-1), torch.ones(12))


# -- ngram_lookup ------------------------------------------------------------------------------------


def _ngram_brute(tokens, n_min, n_max, k):
    length = len(tokens)
    for n in range(min(n_max, length - 1), n_min - 1, -1):
        suffix = tokens[length - n:]
        for start in range(0, length - n):  # earlier occurrences start before the suffix does
            if tokens[start:start + n] == suffix:
                return tokens[start + n: start + n + k]
    return []


def test_ngram_longest_suffix_wins():
    tokens = [2, 3, 4, 0, 1, 2, 3, 6, 1, 2, 3]
    assert ngram_lookup(tokens, 1, 3, 3) == [6, 1, 2]  # [1, 2, 3] at 4
    assert ngram_lookup(tokens, 1, 2, 3) == [4, 0, 1]  # [2, 3] first at 0
    assert ngram_lookup(tokens, 1, 1, 2) == [4, 0]  # [3] first at 1


def test_ngram_earliest_occurrence():
    assert ngram_lookup([7, 1, 8, 1, 9, 1], 1, 1, 3) == [8, 1, 9]
    assert ngram_lookup([5, 6, 1, 5, 6, 2, 5, 6], 2, 2, 1) == [1]


def test_ngram_n_min_respected_and_no_match():
    tokens = [1, 2, 3, 9, 4, 3]  # only the 1-gram [3] occurs earlier
    assert ngram_lookup(tokens, 1, 4, 2) == [9, 4]
    assert ngram_lookup(tokens, 2, 4, 2) == []
    assert ngram_lookup([1, 2, 3, 4, 5], 1, 4, 5) == []
    assert ngram_lookup([5], 1, 4, 5) == []


def test_ngram_k_and_end_of_sequence():
    assert ngram_lookup([4, 5, 6, 7, 4], 1, 2, 2) == [5, 6]
    assert ngram_lookup([4, 5, 6, 7, 4], 1, 2, 10) == [5, 6, 7, 4]
    assert ngram_lookup([1, 1, 1, 1], 1, 3, 5) == [1]  # [1, 1, 1] at 0, overlapping the suffix


def test_ngram_matches_brute_force():
    g = gen(8)
    for trial in range(300):
        length = int(torch.randint(1, 40, (1,), generator=g))
        tokens = torch.randint(0, 4, (length,), generator=g).tolist()
        n_min = int(torch.randint(1, 3, (1,), generator=g))
        n_max = n_min + int(torch.randint(0, 4, (1,), generator=g))
        k = int(torch.randint(1, 8, (1,), generator=g))
        assert ngram_lookup(tokens, n_min, n_max, k) == _ngram_brute(tokens, n_min, n_max, k), (tokens, n_min, n_max, k)


# -- INT8 quantization ------------------------------------------------------------------------------


def test_quantize_int8_round_trip():
    w = torch.randn(48, 96, generator=gen(9)) * torch.logspace(-3, 1, 48)[:, None]
    w[5] = 0.0
    q, scale = quantize_int8(w)
    assert q.dtype == torch.int8 and q.shape == w.shape and scale.shape == (48,) and scale.dtype == torch.float32
    assert q.abs().max() <= 127
    assert (q.abs().amax(1)[torch.arange(48) != 5] == 127).all()  # the largest |w| of a row maps to 127
    torch.testing.assert_close(scale, w.abs().amax(1).clamp(min=1e-12) / 127)
    err = (dequantize_int8(q, scale, torch.float32) - w).abs()
    assert (err <= scale[:, None] / 2 * (1 + 1e-5) + 1e-12).all()
    assert (dequantize_int8(q, scale, torch.float32)[5] == 0).all()
    x = torch.randn(5, 96, generator=gen(10))
    torch.testing.assert_close(linear_int8(x, q, scale), x @ (q.double() * scale.double()[:, None]).float().T,
                               atol=1e-5, rtol=1e-5)


def test_quantize_per_vector_round_trip():
    x = torch.randn(7, 3, 64, generator=gen(11)) * torch.logspace(-2, 2, 7)[:, None, None]
    q, scale = quantize_per_vector(x)
    assert q.dtype == torch.int8 and scale.shape == (7, 3)
    assert q.abs().max() <= 127 and (q.abs().amax(-1) == 127).all()
    err = (dequantize_per_vector(q, scale, torch.float32) - x).abs()
    assert (err <= scale[..., None] / 2 * (1 + 1e-5)).all()
    # a single scale per row would not satisfy the bound for the small vectors
    assert err[0].max() < x[0].abs().max() / 100


def test_silu_mul():
    x = torch.randn(4, 20, generator=gen(12))
    torch.testing.assert_close(silu_mul(x), F.silu(x[:, :10]) * x[:, 10:])


def test_rms_norm_matches_definition():
    x = torch.randn(5, 32, generator=gen(13)) * 3
    w = torch.rand(32, generator=gen(14)) + 0.5
    xd = x.double()
    expected = w.double() * xd / torch.sqrt(xd.pow(2).mean(-1, keepdim=True) + 1e-6)
    torch.testing.assert_close(rms_norm(x, w, 1e-6).double(), expected, atol=1e-5, rtol=1e-5)


# -- paged KV ops ----------------------------------------------------------------------------------


def test_write_gather_pages_round_trip_non_identity_table():
    num_pages, hkv, page, d, length = 9, 2, 4, 8, 27  # 7 pages used, the last partly
    pages = torch.full((num_pages, hkv, page, d), float("nan"))
    scales = torch.full((num_pages, hkv, page), float("nan"))
    block_table = torch.tensor([6, 2, 8, 0, 5, 3, 7, 1, 4], dtype=torch.int32)
    x = torch.randn(length, hkv, d, generator=gen(16))
    s = torch.rand(length, hkv, generator=gen(17))
    order = torch.randperm(length, generator=gen(18))
    for chunk in (order[:10], order[10:11], order[11:]):  # prefill-, decode- and verify-sized writes
        write_pages(pages, block_table, chunk, x[chunk])
        write_pages(scales, block_table, chunk, s[chunk])
    assert torch.equal(gather_pages(pages, block_table, length), x)
    assert torch.equal(gather_pages(scales, block_table, length), s)
    assert torch.equal(gather_pages(pages, block_table, 13), x[:13])
    for p in range(length):  # where the data physically lives
        assert torch.equal(pages[block_table[p // page], :, p % page], x[p])
    # pages the table does not reach were not touched
    assert torch.isnan(pages[block_table[7:].long()]).all()
    # an identity table reads other data: the table matters
    assert not torch.equal(gather_pages(pages, torch.arange(num_pages, dtype=torch.int32), 8), x[:8])


def test_write_pages_casts_to_page_dtype():
    pages = torch.zeros(2, 1, 4, 3, dtype=torch.int8)
    block_table = torch.tensor([1, 0], dtype=torch.int32)
    x = torch.tensor([[[1, -2, 127]], [[-127, 5, 0]]], dtype=torch.int8)
    write_pages(pages, block_table, torch.tensor([5, 0]), x)
    assert torch.equal(pages[0, 0, 1], x[0, 0]) and torch.equal(pages[1, 0, 0], x[1, 0])
    assert torch.equal(gather_pages(pages, block_table, 6)[[0, 5]], x[[1, 0]])


# -- attention --------------------------------------------------------------------------------------


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


# -- RoPE -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("d", [16, 64, 128])
def test_apply_rope_matches_complex_rotation(d):
    theta, positions = 10000.0, torch.tensor([0, 1, 7, 100, 511])
    table = rope_table(d, theta, 512, torch.device("cpu"))
    x = torch.randn(len(positions), 3, d, generator=gen(21))
    out = apply_rope(x, table.cos[positions], table.sin[positions])
    # independent: channel i pairs with i + d/2 as a complex number, rotated by pos * theta^(-2i/d)
    i = torch.arange(d // 2, dtype=torch.float64)
    angle = positions.double()[:, None] * theta ** (-2 * i / d)  # [T, d/2]
    z = torch.complex(x[..., : d // 2].double(), x[..., d // 2:].double()) * torch.polar(
        torch.ones_like(angle), angle)[:, None, :]
    ref = torch.cat((z.real, z.imag), -1)
    torch.testing.assert_close(out.double(), ref, atol=2e-4, rtol=1e-4)  # float32 angles at position 511
    assert torch.equal(out[0], x[0])  # position 0 is the identity
    torch.testing.assert_close(out.norm(dim=-1), x.norm(dim=-1))  # a rotation keeps norms
