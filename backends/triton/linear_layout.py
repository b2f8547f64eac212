"""The int8 weight layouts of :func:`linear.linear` (``int8_layout``; defined by the twin,
backends/reference/linear.py: ``rows``, and ``fragments``, each row's groups of 64 columns in the
order a thread's MMA register fragment reads them, :func:`pack_fragments`) as the kernels read
them: the device functions that put a tile of ``fragments`` bytes back in column order, or an
activation tile in the weights' order.

- The GEMMs (linear_gemm.py, linear_gemm_persistent.py) load a ``[BLOCK_N, BLOCK_K]`` weight tile as
  stored and put it in column order (:func:`rows_of_fragments`) before the conversion and the dot:
  the same dot as on ``rows``, the same bits. Built for sm_90, the reshape and permute cost no
  instruction: a thread's 16 bytes of a row are the 16 its HGMMA register fragment holds, read by
  one 16-byte shared-memory load (``LDS.128``) where ``rows`` takes eight 2-byte ones.
- The GEMV (linear_gemv.py) multiplies the stored weight tile by the activations put in the
  weights' order (:func:`in_fragment_order`): the same products, summed in another order than on
  ``rows`` (not bit for bit: the float32 sums of the same exact products, the error bound of any
  order, tests/backends/triton/test_linear_layout.py).

BLOCK_K must be a multiple of 64 (a chunk holds whole groups), K too (the layout has no partial
group), so that a mask on the stored columns is the mask on the logical ones.
"""

from __future__ import annotations

import triton
import triton.language as tl

from tileinfer.backends.reference.linear import FRAGMENT_K, INT8_LAYOUTS, pack_fragments, unpack_fragments


@triton.jit
def rows_of_fragments(b, BLOCK_K: tl.constexpr):
    """A ``[R, BLOCK_K]`` tile of ``fragments`` bytes (or of values converted from them) in column
    order: byte ``16 t + 4 s + 2 h + l`` of a group is column ``16 s + 8 h + 2 t + l``."""
    R: tl.constexpr = b.shape[0]
    b = tl.reshape(b, (R, BLOCK_K // 64, 4, 4, 2, 2))
    return tl.reshape(tl.permute(b, (0, 1, 3, 4, 2, 5)), (R, BLOCK_K))


@triton.jit
def in_fragment_order(x, BLOCK_K: tl.constexpr):
    """An activation tile ``[BLOCK_K]`` or ``[R, BLOCK_K]`` in column order put in the order of a
    ``fragments`` weight chunk (the inverse of :func:`rows_of_fragments`), so that ``x * w`` pairs
    each stored weight with its column's activation."""
    if len(x.shape) == 1:
        x = tl.reshape(tl.permute(tl.reshape(x, (BLOCK_K // 64, 4, 2, 4, 2)), (0, 3, 1, 2, 4)), (BLOCK_K,))
    else:
        R: tl.constexpr = x.shape[0]
        x = tl.reshape(x, (R, BLOCK_K // 64, 4, 2, 4, 2))
        x = tl.reshape(tl.permute(x, (0, 1, 4, 2, 3, 5)), (R, BLOCK_K))
    return x


def check_layout(int8_layout: str, int8: bool, K: int, block_k: int) -> bool:
    """Whether the launch reads ``fragments``: ``int8_layout`` valid, ``fragments`` only for int8
    weights with K and the chunk ``block_k`` multiples of 64 (AssertionError naming what is not)."""
    assert int8_layout in INT8_LAYOUTS, f"int8_layout is one of {', '.join(INT8_LAYOUTS)}, got {int8_layout!r}"
    if int8_layout == "rows":
        return False
    assert int8, "int8_layout='fragments' is a layout of int8 weights (pass their scale)"
    assert K % FRAGMENT_K == 0, f"int8_layout='fragments' takes K a multiple of {FRAGMENT_K}, got {K}"
    assert block_k % FRAGMENT_K == 0, f"int8_layout='fragments' takes block_k a multiple of {FRAGMENT_K}, got {block_k}"
    return True


__all__ = ["FRAGMENT_K", "INT8_LAYOUTS", "check_layout", "in_fragment_order", "pack_fragments", "rows_of_fragments",
           "unpack_fragments"]
