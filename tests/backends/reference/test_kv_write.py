"""write_pages (backends/reference/kv_write.py) and gather_pages (backends/reference/paged_attention.py):
where the data physically lives, and the round trip through a permuted block table."""

from __future__ import annotations

import torch

from tileinfer.backends.reference.kv_write import write_pages
from tileinfer.backends.reference.paged_attention import gather_pages


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_write_gather_pages_round_trip_non_identity_table():
    num_pages, hkv, page, d, length = 9, 2, 4, 8, 27  # 7 pages used, the last partly
    pages = torch.full((num_pages, hkv, page, d), float("nan"))
    scales = torch.full((num_pages, hkv, page), float("nan"))
    block_table = torch.tensor([6, 2, 8, 0, 5, 3, 7, 1, 4], dtype=torch.int32)
    x = torch.randn(length, hkv, d, generator=gen(16))
    s = torch.rand(length, hkv, generator=gen(17))
    order = torch.randperm(length, generator=gen(18))
    for chunk in (order[:10], order[10:11], order[11:]):  # prefill-, decode- and verify-sized writes
        write_pages(pages, block_table, chunk, x[chunk])
        write_pages(scales, block_table, chunk, s[chunk])
    assert torch.equal(gather_pages(pages, block_table, length), x)
    assert torch.equal(gather_pages(scales, block_table, length), s)
    assert torch.equal(gather_pages(pages, block_table, 13), x[:13])
    for p in range(length):  # where the data physically lives
        assert torch.equal(pages[block_table[p // page], :, p % page], x[p])
    # pages the table does not reach were not touched
    assert torch.isnan(pages[block_table[7:].long()]).all()
    # an identity table reads other data: the table matters
    assert not torch.equal(gather_pages(pages, torch.arange(num_pages, dtype=torch.int32), 8), x[:8])


def test_write_pages_casts_to_page_dtype():
    pages = torch.zeros(2, 1, 4, 3, dtype=torch.int8)
    block_table = torch.tensor([1, 0], dtype=torch.int32)
    x = torch.tensor([[[1, -2, 127]], [[-127, 5, 0]]], dtype=torch.int8)
    write_pages(pages, block_table, torch.tensor([5, 0]), x)
    assert torch.equal(pages[0, 0, 1], x[0, 0]) and torch.equal(pages[1, 0, 0], x[1, 0])
    assert torch.equal(gather_pages(pages, block_table, 6)[[0, 5]], x[[1, 0]])
