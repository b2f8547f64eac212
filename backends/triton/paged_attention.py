"""GQA flash attention (causal, or not: ``causal=False``) read in place from the paged KV cache; twin:
backends/reference/paged_attention.py (``causal_attention`` over ``gather_pages``).

Two paths, both through the block table (one page lookup per key tile when ``BLOCK_N <=
page_size``, one per key otherwise, so any power-of-two page size works), nothing gathered:
:func:`paged_prefill_attention` (any T; the kernel of paged_attention_prefill.py) and
:func:`paged_decode_attention` (1..16 new tokens: a decode step or the verification of speculative
drafts; the split-KV kernels of paged_attention_decode.py, ``decode_splits`` picks 16 splits for
long contexts, fewer below 2,048 positions). This module checks the arguments, picks the block
sizes and launches. Both share the online-softmax tile loop of paged_attention_tiles.py: ``exp2`` with
``log2(e)`` folded into the scale, float32 accumulation, ``P`` cast to the K/V dtype for the second
``tl.dot``. Under the Triton interpreter bfloat16 tiles are cast to float32 after loading (the
interpreter mis-computes bf16 dots); float32 data gets exact dots instead of TF32 on the GPU.

Programmatic dependent launch (``pdl=True``, Hopper; pdl.py), all kernels: a program lets the next
kernel launch and then waits for the one before, first thing (q, the pages, the block table and
the positions may all be outputs of earlier kernels or copies). Same bits either way.
"""

from __future__ import annotations

import torch
import triton

from tileinfer.backends.triton import FLOAT_DTYPES, SMALL_STEP_MAX_TOKENS
from tileinfer.backends.triton.interpreter import interpreted
from tileinfer.backends.triton.paged_attention_decode import launch_decode
from tileinfer.backends.triton.paged_attention_int8 import Int8Pages, check_int8_pages, int8_pages
from tileinfer.backends.triton.paged_attention_prefill import PrefillTiles, prefill_launch
from tileinfer.backends.triton.pdl import use_pdl

LOG2E = 1.4426950408889634
DECODE_MAX_SPLITS = 16  # the default for long contexts
DECODE_MAX_SPLITS_INT8 = 32  # int8 pages: each program converts its tiles, more of them hide it
DECODE_MIN_KEYS_PER_SPLIT = 128


def decode_splits(context_len: int, int8: bool = False) -> int:
    """Default split count of the decode kernel for ``context_len`` cached positions (``int8``:
    over int8 pages).

    ``min(16, context_len // 128)``, at least 1: every split scans at least 128 keys (two 64-key
    tiles), and long contexts use 16 splits, which with Qwen3's 8 kv heads gives 128 programs, about
    one per multiprocessor of an H100/H200 (132). A program streams K/V at about 15-30 GB/s, so the
    split count sets the bandwidth. Measured on an H200, Qwen3-4B, one new token: 32k context,
    8 splits 26 %, 16 splits 64 %, 32 splits 63 % of the copy bandwidth; 8k context, 16 splits
    21.5 us, 32 splits 22.4 us; 1k context, 8 splits 12.7 us, 16 splits 12.1 us, 4 splits ~17 us.

    Int8 pages: up to 32 splits. A program converts each int8 tile and scales it in registers, so
    it streams fewer bytes per second than over bf16 pages and the grid needs more programs: 32k
    context, 64-key tiles, 16 splits 52.5 us, 32 splits 44.4 us for one new token, 66.6 and 56.2 us
    for 16 (attention@1636032 in bench/results/NVIDIA-H200/records.jsonl).
    """
    most = DECODE_MAX_SPLITS_INT8 if int8 else DECODE_MAX_SPLITS
    return max(1, min(most, context_len // DECODE_MIN_KEYS_PER_SPLIT))


def _check_inputs(q: torch.Tensor, k_pages: torch.Tensor, v_pages: torch.Tensor, block_table: torch.Tensor,
                  start: int, out: torch.Tensor | None, quant: Int8Pages | None = None
                  ) -> tuple[int, int, int, int, int]:
    """Shared asserts; returns ``(T, H, D, num_kv_heads, page_size)``."""
    assert q.dim() == 3, f"q must be [T, H, D], got {tuple(q.shape)}"
    t, h, d = q.shape
    assert k_pages.dim() == 4 and k_pages.shape == v_pages.shape, (
        f"k_pages/v_pages must be [num_pages, Hkv, page_size, D] alike, got {tuple(k_pages.shape)} "
        f"and {tuple(v_pages.shape)}")
    _, hkv, page_size, dk = k_pages.shape
    assert dk == d, f"head_dim of q ({d}) and of the pages ({dk}) differ"
    assert d >= 16 and d & (d - 1) == 0, f"head_dim must be a power of two >= 16, got {d}"
    assert page_size >= 16 and page_size & (page_size - 1) == 0, (
        f"page_size must be a power of two >= 16, got {page_size}")
    assert h % hkv == 0, f"{h} q heads are not a multiple of {hkv} kv heads"
    assert q.dtype in FLOAT_DTYPES, f"unsupported dtype {q.dtype}"
    if quant is None:
        assert k_pages.dtype == q.dtype and v_pages.dtype == q.dtype, (
            f"pages must be in q's dtype {q.dtype}, got {k_pages.dtype}/{v_pages.dtype}")
    else:
        check_int8_pages(quant, k_pages, v_pages)
    assert q.device == k_pages.device == v_pages.device == block_table.device, "tensors on different devices"
    assert q.stride(2) == 1 and k_pages.stride(3) == 1 and v_pages.stride(3) == 1, "head_dim must be contiguous"
    assert t >= 1 and start >= 0, f"need T >= 1 and start >= 0, got T={t}, start={start}"
    assert block_table.dim() == 1 and block_table.dtype == torch.int32 and block_table.stride(0) == 1, (
        "block_table must be a contiguous 1-D int32 tensor")
    needed = -(-(start + t) // page_size)
    assert block_table.numel() >= needed, f"block_table holds {block_table.numel()} pages, {needed} needed"
    if out is not None:
        assert out.shape == q.shape and out.dtype == q.dtype and out.device == q.device, (
            f"out must be {tuple(q.shape)} {q.dtype}, got {tuple(out.shape)} {out.dtype}")
        assert out.stride(2) == 1, "out's head_dim must be contiguous"
    return t, h, d, hkv, page_size


def _kernel_flags(dtype: torch.dtype, device: torch.device) -> tuple[bool, str]:
    """(UPCAST, DOT_PRECISION): bf16 tiles go to fp32 under the interpreter (its bf16 dot is wrong);
    fp32 data gets exact dots instead of TF32 on GPU."""
    upcast = interpreted(device) and dtype == torch.bfloat16
    precision = "ieee" if dtype == torch.float32 or upcast else "tf32"
    return upcast, precision


# Key tiles over int8 pages. The conversion and the scales take registers: compiled for sm_90a
# (Qwen3-4B shape, 4 warps, 3 stages), the int8 decode kernel spills 8 bytes with 64-key tiles and
# none with 32, the int8 prefill 296 bytes with 64 and 36 with 32. Timed on an H200 at 32k
# (bench/kernels/paged_attention.py --kv int8 --int8-tiles 32,64), the decode kernel is faster
# with 64 keys all the same, at every split count (16 splits: 52.5 against 68.1 us); the prefill's
# tile was not timed.
INT8_BLOCK_N = 32  # the prefill's
INT8_DECODE_BLOCK_N = 64


def _prefill_config(rows: int, head_dim: int, kv_int8: bool = False) -> PrefillTiles:
    """The rule's tiles of the prefill kernel for ``rows = T * G`` query rows.

    H200, Qwen3-4B shape, T = 1,024: BLOCK_M 64 x BLOCK_N 64, 4 warps, 3 stages gave 261 TFLOP/s
    from start 0 and 446 from start 4,096, against 204 / 365 for 128 x 128 with 8 warps. From
    :data:`LARGE_PREFILL_ROWS` rows at head_dim 128 over model-dtype pages, ``PREFILL_SHAPES["128x64"]``
    (the same bits: the key tile and so each row's sums are the rule's): H100, Qwen3-4B, prompts in
    4,096-token chunks (16,384 rows), attention 1,119 against 1,196 us at 8,192 tokens and 17,678
    against 19,551 at 32,768; the engine's prefill 149.3 against 153.8 ms and 1,100 against 1,172.
    Int8 pages: :data:`INT8_BLOCK_N` keys.
    """
    if rows >= LARGE_PREFILL_ROWS and head_dim == 128 and not kv_int8:
        return PREFILL_SHAPES["128x64"]
    block_m = min(64, max(16, triton.next_power_of_2(rows)))
    return PrefillTiles(block_m, INT8_BLOCK_N if kv_int8 else 64, num_warps=4, num_stages=3)


LARGE_PREFILL_ROWS = 16384  # the measured size: a 4,096-token chunk of 4 query heads a kv head


# Named prefill tile shapes (``prefill_tiles``; options.triton.prefill_tiles): FA3's at head_dim 128 (128
# query rows, 8 warps: two warpgroups of 64); the rule takes 128x64 for large chunks. H100, Qwen3-4B's
# attention, an 8,192-token prompt in 4,096-token chunks over pages of 64: 128x64 1,119 us against 64 x 64's
# 1,196 (same bits), 128x128 1,405 (max diff 7.8e-3).
PREFILL_SHAPES = {
    "128x64": PrefillTiles(128, 64, num_warps=8, num_stages=3),
    "128x128": PrefillTiles(128, 128, num_warps=8, num_stages=2),
}


def prefill_tiles(rows: int, head_dim: int, kv_int8: bool = False, *, shape: str = "rule") -> PrefillTiles:
    """The prefill kernel's tiles for ``rows = T * G`` query rows: the rule's (``shape="rule"``,
    :func:`_prefill_config`) or a shape of :data:`PREFILL_SHAPES`."""
    if shape == "rule":
        return _prefill_config(rows, head_dim, kv_int8)
    valid = ", ".join(("rule", *PREFILL_SHAPES))
    assert shape in PREFILL_SHAPES, f"unknown prefill tile shape {shape!r}; valid: {valid}"
    return PREFILL_SHAPES[shape]


def _decode_config(rows: int, head_dim: int, kv_int8: bool = False) -> dict:
    """Key tile and launch options of the split-KV decode kernel for ``rows = T * G`` query rows.

    H200, 32k context, 16 splits: 64 keys, 4 warps, 3 stages (50 us) beat 2 stages (72 us), 128-key
    tiles (57 us) and 8 warps; the rows (16 or 64) hardly matter, the kernel is bound by K/V reads.
    Int8 pages: :data:`INT8_DECODE_BLOCK_N` keys.
    """
    if kv_int8:
        return dict(BLOCK_N=INT8_DECODE_BLOCK_N, num_warps=4, num_stages=3)
    return dict(BLOCK_N=64, num_warps=4, num_stages=3)


def paged_prefill_attention(q: torch.Tensor, k_pages: torch.Tensor, v_pages: torch.Tensor,
                            block_table: torch.Tensor, start: int, scale: float, *, causal: bool = True,
                            positions: torch.Tensor | None = None,
                            k_scale: torch.Tensor | None = None, v_scale: torch.Tensor | None = None,
                            k_smooth: torch.Tensor | None = None, out: torch.Tensor | None = None,
                            pdl: bool = False, tiles: PrefillTiles | None = None) -> torch.Tensor:
    """GQA attention of ``T`` new queries over the ``L = start + T`` cached positions.

    ``q`` ``[T, H, D]`` (any token/head strides, D contiguous) holds the queries of positions
    ``start .. start + T - 1``; ``k_pages``, ``v_pages`` ``[num_pages, Hkv, page_size, D]`` in q's
    dtype already hold positions ``0 .. L - 1`` (this step's K/V included), position ``p`` in page
    ``block_table[p // page_size]`` at slot ``p % page_size``. Query ``i`` sees keys
    ``0 .. start + i`` (``causal=False``: all ``L`` keys, ``Step.causal``); q head ``h`` reads kv
    head ``h // (H / Hkv)``. Scores are ``q.k * scale``, the softmax and ``P V`` accumulate in
    float32. Returns ``[T, H, D]`` in q's dtype (``out`` if given). Any T; D a power of two >= 16;
    page_size a power of two >= 16. ``pdl``: programmatic dependent launch where supported; same
    bits.

    INT8 pages (``kv_store=paged_int8``, the layout of ``LayerKV``): ``k_pages``, ``v_pages`` int8
    with ``k_scale``, ``v_scale`` ``[num_pages, Hkv, page_size]`` float32 (the value is ``int8 *
    scale``), and, if the keys were divided by it, ``k_smooth`` ``[D]`` float32 (q is multiplied by
    it and rounded to its dtype first). Tiles are converted in registers (paged_attention_int8.py).

    The kernel reads the start from ``positions[0]`` on the device (``positions``: the step's
    ``[T]`` int64 positions; made from ``start`` when not given), as the decode kernel does, so that
    a prefill step captured into a CUDA graph replays at any start (the host ``start`` is then only
    the capture's: it is checked against the block table, nothing else).

    ``tiles``: the kernel's tiles (:func:`prefill_tiles`; None: the rule's). Every choice computes
    the same attention; the key order of the online softmax, and so the roundings, may differ.
    """
    quant = int8_pages(k_scale, v_scale, k_smooth)
    t, h, d, hkv, _ = _check_inputs(q, k_pages, v_pages, block_table, start, out, quant)
    if positions is None:
        positions = torch.full((1,), start, dtype=torch.int64, device=q.device)  # a fill: capturable
    assert positions.device == q.device and positions.dtype == torch.int64, "positions must be int64 on q's device"
    if out is None:
        out = torch.empty_like(q, memory_format=torch.contiguous_format)
    group = h // hkv
    upcast, precision = _kernel_flags(q.dtype, q.device)
    if tiles is None:
        tiles = _prefill_config(t * group, d, quant is not None)
    prefill_launch(q, k_pages, v_pages, block_table, out, positions, scale * LOG2E, group, tiles, upcast, precision,
                   use_pdl(pdl, q.device), causal, quant)()
    return out


def paged_decode_attention(q: torch.Tensor, k_pages: torch.Tensor, v_pages: torch.Tensor,
                           block_table: torch.Tensor, start: int, scale: float, *,
                           positions: torch.Tensor | None = None, num_splits: int | None = None,
                           causal: bool = True, k_scale: torch.Tensor | None = None,
                           v_scale: torch.Tensor | None = None, k_smooth: torch.Tensor | None = None,
                           out: torch.Tensor | None = None, pdl: bool = False) -> torch.Tensor:
    """Split-KV (flash-decoding) version of :func:`paged_prefill_attention` for 1..16 new tokens
    (a decode step, or the verification of speculative drafts); same contract and result.

    The ``L = start + T`` positions are cut into ``num_splits`` contiguous chunks (multiples of the
    key tile; trailing splits may be empty), each scanned by one program per kv head, then merged.
    ``num_splits`` defaults to :func:`decode_splits` ``(L, int8)``.

    The kernel reads the start from ``positions[0]`` on the device (``positions``: the step's
    ``[T]`` int64 positions; made from ``start`` when not given), so that a CUDA graph captured
    once replays correctly at any start: then pass ``num_splits`` explicitly (sized for the longest
    context the graph serves), since the host ``start`` is only that of the capture.

    ``pdl``: launch the split kernel and the combine with programmatic dependent launch where
    supported; same bits. ``k_scale``, ``v_scale``, ``k_smooth``: INT8 pages, as for
    :func:`paged_prefill_attention`.
    """
    quant = int8_pages(k_scale, v_scale, k_smooth)
    t, h, d, hkv, _ = _check_inputs(q, k_pages, v_pages, block_table, start, out, quant)
    assert t <= SMALL_STEP_MAX_TOKENS, (
        f"the decode kernel takes at most {SMALL_STEP_MAX_TOKENS} new tokens, got {t}")
    if positions is None:
        positions = torch.full((1,), start, dtype=torch.int64, device=q.device)  # a fill: capturable
    assert positions.device == q.device and positions.dtype == torch.int64, "positions must be int64 on q's device"
    if num_splits is None:
        num_splits = decode_splits(start + t, quant is not None)
    assert num_splits >= 1, f"num_splits must be >= 1, got {num_splits}"
    if out is None:
        out = torch.empty_like(q, memory_format=torch.contiguous_format)
    group = h // hkv
    upcast, precision = _kernel_flags(q.dtype, q.device)
    launch_decode(q, k_pages, v_pages, block_table, out, positions, scale * LOG2E, num_splits, group,
                  _decode_config(t * group, d, quant is not None), upcast, precision, use_pdl(pdl, q.device),
                  causal, quant)
    return out


__all__ = ["PREFILL_SHAPES", "PrefillTiles", "decode_splits", "paged_decode_attention", "paged_prefill_attention",
           "prefill_tiles"]
