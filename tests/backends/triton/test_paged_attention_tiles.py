"""The prefill kernel's tile shapes (``prefill_tiles`` of backends/triton/paged_attention.py: the
128-row shapes of ``PREFILL_SHAPES``) against the rule's tiles and the twin, under the Triton
interpreter on float16/float32, both causal modes, NaN-poisoned pages and outputs (make_case of
test_paged_attention.py), odd T and starts that are not page-aligned, pages of 64 and 128 (a 128-key
tile over two pages, or inside one).

The bound: a shape whose key tile is the rule's (64) computes every row with the rule's key tiles in
the rule's order and the same roundings, so its output is bit-identical to the rule's kernel
(``torch.equal``); one with 128-key tiles rescales the online softmax once per 128 keys instead of
64, so it is held to the twin's tolerance (``two_roundings``, as the rule's kernel is). Compiled
(the GPU cases, bfloat16 at Qwen3-4B's shape), the bit-identity is asserted of the 64-key shapes too.
"""

from __future__ import annotations

import pytest
import torch

from tileinfer.backends.reference.paged_attention import paged_attention
from tileinfer.backends.triton.paged_attention import (
    PREFILL_SHAPES,
    PrefillTiles,
    paged_prefill_attention,
    prefill_tiles,
)

from ..kernel_checks import BF16, F16, F32, poisoned
from .test_paged_attention import QWEN3_4B, case_id, check, make_case

SHAPES = list(PREFILL_SHAPES)  # the rule's tiles are the baseline
# (T, start, group, head_dim, page_size, dtype): T * group rows over one or several 128-row blocks,
# starts inside a page, pages of 64 and 128
CASES = [
    (17, 0, 4, 64, 128, F32),
    (33, 45, 2, 64, 128, F16),
    (70, 130, 1, 128, 128, F16),
    (100, 37, 4, 64, 64, F32),
    (129, 300, 2, 64, 128, F16),
]


def run(q, k_pages, v_pages, block_table, start, causal, tiles=None):
    out = poisoned(q.shape, q.dtype)
    got = paged_prefill_attention(q, k_pages, v_pages, block_table, start, q.shape[-1] ** -0.5, causal=causal,
                                  out=out, tiles=tiles)
    assert got is out
    return out


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "non-causal"])
@pytest.mark.parametrize("case", CASES, ids=case_id)
@pytest.mark.parametrize("shape", SHAPES)
def test_shape_matches_rule_and_twin(shape, case, causal):
    t, start, group, head_dim, page_size, dtype = case
    tiles = prefill_tiles(t * group, head_dim, shape=shape)
    q, k_pages, v_pages, block_table = make_case(9000 + CASES.index(case), t, start, group, head_dim, page_size,
                                                 dtype)
    out = run(q, k_pages, v_pages, block_table, start, causal, tiles)
    check(out, paged_attention(q, k_pages, v_pages, block_table, start, head_dim ** -0.5, causal))
    if tiles.block_n == prefill_tiles(t * group, head_dim).block_n:
        rule = run(q, k_pages, v_pages, block_table, start, causal)
        assert torch.equal(out, rule), f"max diff {(out.float() - rule.float()).abs().max().item()}"


def test_the_128_key_tile_reaches_the_kernel():
    """Another rounding of the online softmax than the rule's: the tiles reach the launch."""
    q, k_pages, v_pages, block_table = make_case(9100, 70, 130, 1, 128, 128, F16)
    rule = run(q, k_pages, v_pages, block_table, 130, True)
    wide = run(q, k_pages, v_pages, block_table, 130, True, prefill_tiles(70, 128, shape="128x128"))
    assert not torch.equal(wide, rule)


def test_bfloat16_shape_on_the_interpreter():
    q, k_pages, v_pages, block_table = make_case(9200, 20, 9, 4, 64, 64, BF16)
    expected = paged_attention(q, k_pages, v_pages, block_table, 9, 0.125)
    check(run(q, k_pages, v_pages, block_table, 9, True, prefill_tiles(80, 64, shape="128x64")), expected)


def test_the_rule_takes_128_query_rows_for_large_chunks_of_model_dtype_pages():
    """From LARGE_PREFILL_ROWS query rows at head_dim 128 over model-dtype pages the rule's tile is
    128x64 (whose bits are the 64 x 64 tile's: test_shape_matches_rule_and_twin); below, for int8
    pages or another head_dim, 64 rows at most."""
    from tileinfer.backends.triton.paged_attention import LARGE_PREFILL_ROWS, PREFILL_SHAPES

    assert prefill_tiles(LARGE_PREFILL_ROWS, 128) == PREFILL_SHAPES["128x64"] == prefill_tiles(4 * 32768, 128)
    for rows, head_dim, kv_int8 in ((LARGE_PREFILL_ROWS - 1, 128, False), (LARGE_PREFILL_ROWS, 64, False),
                                    (LARGE_PREFILL_ROWS, 128, True)):
        tiles = prefill_tiles(rows, head_dim, kv_int8)
        assert tiles.block_m == 64 and tiles.num_warps == 4, (rows, head_dim, kv_int8, tiles)


def test_tiles_contract():
    with pytest.raises(AssertionError, match="power of two"):
        PrefillTiles(96, 64)
    with pytest.raises(AssertionError, match="unknown prefill tile shape"):
        prefill_tiles(64, 128, shape="256x64")


@pytest.mark.gpu
@pytest.mark.parametrize("start", [0, 1000, 4096])
@pytest.mark.parametrize("t", [4096, 100])
@pytest.mark.parametrize("shape", SHAPES)
def test_shape_qwen3_4b_gpu(shape, t, start):
    tiles = prefill_tiles(t * 4, 128, shape=shape)
    q, k_pages, v_pages, block_table = make_case(9400 + t + start, t, start, QWEN3_4B["group"], 128, 64, BF16,
                                                 QWEN3_4B["kv_heads"])
    for causal in (True, False):
        out = run(q, k_pages, v_pages, block_table, start, causal, tiles)
        check(out, paged_attention(q, k_pages, v_pages, block_table, start, 128 ** -0.5, causal))
        if tiles.block_n == 64:
            assert torch.equal(out, run(q, k_pages, v_pages, block_table, start, causal))
