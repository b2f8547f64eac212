"""The persistent decode step over INT8 KV pages (``KV_INT8``, the ``paged_int8`` store's layout:
int8 pages, one float32 scale per cached vector, keys divided by a per-layer smoothing) against its
twin (backends/reference/persistent.py ``decode_step`` with ``k_scale``, ``v_scale``,
``k_smooth``), under the interpreter with one program taking every work item in order.

Odd shapes: hidden 72 and intermediate 88 are not multiples of the 32-column K chunks, the vocab
(150) not of the lm_head's 64-row tiles; the context (77 cached positions, a quantized random
cache on pages of 16 in a shuffled block table) spans two 64-position chunks, so both splits work.
The kernel's buffers are NaN, and the slots the step writes hold int8 -128 (which the quantizer
never gives) with NaN scales, on both sides. The kernel quantizes with the twin's arithmetic
(IEEE divisions, round half to even), so the int8 pages are the same bits; scales and logits
agree to the float32 reduction-order bound of test_persistent.py (1e-5 relative).
"""

from __future__ import annotations

import pytest
import torch

from tileinfer.backends.reference.kv_quant import key_smoothing, quantize_per_vector
from tileinfer.backends.reference.linear import quantize_int8
from tileinfer.backends.reference.persistent import decode_step
from tileinfer.backends.triton.persistent import launch_persistent_step
from tileinfer.backends.triton.persistent_plan import StepBuffers, StepPlan, StepShape, layer_pointer_table

DIMS = dict(hidden=72, heads=4, kv_heads=2, head_dim=32, intermediate=88, vocab=150, layers=2, page_size=16)
CONTEXT, EPS = 77, 1e-6
TOL = dict(rtol=1e-5, atol=1e-5)
CPU = torch.device("cpu")


def shape(smooth: bool) -> StepShape:
    return StepShape(**DIMS, num_splits=2, chunk=64, block_k=32, block_n=(32, 32, 32, 32, 64), kv_int8=True,
                     k_smooth=smooth)


def model(s: StepShape, int8_weights: bool, smooth: bool, t: int, g: torch.Generator) -> tuple[list[dict], dict]:
    """Random float32 layers (int8 weights with row scales, or float32 with ones) whose int8 pages hold
    a quantized random cache of CONTEXT positions and poison in the step's ``t`` slots; the
    lm_head, the final norm and the block table."""
    def linear(rows: int, cols: int) -> tuple[torch.Tensor, torch.Tensor]:
        w = torch.randn(rows, cols, generator=g) * cols**-0.5
        return quantize_int8(w) if int8_weights else (w, torch.ones(rows))

    def norm(n: int) -> torch.Tensor:
        return torch.rand(n, generator=g) + 0.5

    num_pages = (CONTEXT + t) // s.page_size + 2
    table = torch.randperm(num_pages, generator=g).int()
    step = torch.arange(CONTEXT, CONTEXT + t)
    slots = table[step // s.page_size].long(), step % s.page_size
    layers = []
    for _ in range(s.layers):
        layer = dict(input_norm=norm(s.hidden), post_norm=norm(s.hidden), q_norm=norm(s.head_dim),
                     k_norm=norm(s.head_dim))
        layer["k_smooth"] = key_smoothing(layer["k_norm"]) if smooth else None
        for kind in ("k", "v"):
            pages, scales = quantize_per_vector(torch.randn(num_pages, s.kv_heads, s.page_size, s.head_dim,
                                                            generator=g))
            pages[slots[0], :, slots[1]] = -128
            scales[slots[0], :, slots[1]] = float("nan")
            layer[f"{kind}_pages"], layer[f"{kind}_scale"] = pages, scales
        for name, rows, cols in (("qkv", s.qkv_rows, s.hidden), ("o", s.hidden, s.heads * s.head_dim),
                                 ("gate_up", 2 * s.intermediate, s.hidden), ("down", s.hidden, s.intermediate)):
            layer[f"{name}_w"], layer[f"{name}_s"] = linear(rows, cols)
        layers.append(layer)
    lm_w, lm_s = linear(s.vocab, s.hidden)
    return layers, dict(lm_w=lm_w, lm_s=lm_s, final_norm=norm(s.hidden), block_table=table)


@pytest.mark.parametrize("t, int8_weights, smooth", [(3, False, True), (1, True, False)])
def test_the_step_over_int8_pages_is_its_twin(t, int8_weights, smooth):
    s, g = shape(smooth), torch.Generator().manual_seed(10 + t)
    layers, rest = model(s, int8_weights, smooth, t, g)
    angles = torch.arange(CONTEXT + 16)[:, None] * torch.rand(s.head_dim // 2, generator=g)[None, :]
    cos, sin = angles.cos(), angles.sin()
    positions = torch.arange(CONTEXT, CONTEXT + t)
    h = torch.randn(t, s.hidden, generator=g)
    twin = [{k: None if v is None else v.clone() for k, v in layer.items()} for layer in layers]
    ref, ref_hidden = decode_step(h, twin, rest["lm_w"], rest["lm_s"], rest["final_norm"], positions,
                                  rest["block_table"], cos, sin, EPS, s.heads, s.kv_heads, s.head_dim, capture=(1,))

    bufs = StepBuffers.allocate(s, torch.float32, CPU, captures=1)
    bufs.poison()
    bufs.h[:t] = h
    first = layers[0]
    lm_s = rest["lm_s"] if int8_weights else None
    launch_persistent_step(StepPlan.build(s, CPU, capture=(1,)), s, bufs, layer_pointer_table(layers, CPU),
                           positions, rest["block_table"], cos, sin, rest["lm_w"], lm_s, rest["final_norm"],
                           first["qkv_w"], tuple(first["k_pages"].stride()[:3]), EPS, 1, True,
                           scale_strides=tuple(first["k_scale"].stride()[:2]))
    torch.testing.assert_close(bufs.logits[:t], ref, **TOL)
    torch.testing.assert_close(bufs.capture[0, :t], ref_hidden[0], **TOL)
    for mine, theirs in zip(layers, twin):
        for kind in ("k", "v"):
            assert torch.equal(mine[f"{kind}_pages"], theirs[f"{kind}_pages"]), kind
            torch.testing.assert_close(mine[f"{kind}_scale"], theirs[f"{kind}_scale"], **TOL)
    assert not bufs.counters.any()
