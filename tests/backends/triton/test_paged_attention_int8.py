"""The paged attention kernels over INT8 pages (``kv_store=paged_int8``: int8 K/V, a float32 scale
per cached vector, keys divided by the k-norm smoothing) against the twin, ``paged_attention`` of
backends/reference/paged_attention.py with the same scales (dequantized in float32).

Each case writes random keys and values through the reference quantizer (``write_quantized``) into
a pool whose int8 slots start at -128 (a value the quantizer never writes) and whose scales start
as NaN, through a block table that is a random permutation of the pool; outputs are pre-filled with
NaN. Without a GPU the kernels run under the interpreter on float16/float32 data; the GPU cases use
bfloat16 at Qwen3-4B's attention shape, up to a 32k context.
"""

from __future__ import annotations

import pytest
import torch

from tileinfer.backends.reference.kv_quant import key_smoothing, write_quantized
from tileinfer.backends.reference.paged_attention import paged_attention
from tileinfer.backends.triton.paged_attention import decode_splits, paged_decode_attention, paged_prefill_attention

from ..kernel_checks import BF16, DEVICE, F16, F32, assert_close, poisoned

CPU_KV_HEADS = 2


def make_int8_case(seed: int, t: int, start: int, group: int, head_dim: int, page_size: int, dtype: torch.dtype,
                   kv_heads: int = CPU_KV_HEADS, smooth: bool = True):
    """Random q (model dtype) and an int8 pool holding positions ``[0, start + t)``: ``(q, k_pages,
    v_pages, block_table, int8 keywords)``. Keys get per-channel magnitudes from a random k-norm
    weight (the channels smoothing evens out)."""
    gen = torch.Generator().manual_seed(seed)
    length = start + t
    num_pages = -(-length // page_size) + 3
    shape = (num_pages, kv_heads, page_size, head_dim)
    k_pages = torch.full(shape, -128, dtype=torch.int8, device=DEVICE)
    v_pages = torch.full(shape, -128, dtype=torch.int8, device=DEVICE)
    k_scale, v_scale = poisoned(shape[:-1], F32), poisoned(shape[:-1], F32)
    block_table = torch.randperm(num_pages, generator=gen).to(torch.int32).to(DEVICE)
    norm_weight = torch.rand(head_dim, generator=gen) * 3 + 0.1
    k_smooth = key_smoothing(norm_weight).to(DEVICE) if smooth else None
    k = (torch.randn(length, kv_heads, head_dim, generator=gen) * norm_weight).to(DEVICE, dtype)
    v = torch.randn(length, kv_heads, head_dim, generator=gen).to(DEVICE, dtype)
    write_quantized(k_pages, v_pages, k_scale, v_scale, block_table, torch.arange(length, device=DEVICE), k, v,
                    k_smooth)
    q = torch.randn(t, kv_heads * group, head_dim, generator=gen).to(DEVICE, dtype)
    return q, k_pages, v_pages, block_table, dict(k_scale=k_scale, v_scale=v_scale, k_smooth=k_smooth)


def run_int8_case(fn, seed, t, start, group, head_dim, page_size, dtype, kv_heads=CPU_KV_HEADS, smooth=True,
                  causal=True, **kw):
    q, k_pages, v_pages, block_table, int8 = make_int8_case(seed, t, start, group, head_dim, page_size, dtype,
                                                            kv_heads, smooth)
    scale = head_dim ** -0.5
    out = poisoned(q.shape, q.dtype)
    got = fn(q, k_pages, v_pages, block_table, start, scale, causal=causal, out=out, **int8, **kw)
    assert got is out
    # P (times each value's scale) is rounded to q's dtype before the P.V dot; the output once.
    assert_close(out, paged_attention(q, k_pages, v_pages, block_table, start, scale, causal, **int8),
                 "two_roundings")


def case_id(case) -> str:
    return "-".join(str(x).replace("torch.", "") for x in case)


# (T, start, group, head_dim, page_size, num_splits, dtype); None = decode_splits(L).
DECODE_CASES = [
    (1, 1, 1, 64, 16, None, F32),
    (1, 16, 4, 128, 16, 8, F16),       # one key into the second page; seven empty splits
    (1, 100, 2, 128, 64, 1, F16),      # one split (no combine)
    (1, 1000, 4, 64, 64, 8, F32),
    (2, 100, 1, 128, 64, 3, F16),
    (7, 15, 4, 64, 16, 8, F32),        # the new tokens straddle a page boundary
    (7, 380, 2, 64, 16, 3, F16),       # ... and a split boundary (384)
    (16, 17, 4, 64, 64, 8, F32),
    (16, 1000, 2, 128, 16, None, F16),
]


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "non-causal"])
@pytest.mark.parametrize("case", DECODE_CASES, ids=case_id)
def test_int8_decode_matches_twin(case, causal):
    t, start, group, head_dim, page_size, num_splits, dtype = case
    run_int8_case(paged_decode_attention, 7000 + DECODE_CASES.index(case), t, start, group, head_dim, page_size,
                  dtype, num_splits=num_splits, causal=causal)


# (T, start, group, head_dim, page_size, dtype)
PREFILL_CASES = [
    (1, 0, 1, 64, 16, F32),
    (33, 0, 4, 64, 16, F32),     # two q blocks
    (100, 0, 2, 128, 64, F16),
    (33, 64, 1, 128, 64, F16),   # after one full cached page
    (100, 37, 4, 64, 16, F32),   # after a prefix that is not page-aligned
    (7, 1000, 2, 64, 64, F16),
]


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "non-causal"])
@pytest.mark.parametrize("case", PREFILL_CASES, ids=case_id)
def test_int8_prefill_matches_twin(case, causal):
    t, start, group, head_dim, page_size, dtype = case
    run_int8_case(paged_prefill_attention, 7100 + PREFILL_CASES.index(case), t, start, group, head_dim, page_size,
                  dtype, causal=causal)


@pytest.mark.parametrize("fn", [paged_prefill_attention, paged_decode_attention])
def test_int8_without_smoothing(fn):
    run_int8_case(fn, 7201, 5, 60, 2, 64, 16, F16, smooth=False)


def test_int8_bfloat16_runs_on_the_interpreter_too():
    """Under the interpreter bf16 q goes to float32 and the int8 tiles are converted to it."""
    run_int8_case(paged_decode_attention, 7301, 4, 70, 2, 64, 16, BF16, num_splits=2)
    run_int8_case(paged_prefill_attention, 7302, 20, 9, 4, 64, 16, BF16)


def test_int8_reads_the_scales_and_the_smoothing():
    """Each of the three goes into the result: the twin without it differs from the kernel."""
    q, k_pages, v_pages, block_table, int8 = make_int8_case(7401, 3, 50, 2, 64, 16, F32)
    got = paged_decode_attention(q, k_pages, v_pages, block_table, 50, 0.125, **int8)
    for dropped in ("k_scale", "v_scale", "k_smooth"):
        other = dict(int8)
        if dropped == "k_smooth":
            other["k_smooth"] = None
        else:
            other[dropped] = torch.ones_like(other[dropped])
        assert (got - paged_attention(q, k_pages, v_pages, block_table, 50, 0.125, **other)).abs().max() > 1e-3


def test_int8_rejects_bad_layouts():
    q, k_pages, v_pages, block_table, int8 = make_int8_case(7501, 2, 40, 2, 64, 16, F32)
    with pytest.raises(AssertionError, match="both k_scale and v_scale"):
        paged_decode_attention(q, k_pages, v_pages, block_table, 40, 0.1, k_scale=int8["k_scale"])
    with pytest.raises(AssertionError, match="float32"):
        paged_decode_attention(q, k_pages, v_pages, block_table, 40, 0.1, k_scale=int8["k_scale"].half(),
                               v_scale=int8["v_scale"])
    with pytest.raises(AssertionError, match="int8 pages expected"):
        paged_prefill_attention(q, k_pages.float(), v_pages.float(), block_table, 40, 0.1, **int8)
    with pytest.raises(AssertionError, match="dtype"):
        paged_prefill_attention(q, k_pages, v_pages, block_table, 40, 0.1)  # int8 pages without scales
    with pytest.raises(AssertionError, match="k_smooth must be"):
        paged_prefill_attention(q, k_pages, v_pages, block_table, 40, 0.1, k_scale=int8["k_scale"],
                                v_scale=int8["v_scale"], k_smooth=int8["k_smooth"][:10])


# -- GPU: bfloat16 at Qwen3-4B's shape ------------------------------------------------------------------

QWEN3_4B = dict(group=4, head_dim=128, page_size=64, dtype=BF16, kv_heads=8)


@pytest.mark.gpu
@pytest.mark.parametrize("context", [1024, 8192, 32768])
@pytest.mark.parametrize("t", [1, 2, 8, 16])
@pytest.mark.parametrize("num_splits", [None, 1, 16])
def test_int8_decode_qwen3_4b_gpu(context, t, num_splits):
    run_int8_case(paged_decode_attention, 8000 + context + t + (num_splits or 0), t, context, **QWEN3_4B,
                  num_splits=num_splits)


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("start,t", [(0, 1024), (1000, 100), (4096, 7), (32768 - 1024, 1024)])
def test_int8_prefill_qwen3_4b_gpu(start, t, causal):
    run_int8_case(paged_prefill_attention, 8100 + start + t, t, start, **QWEN3_4B, causal=causal)


@pytest.mark.gpu
def test_int8_decode_at_32k_allocates_no_score_matrix():
    """A decode step over 32,768 int8 positions: the kernels' only allocations are the output and
    the split scratch ([T, H, splits, D] float32), nothing of the size of T x context."""
    q, k_pages, v_pages, block_table, int8 = make_int8_case(8201, 16, 32768, **QWEN3_4B)
    paged_decode_attention(q, k_pages, v_pages, block_table, 32768, 0.088, **int8)  # compile outside the count
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    paged_decode_attention(q, k_pages, v_pages, block_table, 32768, 0.088, **int8)
    torch.cuda.synchronize()
    t, h, d = q.shape
    splits = decode_splits(32768 + t, int8=True)
    scratch = t * h * splits * (d + 2) * 4  # [T, H, splits, D] partials, the max and sum of each row
    scores = t * h * 32768 * 4  # what a float32 [T, H, context] score matrix would take
    used = torch.cuda.max_memory_allocated() - before
    assert used <= q.numel() * q.element_size() + scratch + 2**16 and used < scores / 4


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "non-causal"])
def test_int8_prefill_reads_the_start_from_the_positions_tensor(causal):
    """As a replayed prefill graph does: the host start is the capture's (0), the positions tensor
    holds the real one."""
    t, start = 40, 37
    q, k_pages, v_pages, block_table, int8 = make_int8_case(7501, t, start, 2, 64, 16, F32)
    positions = torch.arange(start, start + t, device=DEVICE)
    out = poisoned(q.shape, q.dtype)
    paged_prefill_attention(q, k_pages, v_pages, block_table, 0, 0.125, positions=positions, causal=causal,
                            out=out, **int8)
    assert_close(out, paged_attention(q, k_pages, v_pages, block_table, start, 0.125, causal, **int8),
                 "two_roundings")


def test_int8_prefill_pad_rows_leave_the_real_rows_unchanged():
    """A padded prefill step over int8 pages: other (finite) keys, values and scales in the padding
    change none of the real rows, bit for bit (they give no padded position any weight)."""
    n, bucket, start = 21, 32, 45
    q, k_pages, v_pages, block_table, int8 = make_int8_case(7502, bucket, start, 2, 64, 16, F32)
    positions = torch.arange(start, start + bucket, device=DEVICE)
    before = paged_prefill_attention(q, k_pages, v_pages, block_table, start, 0.125, positions=positions, **int8)
    slots = positions[n:]
    page, slot = block_table[slots // 16].long(), slots % 16
    k_pages[page, :, slot] = 127
    v_pages[page, :, slot] = -127
    for scale in (int8["k_scale"], int8["v_scale"]):
        scale[page, :, slot] = 1e3
    after = paged_prefill_attention(q, k_pages, v_pages, block_table, start, 0.125, positions=positions, **int8)
    torch.testing.assert_close(after[:n], before[:n], atol=0, rtol=0)
