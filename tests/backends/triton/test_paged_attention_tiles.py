"""The prefill kernel's tile candidates (``prefill_tiles`` of backends/triton/paged_attention.py:
128-row shapes, K/V through TMA descriptors, the warp-specialized loop) against the rule's tiles and
the twin, under the Triton interpreter (which runs the descriptors too) on float16/float32, both
causal modes, NaN-poisoned pages and outputs (make_case of test_paged_attention.py), odd T and
starts that are not page-aligned.

The bound: a candidate whose key tile is the rule's (64) computes every row with the rule's key
tiles in the rule's order and the same roundings, so its output is bit-identical to the rule's
kernel (``torch.equal``); one with 128-key tiles rescales the online softmax once per 128 keys
instead of 64, so it is held to the twin's tolerance (``two_roundings``, as the rule's kernel is).
A masked TMA tile reads the slots past the context (NaN in these pages): a NaN left in a value row
would reach every row through P V, so these cases catch a missing zeroing. Compiled (the GPU cases,
bfloat16 at Qwen3-4B's shape), the bit-identity is asserted of the 64-key candidates but the
warp-specialized one, which masks every tile: the mask between the scaling of the scores and the
subtraction of the row maximum keeps the compiler from fusing the two into one FMA, as it may in the
rule's unmasked tiles, so there it is held to the twin's tolerance.
"""

from __future__ import annotations

import pytest
import torch

from tileinfer.backends.reference.paged_attention import paged_attention
from tileinfer.backends.triton.paged_attention import PrefillTiles, paged_prefill_attention, prefill_tiles

from ..kernel_checks import BF16, F16, F32, poisoned
from .test_paged_attention import QWEN3_4B, case_id, check, make_case

# (shape, tma, warp_specialize) as prefill_tiles takes them; the rule's tiles are the baseline
CANDIDATES = [
    ("rule", True, False),
    ("128x64", False, False),
    ("128x64", True, False),
    ("128x128", False, False),
    ("128x128", True, False),
    ("rule", False, True),
    ("128x128", False, True),
]
# (T, start, group, head_dim, page_size, dtype): T * group rows over one or several 128-row blocks,
# starts inside a page, pages of 64 and 128 (TMA: the page size is a multiple of the key tile)
CASES = [
    (17, 0, 4, 64, 128, F32),
    (33, 45, 2, 64, 128, F16),
    (70, 130, 1, 128, 128, F16),
    (100, 37, 4, 64, 64, F32),
    (129, 300, 2, 64, 128, F16),
]


def candidate_id(c) -> str:
    shape, tma, ws = c
    return shape + ("+tma" if tma else "") + ("+ws" if ws else "")


def run(q, k_pages, v_pages, block_table, start, causal, tiles=None):
    out = poisoned(q.shape, q.dtype)
    got = paged_prefill_attention(q, k_pages, v_pages, block_table, start, q.shape[-1] ** -0.5, causal=causal,
                                  out=out, tiles=tiles)
    assert got is out
    return out


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "non-causal"])
@pytest.mark.parametrize("case", CASES, ids=case_id)
@pytest.mark.parametrize("candidate", CANDIDATES, ids=candidate_id)
def test_candidate_matches_rule_and_twin(candidate, case, causal):
    t, start, group, head_dim, page_size, dtype = case
    shape, tma, ws = candidate
    tiles = prefill_tiles(t * group, head_dim, shape=shape, tma=tma, warp_specialize=ws)
    if tiles.tma and page_size % tiles.block_n:
        pytest.skip("TMA needs a page size that is a multiple of the key tile")
    q, k_pages, v_pages, block_table = make_case(9000 + CASES.index(case), t, start, group, head_dim, page_size,
                                                 dtype)
    out = run(q, k_pages, v_pages, block_table, start, causal, tiles)
    check(out, paged_attention(q, k_pages, v_pages, block_table, start, head_dim ** -0.5, causal))
    if tiles.block_n == prefill_tiles(t * group, head_dim).block_n:
        rule = run(q, k_pages, v_pages, block_table, start, causal)
        assert torch.equal(out, rule), f"max diff {(out.float() - rule.float()).abs().max().item()}"


def test_candidates_differ_where_they_should():
    """The options reach the kernel: the warp-specialized form is one head's tokens per program
    (another grid), the 128-key tile another rounding of the online softmax."""
    ws = prefill_tiles(400, 128, warp_specialize=True)
    assert (ws.block_m, ws.num_warps, ws.tma, ws.head_rows) == (128, 4, True, True)
    assert prefill_tiles(400, 128, shape="128x128").block_n == 128
    q, k_pages, v_pages, block_table = make_case(9100, 70, 130, 1, 128, 128, F16)
    rule = run(q, k_pages, v_pages, block_table, 130, True)
    wide = run(q, k_pages, v_pages, block_table, 130, True, prefill_tiles(70, 128, shape="128x128"))
    assert not torch.equal(wide, rule)


def test_bfloat16_candidates_on_the_interpreter():
    q, k_pages, v_pages, block_table = make_case(9200, 20, 9, 4, 64, 64, BF16)
    expected = paged_attention(q, k_pages, v_pages, block_table, 9, 0.125)
    for shape, tma, ws in CANDIDATES[:3] + CANDIDATES[5:6]:
        tiles = prefill_tiles(80, 64, shape=shape, tma=tma, warp_specialize=ws)
        check(run(q, k_pages, v_pages, block_table, 9, True, tiles), expected)


def test_tiles_contract():
    with pytest.raises(AssertionError, match="power of two"):
        PrefillTiles(96, 64)
    with pytest.raises(AssertionError, match="set tma"):
        PrefillTiles(128, 64, head_rows=True)
    with pytest.raises(AssertionError, match="warp_specialize needs"):
        PrefillTiles(128, 64, num_warps=8, tma=True, head_rows=True, warp_specialize=True)
    with pytest.raises(AssertionError, match="unknown prefill tile shape"):
        prefill_tiles(64, 128, shape="256x64")
    q, k_pages, v_pages, block_table = make_case(9300, 5, 40, 2, 64, 64, F32)
    with pytest.raises(AssertionError, match="multiple of the key tile"):
        run(q, k_pages, v_pages, block_table, 40, True, prefill_tiles(10, 64, shape="128x128", tma=True))
    with pytest.raises(AssertionError, match="heads must be contiguous"):
        strided = q.transpose(0, 1).contiguous().transpose(0, 1)
        run(strided, k_pages, v_pages, block_table, 40, True, prefill_tiles(10, 64, warp_specialize=True))


@pytest.mark.gpu
@pytest.mark.parametrize("start", [0, 1000, 4096])
@pytest.mark.parametrize("t", [4096, 100])
@pytest.mark.parametrize("candidate", CANDIDATES, ids=candidate_id)
def test_candidate_qwen3_4b_gpu(candidate, t, start):
    shape, tma, ws = candidate
    tiles = prefill_tiles(t * 4, 128, shape=shape, tma=tma, warp_specialize=ws)
    q, k_pages, v_pages, block_table = make_case(9400 + t + start, t, start, QWEN3_4B["group"], 128, 64, BF16,
                                                 QWEN3_4B["kv_heads"])
    for causal in (True, False):
        out = run(q, k_pages, v_pages, block_table, start, causal, tiles)
        check(out, paged_attention(q, k_pages, v_pages, block_table, start, 128 ** -0.5, causal))
        if tiles.block_n == 64 and not tiles.warp_specialize:
            assert torch.equal(out, run(q, k_pages, v_pages, block_table, start, causal))

