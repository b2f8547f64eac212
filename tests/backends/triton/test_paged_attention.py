"""Paged prefill and split-KV decode attention (backends/triton/paged_attention.py) against the twin
(backends/reference/paged_attention.py: causal_attention over gather_pages of the same pages).

Every case builds a fresh pool whose pages start as NaN (so a read of a wrong page, of a slot past
the context or of an unreserved table entry shows up), a block table that is a random permutation
of the pool, and an output pre-filled with NaN. Without a GPU the kernels run under the Triton
interpreter on float16/float32 data with small head counts; the GPU cases use bfloat16 at
Qwen3-4B's attention shape (32 q heads, 8 kv heads, head_dim 128, page 64).
"""

from __future__ import annotations

import pytest
import torch

from tileinfer.backends.reference.kv_write import write_pages
from tileinfer.backends.reference.paged_attention import paged_attention
from tileinfer.backends.triton.paged_attention import (
    decode_splits,
    paged_decode_attention,
    paged_prefill_attention,
)

from ..kernel_checks import BF16, DEVICE, F16, F32, assert_close, poisoned

CPU_KV_HEADS = 2  # the kernels loop over kv heads; two are enough to catch a wrong head stride


def make_case(seed: int, t: int, start: int, group: int, head_dim: int, page_size: int, dtype: torch.dtype,
              kv_heads: int = CPU_KV_HEADS, spare_pages: int = 3):
    """Random q and a NaN-poisoned pool holding positions [0, start + t) through a permuted table."""
    gen = torch.Generator().manual_seed(seed)
    length = start + t
    num_pages = -(-length // page_size) + spare_pages
    k_pages = poisoned((num_pages, kv_heads, page_size, head_dim), dtype)
    v_pages = poisoned(k_pages.shape, dtype)
    block_table = torch.randperm(num_pages, generator=gen).to(torch.int32).to(DEVICE)
    positions = torch.arange(length, device=DEVICE)
    for pages in (k_pages, v_pages):
        values = torch.randn(length, kv_heads, head_dim, generator=gen).to(DEVICE, dtype)
        write_pages(pages, block_table, positions, values)
    q = torch.randn(t, kv_heads * group, head_dim, generator=gen).to(DEVICE, dtype)
    return q, k_pages, v_pages, block_table


def check(out: torch.Tensor, expected: torch.Tensor) -> None:
    """P is rounded to the K/V dtype before the P.V dot, and both outputs are rounded once."""
    assert_close(out, expected, "two_roundings")


def run_case(fn, seed, t, start, group, head_dim, page_size, dtype, kv_heads=CPU_KV_HEADS, **kw):
    q, k_pages, v_pages, block_table = make_case(seed, t, start, group, head_dim, page_size, dtype, kv_heads)
    scale = head_dim ** -0.5
    out = poisoned(q.shape, q.dtype)
    got = fn(q, k_pages, v_pages, block_table, start, scale, out=out, **kw)
    assert got is out
    check(out, paged_attention(q, k_pages, v_pages, block_table, start, scale, kw.get("causal", True)))


def case_id(case) -> str:
    return "-".join(str(x).replace("torch.", "") for x in case)


# -- decode (1..16 new tokens, split-KV) ------------------------------------------------------------

# (T, start, group, head_dim, page_size, num_splits, dtype); None = decode_splits(L).
DECODE_CASES = [
    (1, 1, 1, 64, 16, None, F32),      # L = 2
    (1, 15, 2, 64, 16, 3, F32),        # L = 16, one full page; two empty splits
    (1, 16, 4, 128, 16, 8, F16),       # L = 17, one key into the second page; seven empty splits
    (1, 100, 2, 128, 64, 1, F16),      # a partial second page, one split (no combine)
    (1, 1000, 4, 64, 64, 8, F32),      # 1,001 keys over 8 splits of 128
    (2, 17, 2, 64, 16, 1, F32),
    (2, 100, 1, 128, 64, 3, F16),
    (7, 15, 4, 64, 16, 8, F32),        # the new tokens straddle a page boundary
    (7, 100, 1, 64, 64, 8, F32),
    (7, 380, 2, 64, 16, 3, F16),       # the new tokens straddle a split boundary (384)
    (7, 1000, 2, 128, 64, None, F16),  # default: 7 splits
    (16, 16, 2, 128, 16, 3, F16),
    (16, 17, 4, 64, 64, 8, F32),       # 33 keys: one tile, seven empty splits
    (16, 100, 1, 64, 16, None, F32),   # default: 1 split (116 keys)
    (16, 1000, 4, 128, 16, 8, F16),    # 64 q rows
    (16, 1008, 2, 64, 64, 3, F32),     # L = 1,024, a multiple of the page size
]


@pytest.mark.parametrize("case", DECODE_CASES, ids=case_id)
def test_decode_matches_twin(case):
    t, start, group, head_dim, page_size, num_splits, dtype = case
    run_case(paged_decode_attention, 1000 + DECODE_CASES.index(case), t, start, group, head_dim, page_size,
             dtype, num_splits=num_splits)


# -- prefill ----------------------------------------------------------------------------------------

# (T, start, group, head_dim, page_size, dtype)
PREFILL_CASES = [
    (1, 0, 1, 64, 16, F32),
    (7, 0, 2, 64, 16, F32),
    (16, 0, 4, 128, 64, F16),
    (33, 0, 4, 64, 16, F32),     # 132 rows: two q blocks of 128
    (100, 0, 2, 128, 64, F16),
    (1, 100, 4, 128, 64, F16),
    (16, 15, 2, 128, 16, F32),
    (33, 64, 1, 128, 64, F16),   # a chunk after one full cached page
    (100, 37, 4, 64, 16, F32),   # after a prefix that is not page-aligned; unmasked and diagonal tiles
    (7, 1000, 2, 64, 64, F32),
]


@pytest.mark.parametrize("case", PREFILL_CASES, ids=case_id)
def test_prefill_matches_twin(case):
    t, start, group, head_dim, page_size, dtype = case
    run_case(paged_prefill_attention, 2000 + PREFILL_CASES.index(case), t, start, group, head_dim, page_size, dtype)


# -- non-causal steps (Step.causal=False: every query sees all start + T keys) ---------------------

# (T, start, group, head_dim, page_size, num_splits, dtype) for the decode kernels; the prefill
# kernel takes the same cases (num_splits ignored) and a prompt-sized one.
NON_CAUSAL_CASES = [
    (1, 40, 2, 64, 16, None, F32),
    (2, 17, 2, 64, 16, 3, F32),
    (5, 59, 4, 64, 16, 8, F16),       # the step straddles a tile boundary (64)
    (9, 100, 1, 128, 64, 1, F16),     # one split: the kernel normalizes itself
    (15, 300, 2, 64, 16, 3, F32),     # DFlash's block of 15 after a cached prefix
    (16, 1000, 4, 64, 64, None, F16),
]


@pytest.mark.parametrize("case", NON_CAUSAL_CASES, ids=case_id)
def test_non_causal_decode_matches_twin(case):
    t, start, group, head_dim, page_size, num_splits, dtype = case
    run_case(paged_decode_attention, 6000 + NON_CAUSAL_CASES.index(case), t, start, group, head_dim, page_size,
             dtype, num_splits=num_splits, causal=False)


@pytest.mark.parametrize("case", NON_CAUSAL_CASES + [(100, 37, 2, 64, 16, None, F32), (70, 0, 1, 64, 16, None, F16)],
                         ids=case_id)
def test_non_causal_prefill_matches_twin(case):
    t, start, group, head_dim, page_size, _, dtype = case
    run_case(paged_prefill_attention, 6100 + t + start, t, start, group, head_dim, page_size, dtype, causal=False)


def test_non_causal_differs_from_causal():
    """The flag reaches the kernels: with it off, the first query sees the step's later keys."""
    q, k_pages, v_pages, block_table = make_case(71, 6, 30, 2, 64, 16, F32)
    for fn in (paged_decode_attention, paged_prefill_attention):
        causal = fn(q, k_pages, v_pages, block_table, 30, 0.125)
        full = fn(q, k_pages, v_pages, block_table, 30, 0.125, causal=False)
        assert_close(full[-1], causal[-1])  # the last query sees all keys either way
        assert (full[0] - causal[0]).abs().max() > 1e-3


# -- layouts, defaults, contract ---------------------------------------------------------------------


@pytest.mark.parametrize("fn", [paged_prefill_attention, paged_decode_attention])
def test_strided_q_and_out(fn):
    """q and out as views into a fused [T, H + 2 Hkv, D] buffer (the qkv projection's layout)."""
    t, start, group, head_dim, hkv = 5, 40, 2, 64, CPU_KV_HEADS
    _, k_pages, v_pages, block_table = make_case(31, t, start, group, head_dim, 16, F32)
    h = hkv * group
    qkv = torch.randn(t, h + 2 * hkv, head_dim, generator=torch.Generator().manual_seed(32)).to(DEVICE)
    q = qkv[:, :h]
    out_buf = poisoned(qkv.shape, qkv.dtype)
    fn(q, k_pages, v_pages, block_table, start, 0.1, out=out_buf[:, :h])
    check(out_buf[:, :h], paged_attention(q, k_pages, v_pages, block_table, start, 0.1))
    assert out_buf[:, h:].isnan().all()


def test_allocates_output_and_agrees_across_splits():
    q, k_pages, v_pages, block_table = make_case(41, 3, 300, 2, 64, 16, F32)
    outs = [paged_decode_attention(q, k_pages, v_pages, block_table, 300, 0.125, num_splits=s) for s in (1, 2, 5)]
    outs.append(paged_prefill_attention(q, k_pages, v_pages, block_table, 300, 0.125))
    for out in outs:
        assert out.shape == q.shape and out.dtype == q.dtype
        assert_close(out, outs[0])


def test_bfloat16_runs_on_the_interpreter_too():
    """Under the interpreter bf16 tiles are cast to float32 after loading (its bf16 dot is wrong)."""
    run_case(paged_decode_attention, 51, 4, 70, 2, 64, 16, BF16, num_splits=2)
    run_case(paged_prefill_attention, 52, 20, 9, 4, 64, 16, BF16)


def test_decode_splits_rule():
    lengths = (1, 127, 128, 255, 256, 1024, 2047, 2048, 32768)
    assert [decode_splits(n) for n in lengths] == [1, 1, 1, 1, 2, 8, 15, 16, 16]
    assert [decode_splits(n, int8=True) for n in lengths] == [1, 1, 1, 1, 2, 8, 15, 16, 32]


def test_rejects_bad_inputs():
    q, k_pages, v_pages, block_table = make_case(61, 2, 40, 2, 64, 16, F32)  # L = 42: three pages
    with pytest.raises(AssertionError, match="int32"):
        paged_prefill_attention(q, k_pages, v_pages, block_table.long(), 40, 0.1)
    with pytest.raises(AssertionError, match="dtype"):
        paged_decode_attention(q.half(), k_pages, v_pages, block_table, 40, 0.1)
    with pytest.raises(AssertionError, match="block_table holds"):
        paged_decode_attention(q, k_pages, v_pages, block_table[:2], 40, 0.1)
    with pytest.raises(AssertionError, match="contiguous"):
        paged_prefill_attention(q.transpose(1, 2).contiguous().transpose(1, 2), k_pages, v_pages, block_table, 40, 0.1)
    q17 = torch.zeros(17, q.shape[1], q.shape[2], device=DEVICE)
    with pytest.raises(AssertionError, match="at most 16"):
        paged_decode_attention(q17, k_pages, v_pages, block_table, 40, 0.1)


# -- GPU: bfloat16 at Qwen3-4B's shape -----------------------------------------------------------------

QWEN3_4B = dict(group=4, head_dim=128, page_size=64, dtype=BF16, kv_heads=8)


@pytest.mark.gpu
@pytest.mark.parametrize("context", [1024, 8192, 32768])
@pytest.mark.parametrize("t", [1, 16])
@pytest.mark.parametrize("num_splits", [None, 1, 3, 8, 16])
def test_decode_qwen3_4b_gpu(context, t, num_splits):
    run_case(paged_decode_attention, 3000 + context + t + (num_splits or 0), t, context, **QWEN3_4B,
             num_splits=num_splits)


@pytest.mark.gpu
@pytest.mark.parametrize("start", [0, 1000, 4096])
@pytest.mark.parametrize("t", [1024, 100, 7])
def test_prefill_qwen3_4b_gpu(start, t):
    run_case(paged_prefill_attention, 4000 + start + t, t, start, **QWEN3_4B)


@pytest.mark.gpu
@pytest.mark.parametrize("start", [0, 1000, 32768])
@pytest.mark.parametrize("t", [1, 2, 15, 16, 100])
def test_non_causal_qwen3_4b_gpu(start, t):
    fns = [paged_prefill_attention] + ([paged_decode_attention] if t <= 16 else [])
    for fn in fns:
        run_case(fn, 4500 + start + t, t, start, **QWEN3_4B, causal=False)


@pytest.mark.gpu
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("group", [1, 2, 4, 8])
@pytest.mark.parametrize("page_size", [16, 64])
def test_gpu_geometries(head_dim, group, page_size):
    """The CPU cases' geometries compiled for the GPU (bf16, 8 kv heads)."""
    geo = dict(group=group, head_dim=head_dim, page_size=page_size, dtype=BF16, kv_heads=8)
    seed = 5000 + head_dim + 10 * group + page_size
    run_case(paged_prefill_attention, seed, 1024, 0, **geo)
    run_case(paged_prefill_attention, seed + 1, 33, 1000, **geo)
    for t in (1, 7, 16):
        run_case(paged_decode_attention, seed + 2 + t, t, 2000 + t, **geo, num_splits=None)
        run_case(paged_decode_attention, seed + 20 + t, t, 17, **geo, num_splits=8)


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "non-causal"])
@pytest.mark.parametrize("true_start", [1, 70, 200])
def test_decode_reads_the_start_from_the_positions_tensor(true_start, causal):
    """As a replayed CUDA graph does: the host start is that of the capture (0), only the device
    positions tensor holds the step's real start; the result must follow the tensor."""
    dtype = F32 if DEVICE == "cpu" else BF16
    t = 3
    q, k_pages, v_pages, block_table = make_case(true_start, t, true_start, 2, 64, 16, dtype)
    positions = torch.arange(true_start, true_start + t, device=DEVICE)
    out = poisoned(q.shape, q.dtype)
    paged_decode_attention(q, k_pages, v_pages, block_table, 0, 0.125, positions=positions, num_splits=8, out=out,
                           causal=causal)
    check(out, paged_attention(q, k_pages, v_pages, block_table, positions, 0.125, causal))


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "non-causal"])
@pytest.mark.parametrize("true_start", [1, 37, 200])
def test_prefill_reads_the_start_from_the_positions_tensor(true_start, causal):
    """As a replayed prefill graph does (core/prefill_graphs.py): the host start is the capture's
    (0), only the positions tensor holds the step's start; the result must follow the tensor."""
    dtype = F32 if DEVICE == "cpu" else BF16
    t = 40  # two q blocks at group 2: a fully seen tile before the diagonal ones from start 64 on
    q, k_pages, v_pages, block_table = make_case(true_start + 7, t, true_start, 2, 64, 16, dtype)
    positions = torch.arange(true_start, true_start + t, device=DEVICE)
    out = poisoned(q.shape, q.dtype)
    paged_prefill_attention(q, k_pages, v_pages, block_table, 0, 0.125, positions=positions, out=out,
                            causal=causal)
    check(out, paged_attention(q, k_pages, v_pages, block_table, true_start, 0.125, causal))


@pytest.mark.parametrize("n, bucket, start", [(20, 32, 0), (33, 64, 45), (1, 32, 100)])
def test_prefill_pad_rows_leave_the_real_rows_unchanged(n, bucket, start):
    """A padded prefill step (core/prefill_graphs.py): ``bucket`` query rows whose last ``bucket -
    n`` are padding, with the padding's keys and values written past the real ones. The real rows
    give no padded key any weight: they are the twin's over the real keys alone, and bit for bit
    the same whatever finite values the padding holds (the diagonal tiles load them and mask the
    scores, so 0 x value: finite, as the model's keys and values of a token in the vocabulary are)."""
    dtype = F32 if DEVICE == "cpu" else BF16
    q, k_pages, v_pages, block_table = make_case(900 + n, bucket, start, 2, 64, 16, dtype)
    positions = torch.arange(start, start + bucket, device=DEVICE)
    padded = paged_prefill_attention(q, k_pages, v_pages, block_table, start, 0.125, positions=positions)
    check(padded[:n], paged_attention(q[:n], k_pages, v_pages, block_table, start, 0.125))
    for pages, value in ((k_pages, 3e4), (v_pages, -3e4)):  # padding far off the real keys' scale
        slots = positions[n:]
        pages[block_table[slots // 16].long(), :, slots % 16] = value
    again = paged_prefill_attention(q, k_pages, v_pages, block_table, start, 0.125, positions=positions)
    torch.testing.assert_close(again[:n], padded[:n], atol=0, rtol=0)
    assert (again[n:] - padded[n:]).abs().max() > 1  # the padding's own rows do see it
