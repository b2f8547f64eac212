"""The reference attention's read of the cache (plugins/reference/attention.py: ``dense_attention``,
SDPA over the pages) against the oracle, ``causal_attention`` over ``KVStore.gather``, for both
paged stores: pages in the model dtype (read in place, through the block table) and INT8 (read
through ``gather``); steps from position 0, decode and verify steps after a cached prefix, and
steps that take their positions from the device (``Step.max_context``)."""

from __future__ import annotations

import pytest
import torch

from tileinfer.backends.reference.paged_attention import causal_attention
from tileinfer.interfaces import KVGeometry, KVStore, Step
from tileinfer.plugins.reference.attention import dense_attention
from tileinfer.registry import build_registry

CPU = torch.device("cpu")
HEADS, KV_HEADS, HEAD_DIM, PAGE, PAGES = 6, 2, 32, 8, 10
SCALE = HEAD_DIM**-0.5
TABLE = [3, 9, 0, 6, 1, 8, 2, 7, 4, 5]  # neither order: a read that assumes one gets other pages
STORES = ["paged", "paged_int8"]
# (start, new tokens): a prompt, decode at a page boundary and inside a page, verify steps.
STEPS = [(0, 21), (16, 1), (27, 1), (23, 5), (40, 8)]


@pytest.fixture(scope="module")
def registry():
    return build_registry()


def filled_store(registry, name: str, length: int, dtype=torch.float32) -> KVStore:
    """A two-layer store whose block table is :data:`TABLE` (the free list hands pages out in
    order; the store's tests check its bookkeeping), its pages poisoned with NaN before positions
    ``[0, length)`` are written."""
    geometry = KVGeometry(2, KV_HEADS, HEAD_DIM, PAGE, PAGES, dtype)
    g = torch.Generator().manual_seed(length)
    norms = [torch.rand(HEAD_DIM, generator=g) + 0.5 for _ in range(2)]
    store = registry.get("kv_store", name)(geometry, CPU, key_norm_weights=norms)
    store.reserve(length)
    store.block_table.copy_(torch.tensor(TABLE, dtype=torch.int32))
    for pages in (store.k, store.v, getattr(store, "k_scale", None), getattr(store, "v_scale", None)):
        if pages is not None:
            pages.fill_(float("nan") if pages.is_floating_point() else 0)
    if name == "paged_int8":
        store.k_scale.fill_(float("nan"))  # slots never written dequantize to NaN
    for layer in range(2):
        k = torch.randn(length, KV_HEADS, HEAD_DIM, generator=g).to(dtype)
        v = torch.randn(length, KV_HEADS, HEAD_DIM, generator=g).to(dtype)
        store.write(layer, torch.arange(length), k, v)
    return store


@pytest.mark.parametrize("start,t", STEPS, ids=[f"start{s}-t{t}" for s, t in STEPS])
@pytest.mark.parametrize("name", STORES)
def test_dense_attention_is_causal_attention_over_the_gathered_cache(registry, name, start, t):
    store = filled_store(registry, name, start + t)
    q = torch.randn(t, HEADS, HEAD_DIM, generator=torch.Generator().manual_seed(start))
    for layer in range(2):
        keys, values = store.gather(layer, start + t)
        expected = causal_attention(q, keys, values, start, SCALE)
        got = dense_attention(q, Step.at(start, t, CPU), store, layer, SCALE)
        assert got.shape == (t, HEADS, HEAD_DIM) and got.dtype == torch.float32
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("start,t", STEPS, ids=[f"start{s}-t{t}" for s, t in STEPS])
@pytest.mark.parametrize("name", STORES)
def test_a_replayed_step_reads_its_positions_from_the_device(registry, name, start, t):
    """``max_context`` set and a stale host ``start`` (the capture's): the positions tensor alone
    says which of the pool's positions the queries see; the rest hold NaN or other pages' data."""
    store = filled_store(registry, name, start + t)
    q = torch.randn(t, HEADS, HEAD_DIM, generator=torch.Generator().manual_seed(start))
    keys, values = store.gather(1, start + t)
    expected = causal_attention(q, keys, values, start, SCALE)
    step = Step(start=3, num_tokens=t, positions=torch.arange(start, start + t), max_context=store.capacity)
    torch.testing.assert_close(dense_attention(q, step, store, 1, SCALE), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "materialized"])
@pytest.mark.parametrize("replayed", [False, True], ids=["eager", "replayed"])
@pytest.mark.parametrize("start,t", [(0, 9), (16, 1), (23, 5), (40, 16)], ids=lambda x: str(x))
@pytest.mark.parametrize("name", STORES)
def test_a_non_causal_step_sees_the_whole_step(registry, name, start, t, replayed, fused):
    """``Step.causal=False``: every query attends to all ``start + T`` positions (``causal_attention``
    with ``causal=False`` over the gathered cache), eager or with the positions from the device."""
    store = filled_store(registry, name, start + t)
    q = torch.randn(t, HEADS, HEAD_DIM, generator=torch.Generator().manual_seed(start + 7))
    keys, values = store.gather(0, start + t)
    expected = causal_attention(q, keys, values, start, SCALE, causal=False)
    if replayed:
        step = Step(start=3, num_tokens=t, positions=torch.arange(start, start + t), max_context=store.capacity,
                    causal=False)
    else:
        step = Step.at(start, t, CPU, causal=False)
    torch.testing.assert_close(dense_attention(q, step, store, 0, SCALE, fused=fused), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("name", STORES)
def test_half_precision_stays_close_to_the_float32_oracle(registry, name, dtype):
    start, t = 23, 5
    store = filled_store(registry, name, start + t, dtype)
    q = torch.randn(t, HEADS, HEAD_DIM, generator=torch.Generator().manual_seed(1)).to(dtype)
    keys, values = store.gather(0, start + t)
    expected = causal_attention(q.float(), keys.float(), values.float(), start, SCALE)
    got = dense_attention(q, Step.at(start, t, CPU), store, 0, SCALE)
    assert got.dtype == dtype
    tol = {torch.bfloat16: 1.6e-2, torch.float16: 2e-3}[dtype]
    torch.testing.assert_close(got.float(), expected, atol=tol, rtol=tol)


def test_the_scores_option_gives_the_same_tokens_both_ways(tiny_checkpoint):
    """options.reference.scores: torch's fused attention or float32 scores materialized, the same
    greedy tokens (float32); auto takes the fused path on a CPU."""
    import tileinfer

    def run(scores: str) -> list[int]:
        engine = tileinfer.Engine.from_config("reference", {"options": {"reference": {"scores": scores}}},
                                              model=str(tiny_checkpoint), device="cpu", dtype="float32",
                                              kv_page_size=16, progress=False)
        return engine.generate([(7 * i) % 23 + 40 for i in range(40)], max_new_tokens=12).token_ids

    assert run("fused") == run("materialized") == run("auto")
