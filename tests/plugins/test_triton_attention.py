"""The Triton attention (plugins/triton/attention.py) against the reference attention, a whole layer
call each (q/k norm, RoPE, the KV write, attention over the pages): on the same qkv after the same
cached prefix, through a block table that is not the identity, for each store it can read, causal
and non-causal steps (``Step.causal``) of the prefill, decode and verify sizes.

Without a GPU the kernels run under the Triton interpreter in float32 (its bf16 dots are wrong),
with small heads; the GPU cases run bfloat16 at Qwen3-4B's attention shape.
"""

from __future__ import annotations

import pytest
import torch

import tileinfer
from conftest import DEVICE
from tileinfer.backends.reference.paged_attention import gather_pages
from tileinfer.errors import ConfigError
from tileinfer.interfaces import AttentionSpec, KVGeometry, Step
from tileinfer.model import rope_table
from tileinfer.plugins.reference.attention import ReferenceAttention
from tileinfer.plugins.triton.attention import TritonAttention
from tileinfer.registry import build_registry

PAGE = 16
STORES = ["paged", "paged_int8"]
# (cached positions, new tokens): prefills across a page, the second one in two q blocks (74 rows of 64)
# after a prefix that is not page-aligned; decode and verify sizes
STEPS = [(0, 20), (40, 1), (37, 2), (50, 9), (47, 16), (30, 37)]
CPU_SPEC = AttentionSpec(num_heads=4, num_kv_heads=2, head_dim=32, rms_norm_eps=1e-6)
QWEN3_4B = AttentionSpec(num_heads=32, num_kv_heads=8, head_dim=128, rms_norm_eps=1e-6)


@pytest.fixture(scope="module")
def registry():
    return build_registry()


@pytest.fixture(scope="module")
def checked() -> dict:
    """The stores of each ``check_layer`` run with the default options, by ``(store, start, t,
    causal)``: a later test of the same run takes them instead of running it again."""
    return {}


def filled_stores(registry, name: str, spec: AttentionSpec, dtype: torch.dtype, start: int, t: int, seed: int):
    """Two stores of ``name`` holding the same ``start`` cached positions (random keys and values
    written through ``KVStore.write``) and room for a step of ``t``, through the same shuffled
    block table; the pages are poisoned first (NaN, or -128 with NaN scales for int8), so that a
    read of a slot nobody wrote shows."""
    g = torch.Generator().manual_seed(seed)
    num_pages = -(-(start + t) // PAGE) + 3
    geometry = KVGeometry(1, spec.num_kv_heads, spec.head_dim, PAGE, num_pages, dtype)
    k_norm = torch.rand(spec.head_dim, generator=g).add(0.5).to(DEVICE, dtype)
    table = torch.randperm(num_pages, generator=g).to(torch.int32)
    k, v = (torch.randn(start, spec.num_kv_heads, spec.head_dim, generator=g).to(DEVICE, dtype) for _ in range(2))
    stores = []
    for _ in range(2):
        store = registry.get("kv_store", name)(geometry, DEVICE, key_norm_weights=[k_norm])
        for pages in (store.k, store.v, getattr(store, "k_scale", None), getattr(store, "v_scale", None)):
            if pages is not None:
                pages.fill_(float("nan") if pages.is_floating_point() else -128)
        store.reserve(start + t)
        store.block_table.copy_(table)
        if start:
            store.write(0, torch.arange(start, device=DEVICE), k, v)
        stores.append(store)
    return stores, k_norm


def check_layer(registry, name, spec, dtype, start, t, causal, tol, options=None):
    """The step ``(start, t)`` through both attentions, each into its own store; the Triton one
    with ``options`` over its defaults."""
    seed = 7 * start + t
    stores, k_norm = filled_stores(registry, name, spec, dtype, start, t, seed)
    g = torch.Generator().manual_seed(seed + 1)
    q_w = torch.rand(spec.head_dim, generator=g).add(0.5).to(DEVICE, dtype)
    rope = rope_table(spec.head_dim, 1e6, start + t, torch.device(DEVICE))
    kw = dict(layer=0, q_norm_weight=q_w, k_norm_weight=k_norm, rope=rope)
    attentions = (TritonAttention(spec, **kw, options={"pdl": True, "fuse_inputs": True, "attend": "paged",
                                                       **(options or {})}),
                  ReferenceAttention(spec, **kw, options={"scores": "materialized"}))
    qkv = torch.randn(t, spec.qkv_size, generator=g).to(DEVICE, dtype)
    step = Step.at(start, t, torch.device(DEVICE), causal=causal)
    got, expected = (attn(qkv, step, store) for attn, store in zip(attentions, stores))
    assert got.shape == (t, spec.num_heads * spec.head_dim) and got.dtype == dtype
    torch.testing.assert_close(got, expected, atol=tol, rtol=tol)
    return stores


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "non-causal"])
@pytest.mark.parametrize("start,t", STEPS, ids=[f"start{s}-t{t}" for s, t in STEPS])
@pytest.mark.parametrize("name", STORES)
def test_triton_attention_matches_the_reference(registry, checked, name, start, t, causal):
    checked[name, start, t, causal] = check_layer(registry, name, CPU_SPEC, torch.float32, start, t, causal, 2e-5)


def same_pages(a, b) -> bool:
    return all(torch.equal(x, y) if not x.is_floating_point() else torch.equal(x.nan_to_num(), y.nan_to_num())
               for x, y in zip((a.k, a.v, a.k_scale, a.v_scale), (b.k, b.v, b.k_scale, b.v_scale)))


@pytest.mark.parametrize("start,t", [(0, 20), (47, 16)], ids=["prefill", "verify"])
def test_int8_pages_with_the_ablation_options(registry, checked, start, t):
    """The per-op input chain (``write_kv_int8``) writes the fused kernel's bits, and the dense
    attention (the query smoothed, the store's dequantized pages) reads them as the kernels do."""
    fused = checked.get(("paged_int8", start, t, False))  # test_triton_attention_matches_the_reference's run
    fused_store, _ = fused or check_layer(registry, "paged_int8", CPU_SPEC, torch.float32, start, t, False, 2e-5)
    for options in ({"fuse_inputs": False}, {"attend": "dense"}):
        triton_store, _ = check_layer(registry, "paged_int8", CPU_SPEC, torch.float32, start, t, False, 2e-5, options)
        assert same_pages(triton_store, fused_store), options


def test_int8_pages_are_the_store_writes_within_a_step(registry):
    """Against ``PagedInt8KVStore.write`` of the reference attention's keys (which may be an ulp
    off the kernels' after the norm and RoPE): the same int8 values but for a few rounded the other
    way, the same scales within that ulp."""
    triton_store, ref_store = check_layer(registry, "paged_int8", CPU_SPEC, torch.float32, 37, 9, True, 2e-5)
    for pages in ("k", "v"):
        a, b = (gather_pages(getattr(st, pages)[0], st.block_table, 46)[37:] for st in (triton_store, ref_store))
        assert (a.int() - b.int()).abs().max() <= 1 and (a == b).float().mean() > 0.98
    for scales in ("k_scale", "v_scale"):
        a, b = (gather_pages(getattr(st, scales)[0], st.block_table, 46)[37:] for st in (triton_store, ref_store))
        torch.testing.assert_close(a, b, atol=0, rtol=2e-6)
@pytest.mark.gpu
@pytest.mark.parametrize("name", STORES)
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "non-causal"])
@pytest.mark.parametrize("start,t", [(0, 1024), (1000, 1), (1000, 16), (4000, 15), (32768, 1), (32768, 16)])
def test_triton_attention_matches_the_reference_gpu(registry, name, start, t, causal):
    check_layer(registry, name, QWEN3_4B, torch.bfloat16, start, t, causal, 3.2e-2)


# -- the engine: attention=triton with kv_store=paged_int8 -----------------------------------------

# 18 tokens (a prefill across a page), repetitive: n-gram drafts give verify steps
PROMPT = [(7 * i) % 23 + 40 for i in range(9)] * 2


def greedy(folder, *sources, **keys):
    import tileinfer

    engine = tileinfer.Engine.from_config("eager", *sources, model=str(folder), device=DEVICE, dtype="float32",
                                          kv_page_size=16, kv_store="paged_int8", progress=False, **keys)
    return engine.generate(PROMPT, max_new_tokens=10)


def test_the_engine_runs_the_triton_attention_over_int8_pages(checkpoint_factory):
    """Prefill, decode and verify steps (n-gram drafts) over int8 pages: the reference attention's
    greedy tokens (float32; the int8 pages differ at most where a key is an ulp off after the norm
    and RoPE). Without a proposer: test_triton_options.py's
    test_the_triton_attention_reads_int8_pages_as_the_reference_does."""
    folder = checkpoint_factory(heads=4, kv_heads=2, head_dim=32, hidden=64, layers=2)
    keys = dict(proposer="ngram", spec_k=3)
    expected = greedy(folder, "reference", **keys)
    got = greedy(folder, {"attention": "triton", "linear": "reference"}, **keys)
    assert got.token_ids == expected.token_ids
    assert got.stats.drafted_tokens > 0


def test_a_head_size_the_kernels_do_not_take_is_one_error_at_load(checkpoint_factory):
    folder = checkpoint_factory(head_dim=40)
    with pytest.raises(ConfigError, match="attention=triton cannot run this model: its head_dim 40 is not a power "
                                          "of two >= 16"):
        tileinfer.Engine.from_config(model=str(folder), device="cpu", dtype="float32", attention="triton",
                                     progress=False)


@pytest.mark.parametrize("start,t", [(0, 20), (40, 1), (47, 16)], ids=["prefill", "decode", "verify"])
@pytest.mark.parametrize("name", STORES)
def test_write_kv_writes_what_a_call_writes(registry, name, start, t):
    """``Attention.write_kv`` (keys and values only, no attention) leaves the pages a whole call
    leaves, bit for bit, for the Triton and the reference attention and the base class's default."""
    spec, dtype = CPU_SPEC, torch.float32
    g = torch.Generator().manual_seed(3 * start + t)
    q_w = torch.rand(spec.head_dim, generator=g).add(0.5).to(DEVICE, dtype)
    qkv = torch.randn(t, spec.qkv_size, generator=g).to(DEVICE, dtype)
    rope = rope_table(spec.head_dim, 1e6, start + t, torch.device(DEVICE))
    step = Step.at(start, t, torch.device(DEVICE))

    class CallOnly(ReferenceAttention):  # a plugin with only __call__: the interface's default write_kv
        write_kv = tileinfer.interfaces.Attention.write_kv

    for cls, options in ((TritonAttention, {"pdl": False, "fuse_inputs": True, "attend": "paged"}),
                         (ReferenceAttention, {"scores": "fused"}), (CallOnly, {"scores": "fused"})):
        stores, k_norm = filled_stores(registry, name, spec, dtype, start, t, 11 * start + t)
        attention = cls(spec, layer=0, q_norm_weight=q_w, k_norm_weight=k_norm, rope=rope, options=options)
        attention(qkv, step, stores[0])
        assert attention.write_kv(qkv, step, stores[1]) is None
        for a, b in ((stores[0].k, stores[1].k), (stores[0].v, stores[1].v),
                     (getattr(stores[0], "k_scale", None), getattr(stores[1], "k_scale", None))):
            if a is not None:
                assert torch.equal(a.nan_to_num(-1.0) if a.is_floating_point() else a,
                                   b.nan_to_num(-1.0) if b.is_floating_point() else b), cls.__name__
