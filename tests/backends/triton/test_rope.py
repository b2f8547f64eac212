"""Triton apply_rope (backends/triton/rope.py) against its twin (backends/reference/rope.py).

The kernel runs the twin's float32 operations one by one (no fused multiply-add), so it must match
the twin exactly. Outputs are poisoned with NaN before each launch; positions are random (any order,
repeats allowed).
"""

from __future__ import annotations

import pytest
import torch

from tileinfer.backends.reference.rope import apply_rope as ref_apply_rope
from tileinfer.backends.triton.rope import apply_rope
from tileinfer.model import rope_table

from ..kernel_checks import DEVICE, INTERPRETER_DTYPES, THETA, assert_same, generator, poisoned, randn, step_positions


def check(x, table, positions):
    out = apply_rope(x, table.cos, table.sin, positions, out=poisoned(x.shape, x.dtype))
    assert not out.isnan().any()
    assert_same(out, ref_apply_rope(x, table.cos[positions], table.sin[positions]))


@pytest.mark.parametrize("dtype", INTERPRETER_DTYPES, ids=str)
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("heads", [1, 2, 8, 20])
@pytest.mark.parametrize("t", [1, 2, 7, 16, 33])
def test_apply_rope(t, heads, head_dim, dtype):
    g = generator("rope", t, heads, head_dim, dtype)
    table = rope_table(head_dim, THETA, 512, torch.device(DEVICE))
    x = randn((t, heads, head_dim), dtype, g)
    check(x, table, torch.randint(0, 512, (t,), generator=g, device=DEVICE))


@pytest.mark.parametrize("dtype", INTERPRETER_DTYPES, ids=str)
def test_apply_rope_strided_and_in_place(dtype):
    """q heads as a view of the fused projection output; then the same rotation in place."""
    g = generator("rope_strided", dtype)
    t, heads, kv_heads, d = 6, 4, 2, 64
    qkv = randn((t, (heads + 2 * kv_heads) * d), dtype, g)
    table = rope_table(d, THETA, 64, torch.device(DEVICE))
    positions = step_positions(t, 64, g)
    q = qkv[:, : heads * d].view(t, heads, d)
    expected = ref_apply_rope(q, table.cos[positions], table.sin[positions])
    assert_same(apply_rope(q, table.cos, table.sin, positions), expected)
    before = qkv.clone()
    apply_rope(q, table.cos, table.sin, positions, out=q)
    assert_same(q, expected)
    assert torch.equal(qkv[:, heads * d:], before[:, heads * d:])  # k and v untouched


def test_rejects_bad_inputs():
    positions = torch.arange(3, device=DEVICE)
    x = torch.zeros(3, 2, 64, device=DEVICE)
    table = rope_table(64, THETA, 16, torch.device(DEVICE))
    with pytest.raises(AssertionError):
        apply_rope(x, table.cos.half(), table.sin.half(), positions)  # tables are float32
    with pytest.raises(AssertionError):
        apply_rope(x, table.cos, table.sin, positions.int())  # positions are int64
    with pytest.raises(AssertionError):
        apply_rope(torch.zeros(3, 2, 63, device=DEVICE), table.cos, table.sin, positions)  # odd head_dim


@pytest.mark.gpu
@pytest.mark.parametrize("heads", [8, 32])
@pytest.mark.parametrize("t", [1, 16, 1024])
def test_gpu_apply_rope_bf16(t, heads):
    """Same float32 operations, no contraction: exact on the GPU too."""
    g = generator("gpu_rope", t, heads)
    table = rope_table(128, THETA, 4096, torch.device(DEVICE))
    check(randn((t, heads, 128), torch.bfloat16, g), table, step_positions(t, 4096, g))
