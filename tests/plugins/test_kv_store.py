"""The paged KV stores of plugin ``paged_kv``: page bookkeeping (reserve, truncate, free list,
capacity) and write/gather round trips (``paged`` exact, ``paged_int8`` within half a step of
each vector's scale)."""

from __future__ import annotations

import pytest
import torch

from tileinfer.backends.reference.kv_quant import key_smoothing
from tileinfer.errors import UsageError
from tileinfer.interfaces import KVGeometry, KVStore
from tileinfer.registry import build_registry

CPU = torch.device("cpu")
STORES = ["paged", "paged_int8"]


@pytest.fixture(scope="module")
def registry():
    return build_registry()


def make_store(registry, name, *, layers=2, kv_heads=2, head_dim=16, page_size=4, num_pages=8,
               key_norm_weights=None) -> KVStore:
    geometry = KVGeometry(layers, kv_heads, head_dim, page_size, num_pages, torch.float32)
    return registry.get("kv_store", name)(geometry, CPU, key_norm_weights=key_norm_weights)


def pages_of(store: KVStore) -> list[int]:
    return store.block_table[: -(-store.length // store.page_size)].tolist()


def check_invariants(store: KVStore) -> None:
    used = pages_of(store)
    assert len(set(used)) == len(used), "a page is used twice"
    assert sorted(used + store._free) == list(range(store.geometry.num_pages)), "pages leaked or duplicated"


@pytest.mark.parametrize("name", STORES)
def test_reserve_takes_pages_from_the_free_list(registry, name):
    store = make_store(registry, name)
    assert store.capacity == 32 and store.length == 0
    store.reserve(5)  # 2 pages
    assert store.length == 5 and len(pages_of(store)) == 2
    check_invariants(store)
    store.reserve(5)  # no growth
    store.reserve(3)  # never shrinks
    assert store.length == 5 and len(store._free) == 6
    store.reserve(13)  # 4 pages
    check_invariants(store)
    used = pages_of(store)
    assert len(used) == 4
    assert used != list(range(4)), "block table is the identity: a kernel that ignores it would pass"


@pytest.mark.parametrize("name", STORES)
def test_truncate_frees_whole_pages_which_are_reused(registry, name):
    store = make_store(registry, name)
    store.reserve(14)  # pages for positions 0..15
    before = pages_of(store)
    store.truncate(9)  # keeps 3 pages (positions 8 and 9 live in the third)
    assert store.length == 9 and pages_of(store) == before[:3]
    check_invariants(store)
    store.truncate(8)  # exactly 2 pages
    assert pages_of(store) == before[:2] and len(store._free) == 6
    store.reserve(16)
    check_invariants(store)
    assert pages_of(store)[:2] == before[:2]
    assert set(pages_of(store)) == set(before), "freed pages were not reused"
    with pytest.raises(ValueError):
        store.truncate(17)
    store.reset()
    assert store.length == 0 and sorted(store._free) == list(range(8))
    store.reserve(1)
    check_invariants(store)


@pytest.mark.parametrize("name", STORES)
def test_reserving_past_capacity_is_a_usage_error(registry, name):
    store = make_store(registry, name)
    store.reserve(32)  # exactly the capacity is fine
    check_invariants(store)
    assert store._free == []
    with pytest.raises(UsageError, match="kv_capacity"):
        store.reserve(33)
    store.reset()
    with pytest.raises(UsageError):
        store.reserve(100)
    assert store.length == 0


def _steps(store, layer_kv, steps, seed):
    """Write random k, v through prefill/decode/verify-like steps; return what the cache should hold."""
    g = torch.Generator().manual_seed(seed)
    geo = store.geometry
    ks = {n: torch.empty(0, geo.num_kv_heads, geo.head_dim) for n in range(geo.num_layers)}
    vs = dict(ks)
    for count, keep in steps:  # write `count` positions, then keep only `keep` of them
        start = store.length
        store.reserve(start + count)
        positions = torch.arange(start, start + count)
        for n in range(geo.num_layers):
            k = torch.randn(count, geo.num_kv_heads, geo.head_dim, generator=g) * layer_kv(n)
            v = torch.randn(count, geo.num_kv_heads, geo.head_dim, generator=g)
            store.write(n, positions, k, v)
            ks[n] = torch.cat([ks[n], k[:keep]])
            vs[n] = torch.cat([vs[n], v[:keep]])
        store.truncate(start + keep)
        check_invariants(store)
    return ks, vs


STEPS = [(11, 11), (1, 1), (4, 2), (1, 1), (8, 3), (5, 5)]  # prefill, decode, rejected drafts ...


def test_paged_write_then_gather_is_exact(registry):
    store = make_store(registry, "paged")
    ks, vs = _steps(store, lambda n: 1.0, STEPS, seed=0)
    length = store.length
    assert length == 23
    for n in range(2):
        k, v = store.gather(n, length)
        assert k.dtype == torch.float32 and k.shape == (length, 2, 16)
        assert torch.equal(k, ks[n]) and torch.equal(v, vs[n])
        assert torch.equal(store.gather(n, 7)[0], ks[n][:7])
        layer = store.layer(n)
        assert layer.k_scale is None and layer.k_smooth is None and layer.k.shape == (8, 2, 4, 16)


@pytest.mark.parametrize("smoothed", [False, True])
def test_paged_int8_write_then_gather_within_per_vector_bound(registry, smoothed):
    g = torch.Generator().manual_seed(1)
    weights = [torch.rand(16, generator=g) * 3 + 0.2 for _ in range(2)] if smoothed else None
    store = make_store(registry, "paged_int8", key_norm_weights=weights)
    smooth = [key_smoothing(w) if smoothed else torch.ones(16) for w in (weights or [None, None])]
    ks, vs = _steps(store, lambda n: smooth[n] if smoothed else 1.0, STEPS, seed=2)
    length = store.length
    for n in range(2):
        k, v = store.gather(n, length)
        assert k.dtype == torch.float32 and k.shape == (length, 2, 16)
        layer = store.layer(n)
        assert layer.k.dtype == torch.int8 and layer.k_scale.shape == (8, 2, 4)
        torch.testing.assert_close(layer.k_smooth, smooth[n])
        expected_k = ks[n] / smooth[n]  # the store holds k / k_smooth
        for got, want in ((k, expected_k), (v, vs[n])):
            bound = want.abs().amax(-1, keepdim=True) / 127 / 2
            assert ((got - want).abs() <= bound * (1 + 1e-4) + 1e-7).all()
            assert (got - want).abs().max() > 0  # it is really quantized
        if smoothed:  # multiplying back by the smoothing recovers the keys
            torch.testing.assert_close(k * smooth[n], ks[n], atol=0.05, rtol=0.02)


def test_paged_int8_rollback_keeps_earlier_positions(registry):
    store = make_store(registry, "paged_int8")
    k0 = torch.randn(6, 2, 16)
    store.reserve(6)
    store.write(0, torch.arange(6), k0, k0)
    before = store.gather(0, 6)[0].clone()
    store.reserve(10)
    store.write(0, torch.arange(6, 10), torch.randn(4, 2, 16) * 50, torch.randn(4, 2, 16))
    store.truncate(6)
    assert torch.equal(store.gather(0, 6)[0], before)
