"""The stream-K schedule of the persistent GEMM (backends/triton/linear_gemm_streamk.py), reached
through ``linear`` with a ``stream_k`` tile config: its ranges (``streamk_ranges`` of linear_tiles.py)
cover every (tile, K step) once; against the twin (backends/reference/linear.py) on odd shapes with
fresh random inputs and NaN-poisoned outputs, with ranges that cover tiles in every way (one program
for all, ranges over several tiles, programs inside one tile, a tile over 3+ programs, more programs
than steps, whole waves first); its fused forms (residual, float32 logits) bit-identical to the
per-op chain on the same config; the same bits on every run, the counters back at 0; the configs it
refuses; the rule's choice (``gemm_config(..., stream_k=True)``); on a GPU the Qwen3 shapes, eager
and replayed from a CUDA graph.

The interpreter runs a grid's programs one after another: that is enough here, since no program
waits on another (the piece of a split tile that arrives last, whichever it is, adds the partials);
on a GPU they run at once and any of them may be last (the GPU cases)."""

from __future__ import annotations

import pytest
import torch

from tileinfer.backends.reference.linear import linear as ref_linear
from tileinfer.backends.triton.add import add
from tileinfer.backends.triton.interpreter import sms_of
from tileinfer.backends.triton.linear import GemmConfig, layer_counters, linear, rule_config
from tileinfer.backends.triton.linear_gemm_streamk import streamk_counters
from tileinfer.backends.triton.linear_tiles import counters_needed, gemm_config, streamk_pays, streamk_ranges

from ..kernel_checks import DEVICE, INTERPRETER_DTYPES, QWEN3_LINEARS, assert_close, generator, poisoned, randn

ODD = (72, 136)  # N, K: 3 column blocks of 32 (the last partial), 5 K steps (the last partial); rows TMA-aligned
# name: (T, programs, TMA) on 32 x 32 x 32 tiles; T = 40: 2 x 3 tiles of 5 steps, 30 steps
CASES = {
    "one-program": (40, 1, True),  # 5 whole tiles round-robin, then the last one whole: no split
    "spanning": (40, 4, True),  # ranges of 7-8 steps: each program over 2-3 tiles
    "inside-a-tile": (40, 13, True),  # ranges of 2-3 steps: programs inside one tile, tiles over 2-3 programs
    "every-step": (40, 64, True),  # more programs than steps: 30 ranges of one step, each tile over 5 programs
    "whole-waves": (70, 4, True),  # 3 x 3 tiles: 4 whole tiles round-robin, then 5 tiles' 25 steps over 4
    "pointers": (40, 13, False),  # inside-a-tile through pointers (no TMA descriptors)
}


def config(programs: int, tma: bool = True, **extra) -> GemmConfig:
    return GemmConfig(32, 32, 32, 2, 4, 2, persistent=True, tma=tma, stream_k=True, programs=programs, **extra)


def case_config(name: str) -> GemmConfig:
    return config(*CASES[name][1:])


def inputs(N: int, K: int, dtype: torch.dtype, *key, t: int):
    g = generator("streamk", t, N, K, dtype, *key)
    x = torch.randn(t, K, generator=g, device=DEVICE).to(dtype)
    w = (torch.randn(N, K, generator=g, device=DEVICE) / K**0.5).to(dtype)
    q = torch.randint(-128, 128, (N, K), generator=g, device=DEVICE, dtype=torch.int8)
    scale = (torch.rand(N, generator=g, device=DEVICE) + 0.5) / (K * 5461.5) ** 0.5
    r = (torch.randn(t, N, generator=g, device=DEVICE) * 4).to(dtype)
    return x, w, q, scale, r


def run(x, *weights, n: int, out_dtype=None, **kw) -> torch.Tensor:
    out = poisoned((x.shape[0], n), out_dtype or x.dtype)
    y = linear(x, *weights, out_dtype=out_dtype, out=out, **kw)
    assert y is out
    return y


def assert_equal(a: torch.Tensor, b: torch.Tensor) -> None:
    assert torch.equal(a, b), f"max diff {(a.float() - b.float()).abs().max().item()}"


# -- the schedule ---------------------------------------------------------------------------------------


def schedule(tiles: int, k_tiles: int, programs: int) -> list[list[tuple[int, int, int]]]:
    """Each program's (tile, first step, end step) pieces as the kernel walks them (whole tiles
    round-robin, then its range of the region), asserting what the kernel relies on: every (tile,
    step) taken once, ranges of q or q + 1 steps, each tile's pieces in program order (K order),
    workspace slots ``p + s`` unique and below ``programs + region tiles``, counters ``p_first``
    unique per split tile and below ``programs``."""
    dp_tiles, programs, q, r = streamk_ranges(tiles, k_tiles, programs)
    assert dp_tiles % programs == 0 and q >= 1 and 0 <= r < programs
    pieces, taken = [], []
    for p in range(programs):
        mine = [(t, 0, k_tiles) for t in range(p, dp_tiles, programs)]
        start = p * q + min(p, r)
        end = start + q + (p < r)
        for s in range(start // k_tiles, (end - 1) // k_tiles + 1):
            mine.append((dp_tiles + s, max(start - s * k_tiles, 0), min(end - s * k_tiles, k_tiles)))
        pieces.append(mine)
        taken += [(t, k) for t, lo, hi in mine for k in range(lo, hi)]
    assert sorted(taken) == [(t, k) for t in range(tiles) for k in range(k_tiles)]
    owners = {}
    for p, mine in enumerate(pieces):
        for t, lo, hi in mine:
            owners.setdefault(t, []).append((lo, p))
    slots, counters = set(), set()
    for t, found in owners.items():
        assert [lo for lo, _ in found] == sorted(lo for lo, _ in found)  # program order is K order
        if len(found) > 1:
            s, first = t - dp_tiles, found[0][1]
            assert s >= 0 and first not in counters and first < programs
            counters.add(first)
            for _, p in found:
                assert p + s not in slots and p + s < programs + tiles - dp_tiles
                slots.add(p + s)
    return pieces


@pytest.mark.parametrize("tiles,k_tiles,programs", [(80, 152, 132), (80, 64, 132), (160, 152, 132), (320, 40, 132),
                                                    (608, 40, 132), (264, 10, 132), (6, 5, 13), (9, 5, 4), (1, 1, 7),
                                                    (7, 3, 2), (5, 2, 64)])
def test_ranges_take_every_step_once(tiles, k_tiles, programs):
    steps = [sum(hi - lo for _, lo, hi in mine) for mine in schedule(tiles, k_tiles, programs)]
    assert max(steps) - min(steps) <= 1


def test_the_cases_cover_tiles_in_every_way():
    """What each interpreter case is named for holds of its schedule."""
    def shape(name):
        t, programs, _ = CASES[name]
        return schedule(-(-t // 32) * 3, 5, programs)

    split = lambda pieces: {t for mine in pieces for t, lo, hi in mine if hi - lo < 5}  # noqa: E731
    assert not split(shape("one-program"))
    assert all(len(mine) >= 2 for mine in shape("spanning")) and split(shape("spanning"))
    inside = shape("inside-a-tile")
    assert len(inside) == 13 and any(len(mine) == 1 and 0 < mine[0][1] and mine[0][2] < 5 for mine in inside)
    assert any(sum(t == tile for mine in inside for t, _, _ in mine) == 3 for tile in range(6))
    assert len(shape("every-step")) == 30
    assert all(sum(t == tile for mine in shape("every-step") for t, _, _ in mine) == 5 for tile in range(6))
    assert streamk_ranges(9, 5, 4)[0] == 4 and split(shape("whole-waves"))


# -- against the twin, fused against the chain ----------------------------------------------------------


@pytest.mark.parametrize("dtype", INTERPRETER_DTYPES, ids=str)
@pytest.mark.parametrize("name", list(CASES))
def test_matches_reference(name, dtype):
    t = CASES[name][0]
    N, K = ODD
    x, w, _, _, _ = inputs(N, K, dtype, "plain", name, t=t)
    assert_close(run(x, w, n=N, config=case_config(name)), ref_linear(x, w))


@pytest.mark.parametrize("name", list(CASES))
def test_fused_forms_bit_identical_to_per_op(name):
    """Residual: the plain call, then add; float32 logits: the plain call's accumulator unrounded
    (rounded, the plain output). The split points are the config's and the shape's, so every
    epilogue sums each element in the same groups."""
    t = CASES[name][0]
    dtype = torch.float16
    N, K = ODD
    x, w, _, _, r = inputs(N, K, dtype, "fused", name, t=t)
    cfg = case_config(name)
    plain = run(x, w, n=N, config=cfg)
    assert_equal(run(x, w, n=N, config=cfg, residual=r), add(plain, r))
    logits = run(x, w, n=N, config=cfg, out_dtype=torch.float32)
    assert_equal(logits.to(dtype), plain)
    assert_close(logits, ref_linear(x, w, out_dtype=torch.float32), dtype=dtype)


@pytest.mark.parametrize("name", ["inside-a-tile", "whole-waves", "pointers"])
def test_int8_and_scaled_weights(name):
    """W8A16 (int8 rows of 136 bytes: pointers) and a model-dtype weight with row scales (the
    dequantized path's arithmetic), each against its twin; the residual form against the chain."""
    t = CASES[name][0]
    N, K = ODD
    x, w, q, scale, r = inputs(N, K, torch.float16, "int8", name, t=t)
    cfg = case_config(name)
    plain = run(x, q, scale, n=N, config=cfg)
    assert_close(plain, ref_linear(x, q, scale))
    assert_equal(run(x, q, scale, n=N, config=cfg, residual=r), add(plain, r))
    assert_close(run(x, w, scale, n=N, config=cfg), ref_linear(x, w, scale))


def test_int8_weights_through_tma():
    """K = 96: int8 rows of 96 bytes, so the int8 tiles arrive through a TMA descriptor too."""
    x, _, q, scale, _ = inputs(64, 96, torch.float16, "int8-tma", t=40)
    assert_close(run(x, q, scale, n=64, config=config(5)), ref_linear(x, q, scale))


def test_an_m_tail_and_a_row_slice():
    """70 rows (the last block of 6) of x, a column slice of a wider buffer; K = 100 (a masked last
    K step, pointers)."""
    dtype = torch.float16
    wide, w, _, _, _ = inputs(96, 136, dtype, "strided", t=70)
    x, w = wide[:, 8:104], w[:, :96].contiguous()
    assert_close(run(x, w, n=96, config=config(7)), ref_linear(x, w))
    x2, w2, _, _, _ = inputs(80, 100, dtype, "odd-k", t=70)
    assert_close(run(x2, w2, n=80, config=config(11)), ref_linear(x2, w2))


# -- runs, counters, refusals -----------------------------------------------------------------------------


def test_runs_are_reproducible_and_leave_the_counters_at_zero():
    """One counters tensor for every launch: each split tile's last piece resets its counter."""
    x, w, _, _, r = inputs(*ODD, torch.float16, "repeat", t=40)
    cfg = case_config("inside-a-tile")
    first = run(x, w, n=ODD[0], config=cfg)
    counters = torch.zeros(streamk_counters(40, ODD[0], ODD[1], cfg, 132), dtype=torch.int32, device=DEVICE)
    assert counters.numel() == 13
    for residual in (None, r, None):
        y = run(x, w, n=ODD[0], config=cfg, residual=residual, counters=counters)
        assert not counters.any()
    assert_equal(y, first)
    with pytest.raises(AssertionError, match="stream-K needs 13 int32 counters"):
        linear(x, w, config=cfg, counters=counters[:12])


def test_config_refusals():
    with pytest.raises(AssertionError, match="stream_k need persistent"):
        GemmConfig(32, 32, 32, 2, 4, 2, stream_k=True)
    for option in (dict(split_rows=1), dict(swap_ab=True), dict(flatten=True)):
        with pytest.raises(AssertionError, match=f"stream_k and {next(iter(option))} exclude each other"):
            config(4, **option)
    x, w, _, _, _ = inputs(64, 96, torch.float16, "swiglu", t=40)
    with pytest.raises(AssertionError, match="stream-K has no SwiGLU"):
        linear(x, w, swiglu=True, config=config(4))


# -- the rule ----------------------------------------------------------------------------------------------


def test_the_rule_takes_stream_k_where_whole_tiles_leave_sms_idle():
    """Qwen3-4B's o_proj and down at T = 1,024 (80 tiles of 128 x 256 for 132 SMs): the stream-K form
    of the rule's tile, not flattened; without the option, or where the tiles fill their waves, or
    for the fused SwiGLU or the transposed W8A16 tiles, the plain persistent one."""
    for N, K in (QWEN3_LINEARS["4B.o_proj"], QWEN3_LINEARS["4B.down"]):
        plain = gemm_config(1024, N, K, 132, tma=True)
        cfg = gemm_config(1024, N, K, 132, tma=True, stream_k=True)
        assert plain.persistent and plain.flatten and not plain.stream_k
        assert cfg == GemmConfig(plain.block_m, plain.block_n, plain.block_k, 8, plain.num_warps, plain.num_stages,
                                 persistent=True, tma=True, stream_k=True)
        assert not gemm_config(1024, N, K, 132, stream_k=True).persistent  # no TMA: the tiled GEMM
        assert not gemm_config(1024, N, K, 132, tma=True, int8=True, stream_k=True).stream_k
    N, K = QWEN3_LINEARS["4B.gate_up"]
    assert not gemm_config(1024, N, K, 132, tma=True, swiglu=True, stream_k=True).stream_k
    assert not streamk_pays(1536, 2816, 4096, 128, 256, 64, 1.22, 132)  # 132 tiles: one full wave
    assert streamk_pays(1024, 2560, 9728, 128, 256, 64, 1.22, 132)


def test_counters_for_stream_k_are_one_per_sm():
    N, K = QWEN3_LINEARS["4B.down"]
    assert counters_needed(N, K, 132) == 0 and counters_needed(N, K, 132, stream_k=True) == 132
    w = torch.empty(N, 64, dtype=torch.float16, device=DEVICE)
    counters = layer_counters(w, stream_k=True)
    assert counters.dtype == torch.int32 and counters.numel() == sms_of(w.device) and not counters.any()


def test_the_sweep_times_stream_k_candidates():
    """``bench kernels linear --sweep``'s BF16 candidates hold the stream-K forms of the rule's two
    persistent tiles, described with ``tma`` (the word ``bench check gemm`` filters on) and
    ``stream_k``; the W8A16 ones (transposed) none."""
    from bench.kernels import linear as module

    for name in ("4B.o_proj", "4B.down"):
        configs = [c for c in module.sweep_configs(*QWEN3_LINEARS[name], 1024, 132, "bf16") if c.stream_k]
        assert {(c.block_n, c.num_stages) for c in configs} == {(256, 3), (128, 4)}
        assert all("tma" in module.describe(c.__dict__) and "stream_k" in module.describe(c.__dict__) for c in configs)
        assert not any(c.stream_k for c in module.sweep_configs(*QWEN3_LINEARS[name], 1024, 132, "int8"))


# -- GPU: bfloat16 at the real shapes ---------------------------------------------------------------------


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


GPU_TILES = {"128x256": (128, 256, 64, 8, 8, 3), "128x128": (128, 128, 64, 8, 8, 4)}  # the rule's persistent ones


@pytest.mark.gpu
@pytest.mark.parametrize("T", [1024, 4096])
@pytest.mark.parametrize("tile", list(GPU_TILES))
@pytest.mark.parametrize("name", ["4B.o_proj", "4B.down"])
def test_gpu_streamk_is_deterministic_and_graphable(name, tile, T):
    """The stream-K form of the BF16 rule's persistent tiles with the decoder's residual: the same
    bits over many runs, eager and replayed from a CUDA graph (TMA descriptors, the workspace from
    the graph's pool, the layer's counters); fused == per-op; close to the twin; float32 logits
    rounded = the plain output. The rule's own choice at T = 1,024 among them."""
    N, K = QWEN3_LINEARS[name]
    x, w, _, _, _ = inputs(N, K, torch.bfloat16, "gpu-streamk", name, t=T)
    r = randn((T, N), torch.bfloat16, generator("gpu-streamk-r", name))
    cfg = GemmConfig(*GPU_TILES[tile], persistent=True, tma=True, stream_k=True)
    if T == 1024:
        assert rule_config(x, w, stream_k=True) == GemmConfig(*GPU_TILES["128x256"], persistent=True, tma=True,
                                                              stream_k=True)
    counters = layer_counters(w, stream_k=True)
    first = linear(x, w, residual=r, config=cfg, counters=counters)
    plain = linear(x, w, config=cfg, counters=counters)
    assert_equal(first, add(plain, r))
    assert_equal(linear(x, w, config=cfg, out_dtype=torch.float32).to(torch.bfloat16), plain)
    assert rel_err(plain, ref_linear(x, w)) < 4e-3
    out = poisoned((T, N), torch.bfloat16)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        linear(x, w, residual=r, config=cfg, out=out, counters=counters)
    for _ in range(20):
        assert_equal(linear(x, w, residual=r, config=cfg, counters=counters), first)
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert_equal(out, first)
    assert not counters.any()
