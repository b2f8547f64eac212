"""The persistent decode step against its twin (backends/reference/persistent.py ``decode_step``) on
fresh random weights and pages, under the interpreter with one program taking every work item in
order, its buffers poisoned (NaN) before the launch.

Odd shapes: hidden 80 and intermediate 96 are not multiples of the 32-column K chunks, the vocab
(200) not of the lm_head's 64-row tiles; 70 cached positions on pages of 16 in a shuffled block
table span two 64-position chunks, so both attention splits work. The kernel reduces in other
orders than the twin's matmuls (module docstring of backends/triton/persistent.py): float32
logits agree to 1e-5 relative, float16 ones to 8e-3 absolute: two float16 ulps of the largest
activations (hidden states up to about 4, where an ulp is 3.9e-3; logits up to about 2.5).
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
import torch

from tileinfer.backends.reference.persistent import decode_step
from tileinfer.backends.reference.linear import quantize_int8
from tileinfer.backends.triton.persistent import launch_persistent_step
from tileinfer.backends.triton.persistent_plan import (StepBuffers, StepPlan, StepShape, block_n_sizes,
                                                       layer_pointer_table, qkv_block_n, resident_programs)

HIDDEN, HEADS, KV_HEADS, D, INTER, VOCAB, LAYERS, PAGE, START = 80, 4, 2, 32, 96, 200, 2, 16, 70
SHAPE = StepShape(hidden=HIDDEN, heads=HEADS, kv_heads=KV_HEADS, head_dim=D, intermediate=INTER, vocab=VOCAB,
                  layers=LAYERS, page_size=PAGE, num_splits=2, chunk=64, block_k=32, block_n=(32, 32, 32, 32, 64))
TOL = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.float16: dict(rtol=2e-3, atol=8e-3)}


def weights(dtype: torch.dtype, int8: bool, g: torch.Generator, heads: int = HEADS) -> tuple[list[dict], dict]:
    def w(rows, cols):
        x = (torch.randn(rows, cols, generator=g) * cols**-0.5).to(dtype)
        return quantize_int8(x) if int8 else (x, torch.ones(rows))

    def norm(n):
        return (torch.rand(n, generator=g) + 0.5).to(dtype)

    pages = START // PAGE + 2
    layers = []
    for _ in range(LAYERS):
        layer = {"input_norm": norm(HIDDEN), "post_norm": norm(HIDDEN), "q_norm": norm(D), "k_norm": norm(D),
                 "k_pages": torch.randn(pages, KV_HEADS, PAGE, D, generator=g).to(dtype),
                 "v_pages": torch.randn(pages, KV_HEADS, PAGE, D, generator=g).to(dtype)}
        for name, rows, cols in (("qkv", (heads + 2 * KV_HEADS) * D, HIDDEN), ("o", HIDDEN, heads * D),
                                 ("gate_up", 2 * INTER, HIDDEN), ("down", HIDDEN, INTER)):
            layer[f"{name}_w"], layer[f"{name}_s"] = w(rows, cols)
        layers.append(layer)
    lm_w, lm_s = w(VOCAB, HIDDEN)
    return layers, dict(lm_w=lm_w, lm_s=lm_s, final_norm=norm(HIDDEN), block_table=torch.randperm(pages).int())


@pytest.mark.parametrize("dtype, t, int8, split_k, heads", [
    (torch.float32, 3, False, 1, HEADS), (torch.float16, 1, False, 1, HEADS), (torch.float32, 2, True, 1, HEADS),
    (torch.float32, 3, False, 2, HEADS), (torch.float32, 2, True, 3, HEADS),
    (torch.float32, 3, False, 1, 6), (torch.float32, 2, True, 3, 10),  # 3 and 5 query heads a kv head
])
def test_the_step_is_its_twin(dtype, t, int8, split_k, heads):
    """``split_k``: o_proj (4 K chunks) and down (3) in runs of 2 / 2 and 2 / 1 chunks, 2 and 3 runs.
    ``heads`` 6 and 10: 48 and 80 query rows of a kv head, attention tiles of 64 and 128 rows (the
    shipped family has 3 query heads a kv head, Qwen3-14B 5)."""
    shape = dataclasses.replace(SHAPE, split_k=split_k, heads=heads)
    g = torch.Generator().manual_seed(t)
    layers, rest = weights(dtype, int8, g, heads)
    angles = torch.arange(START + 16)[:, None] * torch.rand(D // 2, generator=g)[None, :]
    cos, sin = angles.cos(), angles.sin()
    positions = torch.arange(START, START + t)
    h = torch.randn(t, HIDDEN, generator=g).to(dtype)
    twin_layers = [{k: v.clone() for k, v in layer.items()} for layer in layers]
    ref, ref_hidden = decode_step(h, twin_layers, rest["lm_w"], rest["lm_s"], rest["final_norm"], positions,
                                  rest["block_table"], cos, sin, 1e-6, heads, KV_HEADS, D, capture=(0,))

    bufs = StepBuffers.allocate(shape, dtype, torch.device("cpu"), captures=1)
    bufs.poison()
    bufs.h[:t] = h
    plan = StepPlan.build(shape, torch.device("cpu"), capture=(0,))
    table = layer_pointer_table(layers, torch.device("cpu"))
    launch_persistent_step(plan, shape, bufs, table, positions, rest["block_table"], cos, sin, rest["lm_w"],
                           rest["lm_s"] if int8 else None, rest["final_norm"], layers[0]["qkv_w"],
                           tuple(layers[0]["k_pages"].stride()[:3]), 1e-6, 1, True)
    torch.testing.assert_close(bufs.logits[:t], ref, **TOL[dtype])
    torch.testing.assert_close(bufs.capture[0, :t], ref_hidden[0], **TOL[dtype])
    for mine, twin in zip(layers, twin_layers):
        for pages in ("k_pages", "v_pages"):
            torch.testing.assert_close(mine[pages], twin[pages], **TOL[dtype])
    assert not bufs.counters.any()


@pytest.mark.parametrize("regs, warps, shared, fit", [
    (255, 4, 49152, 2), (255, 8, 49152, 1), (128, 8, 49152, 2), (128, 4, 49152, 4),
    (100, 4, 16384, 4),  # 104 registers allocated a thread: 5 would need 66,560
    (128, 4, 58368, 3),  # 4 x (57 + 1) KiB of shared memory is more than 228 KiB
    (17, 8, 4, 8), (17, 4, 4, 16),  # at most 2,048 threads
])
def test_resident_programs_counts_what_an_sm_allocates(regs, warps, shared, fit):
    compiled = SimpleNamespace(_init_handles=lambda: None, n_regs=regs,
                               metadata=SimpleNamespace(num_warps=warps, shared=shared))
    assert resident_programs(compiled, 132, 228 * 1024) == fit


@pytest.mark.parametrize("columns, programs, block", [
    ((32 + 2 * 8) * 128, 132 * 2, 32),  # Qwen3-4B: 384 tiles of 16, two rounds of 264 programs
    ((16 + 2 * 8) * 128, 132 * 2, 16),  # Qwen3-0.6B: 256 tiles of 16, one round
    (264 * 16, 264, 16), (264 * 16 + 1, 264, 32),  # one round exactly, one column more
])
def test_the_qkv_tile_is_16_columns_unless_those_take_more_than_one_round(columns, programs, block):
    assert qkv_block_n(columns, programs) == block


def test_block_n_names_five_powers_of_two_the_first_may_be_auto():
    assert block_n_sizes("auto,16,16,16,64") == (None, 16, 16, 16, 64)
    assert block_n_sizes(" 32, 16,64,16,128") == (32, 16, 64, 16, 128)
    for bad in ("16,16,16,16", "16,auto,16,16,64", "48,16,16,16,64", "8,16,16,16,64", "x,16,16,16,64",
                "auto,16,16,16,64,16", ""):
        with pytest.raises(ValueError, match="five powers of two"):
            block_n_sizes(bad)


def test_the_kernel_calling_its_items_specializes_the_same_constants():
    """The item-calls build (``item_calls``) is the same source re-jitted: it must mark the same
    ``tl.constexpr`` parameters, or a launch passes its strings and flags as run-time arguments
    (which the interpreter accepts and a GPU launch refuses)."""
    from tileinfer.backends.triton.persistent import step_kernel

    inline, calls = step_kernel(False).fn, step_kernel(True).fn
    assert calls is not inline and calls.__code__ is inline.__code__
    marks = {name: kind for name, kind in calls.__annotations__.items() if "constexpr" in str(kind)}
    assert calls.__annotations__ == inline.__annotations__ and len(marks) > 20
