"""sampling_probs (backends/reference/sampling.py) against hand loops in float64."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from tileinfer.backends.reference.sampling import sampling_probs


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def support(row: torch.Tensor) -> set[int]:
    return set(torch.nonzero(row > 0).flatten().tolist())


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
