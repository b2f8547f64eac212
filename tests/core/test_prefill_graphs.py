"""Prefill chunks replayed from CUDA graphs, one per length bucket (core/prefill_graphs.py).

On a CPU a stand-in capture (``rerun_capture`` of tests/core/device_loop.py) re-runs each captured step on
replay with the capture's host ``start`` and whatever the static buffers hold then, so an
implementation that takes a chunk's start from the host, or a chunk's tokens or last row from
anything but the buffers, gives other logits here. Float32, pages of 16 positions, the reference
implementations and the Triton kernels (interpreter). Checked: the bucket rule and its padding
bound; logits, keys and values and greedy tokens equal to the eager prefill's, chunked or not,
INT8 pages too; one graph serving every length of its bucket at every start; a proposer handed
the real rows only; the padding dropped from the KV store; the cap on graphs and the KV capacity
sending a chunk to another bucket or to the eager path; graphs captured up front; the report; each
step runner prefilling from its own graphs. On a GPU (marked): greedy tokens after graphed
prefills equal the eager ones, real CUDA graphs.
"""

from __future__ import annotations

import pytest
import torch

import tileinfer
from conftest import DEVICE
from device_loop import rebuild, rerun_capture
from test_steps import VARIANTS
from tileinfer.decode_plan import DecodePlan
from tileinfer.decoding import Decoder
from tileinfer.interfaces import Draft, Proposer, ProposerContext
from tileinfer.prefill import chunked_prefill
from tileinfer.prefill_graphs import PrefillGraphs, bucket_for
from tileinfer.steps import StepRunner

MODEL = dict(hidden=64, layers=2, vocab=320, intermediate=128, std=0.2, tokenizer=False, heads=4, kv_heads=2,
             head_dim=32, seed=5)
# The Triton kernels under the interpreter cost seconds a step, growing with the weight rows.
TRITON_MODEL = dict(MODEL, hidden=32, heads=2, kv_heads=1, head_dim=16, intermediate=48)
PAGE = 16


def prompt(n: int, seed: int = 11) -> list[int]:
    return torch.randint(0, 320, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.fixture(scope="module")
def folder(checkpoint_factory):
    return checkpoint_factory(**MODEL)


def build(folder, variant: str = "reference", **keys) -> tileinfer.Engine:
    """Every prompt prefilled from position 0 (no prefix reuse: the buckets are the prompts')."""
    return tileinfer.Engine.from_config(*VARIANTS[variant], model=str(folder), device=DEVICE, dtype="float32",
                                        kv_page_size=PAGE, progress=False, prefix_cache=False, **keys)


def graphed(engine: tileinfer.Engine) -> StepRunner:
    """The engine's steps replaced by stand-in graphs (decode and prefill), its decoder otherwise as built."""
    return rebuild(engine, engine.decoder.plan, step_capture=rerun_capture).decoder.steps


def prefill(engine: tileinfer.Engine, ids: list[int], chunk: int, graphs) -> tuple[torch.Tensor, list]:
    """The logits after ``ids`` and the prompt's keys and values, from a fresh KV store."""
    engine.kv.reset()
    forward = engine.decoder.steps.forward_pass
    logits = chunked_prefill(forward, engine.kv, ids, chunk=chunk, graphs=graphs).clone()
    assert engine.kv.length == len(ids)
    cache = [tuple(t.clone() for t in engine.kv.gather(layer, len(ids))) for layer in range(len(engine.model.layers))]
    return logits, cache


def assert_same_prefill(a, b) -> None:
    (logits, cache), (logits0, cache0) = a, b
    torch.testing.assert_close(logits, logits0, atol=1e-5, rtol=1e-5)
    for pair, pair0 in zip(cache, cache0):
        for t, t0 in zip(pair, pair0):
            torch.testing.assert_close(t, t0, atol=1e-5, rtol=1e-5)


def test_buckets_pad_by_less_than_a_quarter_above_512():
    """Chunks of up to 16 tokens (a decode or verify step's length) are not padded."""
    assert [bucket_for(n, 4096) for n in (1, 2, 16, 17, 31, 32, 33, 100, 512, 513, 640, 641, 1000, 1024, 1025, 4000,
                                          4096)] == [
        1, 2, 16, 32, 32, 32, 64, 128, 512, 640, 640, 768, 1024, 1024, 1280, 4096, 4096]
    assert bucket_for(5000, 32768) == 5120 and bucket_for(30000, 32768) == 32768 and bucket_for(40, 40) == 40
    for n in range(1, 9000):
        b = bucket_for(n, 8192 if n <= 8192 else n)
        assert n <= b <= max(n, 8192)
        assert b - n < (max(32, n) if n <= 512 else n / 4), (n, b)
    assert len({bucket_for(n, 4096) for n in range(1, 4097)}) == 16 + 17
    with pytest.raises(ValueError, match="1 to 64 tokens"):
        bucket_for(65, 64)


@pytest.mark.parametrize("variant, n, chunk, buckets", [("reference", 90, 30, [30]), ("reference", 90, 64, [32, 64]),
                                                        ("reference", 90, 4096, [128]), ("triton", 37, 20, [20])])
def test_graphed_prefill_gives_the_eager_logits_cache_and_tokens(checkpoint_factory, variant, n, chunk, buckets):
    """90 tokens: chunks of 30 replay bucket 30 at starts 0, 30 and 60; chunks of 64 take buckets
    64 and 32 (26 real tokens); one chunk takes bucket 128 (38 padded rows). The Triton kernels
    (interpreter; the logits and the cache only; a narrower model, GQA 2 / 1 heads of 16): 37 tokens
    in chunks of 20 replay bucket 20 at starts 0 and 20, the second with 3 padded rows."""
    folder = checkpoint_factory(**(TRITON_MODEL if variant == "triton" else MODEL))
    engine = build(folder, variant, max_new_tokens=12, prefill_chunk=chunk)
    ids = prompt(n)
    eager_tokens = engine.generate(ids).token_ids if variant == "reference" else None
    eager = prefill(engine, ids, chunk, None)
    steps = graphed(engine)
    assert_same_prefill(prefill(engine, ids, chunk, steps.prefill_graphs), eager)
    assert sorted(steps.prefill_graphs.graphs) == buckets
    if eager_tokens is not None:
        assert engine.generate(ids).token_ids == eager_tokens


def test_one_graph_serves_every_length_of_its_bucket(folder):
    engine = build(folder)
    graphs = graphed(engine).prefill_graphs
    for n in (33, 64, 47, 40):  # bucket 64: captured at 33 real tokens, replayed with the others
        ids = prompt(n, seed=n)
        assert_same_prefill(prefill(engine, ids, 4096, graphs), prefill(engine, ids, 4096, None))
    assert sorted(graphs.graphs) == [64]


def test_a_start_read_from_the_host_is_caught(folder, monkeypatch):
    """The stand-in is strict enough: an attention that takes the host start gets the chunks replayed
    at other starts wrong."""
    engine = build(folder)
    ids = prompt(90)
    eager = prefill(engine, ids, 30, None)
    from tileinfer.plugins.reference import attention

    def stale(q, step, kv, layer, scale, fused=None):  # reads the host start, as eager code may
        keys, values = kv.gather(layer, step.start + step.num_tokens)
        return attention.causal_attention(q, keys, values, step.start, scale)

    monkeypatch.setattr(attention, "dense_attention", stale)
    logits, _ = prefill(engine, ids, 30, graphed(engine).prefill_graphs)
    assert (logits - eager[0]).abs().max() > 1e-3


class Recording(Proposer):
    """Drafts nothing; records the hidden states of each prompt chunk."""

    hidden_layers = (0, 1)

    def __init__(self, context: ProposerContext) -> None:
        super().__init__(context)
        self.chunks: list[tuple[list[int], int, dict[int, torch.Tensor]]] = []

    def prompt_chunk(self, tokens, start, hidden):
        self.chunks.append((tokens, start, {n: h.clone() for n, h in hidden.items()}))

    def propose(self, tokens, k):
        return Draft([])


@pytest.mark.parametrize("chunk", [30, 64])
def test_a_proposer_gets_the_real_rows_only(folder, chunk):
    engine = build(folder)
    ids = prompt(90)

    def run(steps) -> Recording:
        recording = Recording(ProposerContext(engine.model, engine.sampler, engine.config, engine.registry))
        decoder = Decoder(steps, engine.sampler, DecodePlan("host", spec_k=3, proposer=recording), prefill_chunk=chunk)
        list(decoder.run(ids, 2, ()))
        return recording

    forward = engine.decoder.steps.forward_pass
    eager = run(StepRunner(forward, engine.kv, Recording.hidden_layers))
    steps = StepRunner(forward, engine.kv, Recording.hidden_layers, capture=rerun_capture)
    replayed = run(steps)
    assert steps.prefill_graphs.graphs and [(t, s) for t, s, _ in replayed.chunks] == [
        (t, s) for t, s, _ in eager.chunks]
    for (tokens, _, hidden), (_, _, hidden0) in zip(replayed.chunks, eager.chunks):
        for n in (0, 1):
            assert hidden[n].shape == (len(tokens), 64)
            torch.testing.assert_close(hidden[n], hidden0[n], atol=1e-5, rtol=1e-5)


def test_the_padding_is_dropped_from_the_kv_store(folder):
    """Bucket 128 for 90 tokens: 8 pages reserved while the chunk runs, 6 kept after it."""
    engine = build(folder)
    graphs = graphed(engine).prefill_graphs
    kv, pages = engine.kv, engine.kv.geometry.num_pages
    reserved = []
    run = graphs.run

    def spied(*args, **kw):
        out = run(*args, **kw)
        reserved.append((kv.length, pages - len(kv._free)))
        return out

    graphs.run = spied
    prefill(engine, prompt(90), 4096, graphs)
    assert reserved == [(128, 8)] and (kv.length, pages - len(kv._free)) == (90, 6)


@pytest.mark.parametrize("keys", [{"kv_store": "paged_int8"}, {"options": {"reference": {"scores": "materialized"}}}],
                         ids=["int8-kv", "materialized-scores"])
def test_the_other_reference_paths(folder, keys):
    engine = build(folder, max_new_tokens=12, prefill_chunk=30, **keys)
    ids = prompt(80)  # chunks 30, 30 and 20, the last padded to 30
    eager_tokens = engine.generate(ids).token_ids
    eager = prefill(engine, ids, 30, None)
    graphs = graphed(engine).prefill_graphs
    assert_same_prefill(prefill(engine, ids, 30, graphs), eager)
    assert engine.generate(ids).token_ids == eager_tokens and sorted(graphs.graphs) == [30]


def test_padding_past_the_kv_capacity_runs_eagerly(folder):
    engine = build(folder, max_new_tokens=4, kv_capacity=96)
    ids = prompt(90)
    eager_tokens = engine.generate(ids).token_ids
    steps = graphed(engine)
    assert engine.generate(ids).token_ids == eager_tokens
    assert steps.prefill_graphs.graphs == {}  # bucket 128 > 96 positions
    assert engine.generate(ids[:60]).token_ids == build(folder, max_new_tokens=4, kv_capacity=96).generate(
        ids[:60]).token_ids
    assert sorted(steps.prefill_graphs.graphs) == [64]


def test_past_the_cap_a_chunk_takes_a_larger_captured_bucket_or_runs_eagerly(folder):
    engine = build(folder)
    graphs = PrefillGraphs(engine.decoder.steps.forward_pass, engine.kv, capture=rerun_capture, max_graphs=1)
    for n, captured in ((40, [64]), (20, [64]), (100, [64])):  # 20 replays bucket 64, 100 runs eagerly
        ids = prompt(n, seed=n)
        assert_same_prefill(prefill(engine, ids, 4096, graphs), prefill(engine, ids, 4096, None))
        assert sorted(graphs.graphs) == captured
    assert graphs.bucket(20, 0, 4096) == 64 and graphs.bucket(100, 0, 4096) is None
    ids = prompt(5)  # a short chunk: its own bucket, not counted against the cap
    assert_same_prefill(prefill(engine, ids, 4096, graphs), prefill(engine, ids, 4096, None))
    assert sorted(graphs.graphs) == [5, 64] and graphs.bucket(20, 0, 4096) == 64


def test_graphs_captured_up_front(folder):
    engine = build(folder)
    steps = graphed(engine)
    steps.prefill_graphs.capture([32, 64])
    assert sorted(steps.prefill_graphs.graphs) == [32, 64] and engine.kv.length == 0
    ids = prompt(50)
    assert_same_prefill(prefill(engine, ids, 4096, steps.prefill_graphs), prefill(engine, ids, 4096, None))
    assert sorted(steps.prefill_graphs.graphs) == [32, 64]
    assert "2 prefill CUDA graphs (buckets [32, 64] tokens)" in steps.report()
    with pytest.raises(ValueError, match="does not fit"):
        steps.prefill_graphs.capture([engine.kv.capacity + 32])


def test_each_step_runner_prefills_from_its_own_graphs(folder):
    """The graphs belong to the runner that built them: an eager runner over the same store
    prefills eagerly, and the decoder prefills through its own runner."""
    engine = build(folder, max_new_tokens=4)
    ids = prompt(40)
    eager_tokens = engine.generate(ids).token_ids
    steps = graphed(engine)
    eager = StepRunner(steps.forward_pass, engine.kv)
    assert eager.prefill_graphs is None
    eager.prefill(ids, chunk=4096)
    assert steps.prefill_graphs.graphs == {}
    assert engine.generate(ids).token_ids == eager_tokens and sorted(steps.prefill_graphs.graphs) == [64]


@pytest.mark.gpu
@pytest.mark.parametrize("variant", ["triton", "triton-per-op", "reference"])
@pytest.mark.parametrize("keys", [{}, {"kv_store": "paged_int8"}, {"proposer": "ngram", "spec_k": 3}],
                         ids=["plain", "int8-kv", "ngram"])
def test_cuda_graphed_prefill_gives_the_eager_tokens_on_the_gpu(folder, variant, keys):
    """Real CUDA graphs: prompts of 5 to 300 tokens in chunks of 128 (buckets 5, 64 and 128, replayed
    at several starts, padded or not), float32."""
    graphs = build(folder, variant, cuda_graphs=True, prefill_chunk=128, max_new_tokens=16, **keys)
    eager = build(folder, variant, cuda_graphs=False, prefill_chunk=128, max_new_tokens=16, **keys)
    for n in (5, 40, 128, 200, 300):
        ids = prompt(n, seed=n)
        assert graphs.generate(ids).token_ids == eager.generate(ids).token_ids, n
    pg = graphs.decoder.steps.prefill_graphs
    assert sorted(pg.graphs) == [5, 64, 128], pg.report()
    assert "3 prefill CUDA graphs (buckets [5, 64, 128] tokens)" in graphs.decoder.steps.report()


@pytest.mark.gpu
@pytest.mark.parametrize("kv_store", ["paged", "paged_int8"])
def test_cuda_graphed_prefill_in_bfloat16_with_the_default_config(checkpoint_factory, kv_store):
    """The default config (bfloat16, Triton, CUDA graphs) at head_dim 128: the logits and the cache
    after graphed prefills of 1 to 1,000 tokens (chunks of 512: buckets 1 and 32 to 512, padded and
    replayed at other starts) are the eager prefill's, bit for bit. A chunk of up to 16 tokens is
    not padded: 32 rows would run the GEMM, not the eager step's GEMV, whose keys differ in the last
    bits. (Whole generations are not compared: a graphed decode step sizes its attention splits
    for the KV capacity, an eager one for the context, and bf16 near-ties then part.)"""
    folder = checkpoint_factory(heads=16, kv_heads=8, head_dim=128, hidden=256, layers=3, vocab=320,
                                max_positions=4096, std=0.1)
    engine = tileinfer.Engine.from_config(model=str(folder), progress=False, prefill_chunk=512, kv_store=kv_store,
                                          max_new_tokens=24)
    graphs = engine.decoder.steps.prefill_graphs
    for n in (1, 5, 16, 31, 100, 512, 700, 1000):
        ids = [(7 * i + n) % 300 for i in range(n)]
        (logits, cache), (logits0, cache0) = prefill(engine, ids, 512, graphs), prefill(engine, ids, 512, None)
        assert torch.equal(logits, logits0), n
        for pair, pair0 in zip(cache, cache0):
            assert all(torch.equal(t, t0) for t, t0 in zip(pair, pair0)), n
    assert sorted(graphs.graphs) == [1, 5, 16, 32, 128, 256, 512]


def test_the_graphs_do_not_keep_an_engine_alive(folder):
    """The store-to-graphs lookup holds neither: a dropped engine frees its KV pool."""
    import gc
    import weakref

    engine = build(folder)
    graphed(engine)
    kv = weakref.ref(engine.kv)
    del engine
    gc.collect()
    assert kv() is None
