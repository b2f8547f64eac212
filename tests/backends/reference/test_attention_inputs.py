"""attention_inputs (backends/reference/attention_inputs.py), by what it must do: q and k heads
normalized (RoPE keeps their norms; position 0 is not rotated), v copied as it is, k and v stored
at each position's page and slot, every other slot untouched."""

from __future__ import annotations

import torch

from tileinfer.backends.reference.attention_inputs import attention_inputs
from tileinfer.backends.reference.paged_attention import gather_pages
from tileinfer.backends.reference.rms_norm import rms_norm
from tileinfer.model import rope_table


def test_attention_inputs_normalizes_rotates_and_writes():
    g = torch.Generator().manual_seed(50)
    t, heads, kv_heads, d, page, num_pages, eps = 6, 4, 2, 16, 4, 3, 1e-6
    qkv = torch.randn(t, (heads + 2 * kv_heads) * d, generator=g) * 3
    q_w, k_w = torch.rand(d, generator=g) + 0.5, torch.rand(d, generator=g) + 0.5
    table = rope_table(d, 10000.0, 64, torch.device("cpu"))
    positions = torch.arange(t)
    block_table = torch.tensor([2, 0, 1], dtype=torch.int32)
    k_pages = torch.full((num_pages, kv_heads, page, d), float("nan"))
    v_pages = torch.full_like(k_pages, float("nan"))
    q = attention_inputs(qkv, q_w, k_w, table.cos, table.sin, positions, k_pages, v_pages, block_table,
                         heads, kv_heads, d, eps)
    q_in, k_in, v_in = qkv.split([heads * d, kv_heads * d, kv_heads * d], dim=-1)
    q_norm = rms_norm(q_in.reshape(t, heads, d), q_w, eps)
    k_norm = rms_norm(k_in.reshape(t, kv_heads, d), k_w, eps)
    k = gather_pages(k_pages, block_table, t)
    assert q.shape == (t, heads, d)
    assert torch.equal(q[0], q_norm[0]) and torch.equal(k[0], k_norm[0])  # position 0: no rotation
    torch.testing.assert_close(q.norm(dim=-1), q_norm.norm(dim=-1))
    torch.testing.assert_close(k.norm(dim=-1), k_norm.norm(dim=-1))
    assert not torch.allclose(q[1:], q_norm[1:])  # the other positions are rotated
    assert torch.equal(gather_pages(v_pages, block_table, t), v_in.reshape(t, kv_heads, d))
    assert k_pages[block_table[1], :, t - page:].isnan().all()  # the slots past position t - 1
