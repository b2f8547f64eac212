"""dequantize_int8 (backends/triton/int8_dequant.py) against its twin (backends/reference/
int8_dequant.py): bit for bit (the values of int8 are exact in every float dtype), on odd shapes
(neither N a multiple of BLOCK_N nor K of BLOCK_K), int8 over the whole range [-128, 127], in both
int8 layouts, into an output poisoned with NaN before the launch and into a view of a larger buffer
(the scratch of ``options.triton.int8_prefill_dequant``)."""

from __future__ import annotations

import pytest
import torch

from tileinfer.backends.reference.int8_dequant import dequantize_int8 as ref_dequantize_int8
from tileinfer.backends.reference.linear import pack_fragments
from tileinfer.backends.triton.int8_dequant import dequantize_int8

from ..kernel_checks import DEVICE, generator, poisoned

DTYPES = [torch.float16, torch.float32, torch.bfloat16]  # no dot: the interpreter's elementwise bf16 casts are exact
SHAPES = [(1, 1), (37, 300), (67, 129), (200, 520)]


def int8_weight(n: int, k: int, *key) -> torch.Tensor:
    g = generator("dequant", n, k, *key)
    q = torch.randint(-128, 128, (n, k), generator=g, device=DEVICE, dtype=torch.int8)
    q.view(-1)[:2] = torch.tensor([-128, 127], dtype=torch.int8)[:q.numel()]  # both ends of the range
    return q


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_rows_match_the_twin_bit_for_bit(shape, dtype):
    q = int8_weight(*shape, dtype)
    out = poisoned(shape, dtype)
    assert dequantize_int8(q, dtype, out=out) is out
    expected = ref_dequantize_int8(q, dtype)
    assert torch.equal(out, expected) and torch.equal(out.float(), q.float())


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("shape", [(37, 320), (5, 64)], ids=str)
def test_fragments_are_written_as_rows(shape, dtype):
    q = int8_weight(*shape, "frag", dtype)
    packed = pack_fragments(q)
    out = poisoned(shape, dtype)
    dequantize_int8(packed, dtype, out=out, int8_layout="fragments")
    assert torch.equal(out, ref_dequantize_int8(packed, dtype, int8_layout="fragments"))
    assert torch.equal(out, q.to(dtype))


def test_into_a_view_of_a_larger_buffer_leaves_the_rest():
    q = int8_weight(67, 129, "view")
    scratch = poisoned((67 * 129 + 50,), torch.float16)
    view = scratch[:q.numel()].view(q.shape)
    dequantize_int8(q, torch.float16, out=view)
    assert torch.equal(view, q.half()) and scratch[q.numel():].isnan().all()


def test_refuses_what_it_cannot_write():
    q = int8_weight(4, 96, "bad")
    with pytest.raises(AssertionError, match="K a multiple of 64"):
        dequantize_int8(q, torch.float16, int8_layout="fragments")
    with pytest.raises(AssertionError, match=r"out must be \[4, 96\]"):
        dequantize_int8(q, torch.float16, out=torch.empty(4, 96, dtype=torch.float32, device=DEVICE))
    with pytest.raises(AssertionError, match="q must be int8"):
        dequantize_int8(q.half(), torch.float16)
