"""A toy of the split-KV decode attention's key loop over int8 KV pages (issue 28) for byte orders of a
page made for the MMA operands, built for sm_90a on any machine (bench/sm90_build.py; no GPU, no run):
``python -m bench.kv_layout_toy`` prints, per layout, the instructions per key-loop iteration (one
64-key tile) of one warp, the one-byte shared loads (``LDS.U8``), the shared-memory stores and loads
of the loop (round trips of a tile between layouts), registers and spills, and the same for the
engine's decode kernel (``_paged_decode_kernel``, 1 token) as a check that the toy's slot-major loop
is the engine's.

Tiling and grid: the engine's decode rule at Qwen3-4B's attention (head_dim 128, 4 query heads per kv
head padded to BLOCK_M = 16 rows, BLOCK_N = 64 keys = one page of 64 slots, 4 warps, 3 stages),
grid ``(num_kv_heads, splits)``: a program scans the ``n_tiles`` pages of its split (row ``split`` of
the block table ``[splits, n_tiles]``) for its kv head with the online softmax of
``attend_tiles_int8`` (paged_attention_tiles.py, unmasked: every key is visible) and writes ``acc /
l`` float32 ``[GROUP, D]`` of its split (no combine: the splits stand for the decode kernel's). Byte orders of a
page's ``[64, D]`` int8 block of a kv head (K_LAYOUT, V_LAYOUT; the per-vector scales stay
``[P, Hkv, 64]``):

- K_LAYOUT 0 ``rows`` (today's): slot-major, ``[64, D]`` (for ``Q K^T`` the keys are the B operand,
  k = head_dim: a key's bytes are already k-contiguous). 1 ``pairs``: each key's D bytes in the order
  a thread's ``mma.m16n8k16`` B fragment reads them (byte ``16t + 4s + 2h + l`` of each 64 dims holds
  dim ``16s + 8h + 2t + l``: ``pack_fragments`` of the W8A16 layout, backends/reference/linear.py).
  2 ``quads``: the order of the operand Triton 3.6 builds from an 8-bit source (``kWidth = 4``: a
  thread's k are ``4t .. 4t + 3`` of each 16; byte ``16t + 4s + j`` holds dim ``16s + 4t + j``).
- V_LAYOUT 0 ``rows`` (today's; for ``P V`` the values are B with k = keys: a thread's bytes lie
  ``D`` apart). 1 ``columns``: the page's block transposed, ``[D, 64]`` (a dim's 64 keys contiguous).
  2 ``columns_pairs``, 3 ``columns_quads``: transposed, each dim's 64 keys in that order.

Each tile is put back in the dot's order in registers by a reshape and a permute (and a transpose
for the transposed V), so that every layout computes the same attention. :func:`pack_pages` makes a
layout's pages from slot-major ones.

Every figure is the compiler's, never a measurement; ``python -m bench.kv_layout_toy --time`` (a GPU)
times the candidates (:func:`time_layouts`).
"""

from __future__ import annotations

import sys

import torch
import triton
import triton.language as tl

from . import sm90_build
from .gemm_build import grouped

K_LAYOUTS = {0: "rows", 1: "pairs", 2: "quads"}
V_LAYOUTS = {0: "rows", 1: "columns", 2: "columns_pairs", 3: "columns_quads"}
HEAD_DIM, GROUP, PAGE, KV_HEADS = 128, 4, 64, 8  # Qwen3-4B: 32 q heads, 8 kv heads


I8_TO_F16 = tl.constexpr(
    "{ .reg .b32 t, m; xor.b32 t, $2, 0x80808080; mov.b32 m, 0x64806480; prmt.b32 $0, t, 0x64646464, 0x5140; "
    "prmt.b32 $1, t, 0x64646464, 0x7362; sub.f16x2 $0, $0, m; sub.f16x2 $1, $1, m; }")


@triton.jit
def _convert(x, DTYPE: tl.constexpr, CONVERT: tl.constexpr):
    """An int8 tile in DTYPE: Triton's cast (CONVERT 0), or float16 from ``0x6400 | (x ^ 0x80)`` (1024 +
    128 + x, exact) minus 1152, two bytes a ``prmt`` and two values a ``sub.f16x2`` (CONVERT 1)."""
    if CONVERT == 0:
        y = x.to(DTYPE)
    else:
        y = tl.inline_asm_elementwise(I8_TO_F16, "=r,=r,r", [x], dtype=tl.float16, is_pure=True, pack=4)
    return y


@triton.jit
def _unpack(x, ROWS: tl.constexpr, COLS: tl.constexpr, ORDER: tl.constexpr):
    """A ``[ROWS, COLS]`` tile whose rows are in ORDER (per 64 columns; 1 pairs, 2 quads) back in column order."""
    if ORDER == 1:
        y = tl.reshape(tl.permute(tl.reshape(x, (ROWS, COLS // 64, 4, 4, 2, 2)), (0, 1, 3, 4, 2, 5)), (ROWS, COLS))
    else:
        y = tl.reshape(tl.permute(tl.reshape(x, (ROWS, COLS // 64, 4, 4, 4)), (0, 1, 3, 2, 4)), (ROWS, COLS))
    return y


@triton.jit
def _toy_kernel(q_ptr, k_ptr, v_ptr, ks_ptr, vs_ptr, bt_ptr, out_ptr, n_tiles, stride_p, stride_sp, qk_scale,
                GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                K_LAYOUT: tl.constexpr, V_LAYOUT: tl.constexpr, CONVERT: tl.constexpr, DOT_PRECISION: tl.constexpr):
    head = tl.program_id(0)
    split = tl.program_id(1)
    bt_ptr += split * n_tiles
    out_ptr += split * tl.num_programs(0) * GROUP * HEAD_DIM
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    offs_n = tl.arange(0, BLOCK_N)
    q = tl.load(q_ptr + (head * GROUP + offs_m)[:, None] * HEAD_DIM + offs_d[None, :],
                mask=(offs_m < GROUP)[:, None], other=0.0)
    if CONVERT == 1:  # both dots in float16
        q = q.to(tl.float16)
    k_base = k_ptr + head * BLOCK_N * HEAD_DIM
    v_base = v_ptr + head * BLOCK_N * HEAD_DIM
    rows = offs_n[:, None] * HEAD_DIM + offs_d[None, :]  # [BLOCK_N, D], slot-major
    cols = offs_d[:, None] * BLOCK_N + offs_n[None, :]  # [D, BLOCK_N], transposed
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    page = tl.load(bt_ptr).to(tl.int64)
    for i in tl.range(0, n_tiles):
        k = _convert(tl.load(k_base + page * stride_p + rows), q.dtype, CONVERT)
        if K_LAYOUT != 0:
            k = _unpack(k, BLOCK_N, HEAD_DIM, K_LAYOUT)
        if V_LAYOUT == 0:
            v = _convert(tl.load(v_base + page * stride_p + rows), q.dtype, CONVERT)
        else:
            vt = _convert(tl.load(v_base + page * stride_p + cols), q.dtype, CONVERT)
            if V_LAYOUT != 1:
                vt = _unpack(vt, HEAD_DIM, BLOCK_N, V_LAYOUT - 1)
            v = tl.trans(vt)
        k_scale = tl.load(ks_ptr + page * stride_sp + head * BLOCK_N + offs_n)
        v_scale = tl.load(vs_ptr + page * stride_sp + head * BLOCK_N + offs_n)
        page = tl.load(bt_ptr + i + 1, mask=i + 1 < n_tiles, other=0).to(tl.int64)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * (k_scale * qk_scale)[None, :]
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.math.exp2(s - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        pv = (p * (v_scale * 128.0)[None, :]).to(q.dtype)
        acc = acc * alpha[:, None] + tl.dot(pv, v, input_precision=DOT_PRECISION) * (1.0 / 128.0)
        m_i = m_new
    out = acc / l_i[:, None]
    tl.store(out_ptr + (head * GROUP + offs_m)[:, None] * HEAD_DIM + offs_d[None, :], out,
             mask=(offs_m < GROUP)[:, None])


def _order(x: torch.Tensor, order: str) -> torch.Tensor:
    """Rows of ``x`` ``[..., C]`` (C a multiple of 64) with each 64 columns in ``order``: ``pairs`` (byte
    ``16t + 4s + 2h + l`` holds column ``16s + 8h + 2t + l``: ``pack_fragments``), ``quads`` (byte
    ``16t + 4s + j`` holds column ``16s + 4t + j``)."""
    from tileinfer.backends.reference.linear import pack_fragments

    c = x.shape[-1]
    if order == "pairs":
        return pack_fragments(x.reshape(-1, c)).reshape(x.shape)
    assert order == "quads", order
    return x.reshape(-1, c // 64, 4, 4, 4).permute(0, 1, 3, 2, 4).reshape(x.shape)


def pack_pages(pages: torch.Tensor, layout: str) -> torch.Tensor:
    """Slot-major int8 pages ``[P, Hkv, 64, D]`` (D a multiple of 64) in ``layout``: ``rows`` (as
    they are), ``pairs`` / ``quads`` (each key's D bytes in that order, :func:`_order`), ``columns``
    (each page's block of a kv head transposed, ``[D, 64]``), ``columns_pairs`` / ``columns_quads``
    (transposed, each dim's 64 keys in that order); returned contiguous with the pages' shape
    ``[P, Hkv, 64, D]`` (the bytes of a page and kv head in the layout's order)."""
    p, h, n, d = pages.shape
    if layout in ("rows", "pairs", "quads"):
        return pages.contiguous() if layout == "rows" else _order(pages, layout).contiguous()
    t = pages.transpose(2, 3)  # [P, Hkv, D, 64]
    if layout != "columns":
        t = _order(t.contiguous(), layout.removeprefix("columns_"))
    return t.contiguous().reshape(p, h, n, d)


def page_layouts(k_layout: int, v_layout: int) -> tuple[str, str]:
    """The :func:`pack_pages` layouts of the K and V pages for K_LAYOUT, V_LAYOUT."""
    return K_LAYOUTS[k_layout], V_LAYOUTS[v_layout]


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_scale: torch.Tensor, v_scale: torch.Tensor,
           block_table: torch.Tensor, scale: float, k_layout: int, v_layout: int, convert: int = 0) -> torch.Tensor:
    """The toy's attention of ``q`` ``[Hkv * GROUP, D]`` over the pages each row of ``block_table``
    ``[S, n]`` names (one split a row), K and V in the layouts (already packed: :func:`pack_pages`),
    scales ``[P, Hkv, 64]``: float32 ``[S, Hkv * GROUP, D]`` (launched on q's device; the
    interpreter's on the CPU). ``convert`` 1 (a GPU only: inline PTX): float16 dots, ``prmt``."""
    hkv = k.shape[1]
    out = torch.full((block_table.shape[0], q.shape[0], q.shape[1]), float("nan"), dtype=torch.float32,
                     device=q.device)
    precision = "ieee" if q.dtype == torch.float32 else "tf32"
    group = q.shape[0] // hkv
    _toy_kernel[(hkv, block_table.shape[0])](
        q, k, v, k_scale, v_scale, block_table, out, block_table.shape[1], k.stride(0), k_scale.stride(0),
        scale * 1.4426950408889634, GROUP=group, HEAD_DIM=q.shape[1], BLOCK_M=max(16, triton.next_power_of_2(group)),
        BLOCK_N=k.shape[2], K_LAYOUT=k_layout, V_LAYOUT=v_layout, CONVERT=convert, DOT_PRECISION=precision,
        num_warps=4, num_stages=3)
    return out


def key_loop(build: sm90_build.Build) -> dict:
    """The innermost SASS loop holding the ``mma`` instructions (HMMA): its instructions, one-byte
    shared loads, shared stores and loads by width, and the groups of bench/gemm_build.py; with the
    build's registers and spills."""
    loops = sm90_build.innermost(build.sass, "HMMA")
    assert len(loops) == 1, f"expected one key loop, found {len(loops)}"
    ops = sm90_build.opcodes(build.sass, loops[0])
    g = grouped(ops)
    return dict(instructions=sum(ops.values()), lds_u8=ops.get("LDS.U8", 0), shared_loads=g["shared_loads"],
                shared_stores=g["shared_stores"], global_loads={o: n for o, n in ops.items() if o.startswith("LDG")},
                hmma=sum(n for o, n in ops.items() if o.startswith("HMMA")), conversion=sum(g["conversion"].values()),
                moves=sum(g["moves"].values()), registers=build.registers, spill_stores=build.spill_stores,
                spill_loads=build.spill_loads, shared_bytes=build.shared_bytes)


def build(k_layout: int, v_layout: int, tiles: int = 512, convert: int = 0) -> dict:
    """The toy at Qwen3-4B's decode attention (1 token, 8 kv heads, ``tiles`` pages a head, bfloat16
    q; ``convert`` 1: float16 dots, the tiles converted by ``prmt``) built for sm_90a: :func:`key_loop`
    of it."""
    meta = dict(device="meta")
    q = torch.empty(KV_HEADS * GROUP, HEAD_DIM, dtype=torch.bfloat16, **meta)
    pages = torch.empty(tiles, KV_HEADS, PAGE, HEAD_DIM, dtype=torch.int8, **meta)
    scales = torch.empty(tiles, KV_HEADS, PAGE, dtype=torch.float32, **meta)
    bt = torch.empty(32, tiles, dtype=torch.int32, **meta)
    out = torch.empty(KV_HEADS * GROUP, HEAD_DIM, dtype=torch.float32, **meta)
    b = sm90_build.compile_launch(_toy_kernel, (q, pages, pages, scales, scales, bt, out, tiles, pages.stride(0),
                                                scales.stride(0), 0.1), dict(
        GROUP=GROUP, HEAD_DIM=HEAD_DIM, BLOCK_M=16, BLOCK_N=PAGE, K_LAYOUT=k_layout, V_LAYOUT=v_layout,
        CONVERT=convert, DOT_PRECISION="tf32", num_warps=4, num_stages=3))
    return key_loop(b)


def engine_build(int8: bool = True, splits: int = 32) -> dict:
    """The engine's ``_paged_decode_kernel`` as ``launch_decode`` launches it for 1 token at Qwen3-4B
    (int8 pages with scales, or bf16 pages), built for sm_90a: :func:`key_loop` of its unmasked key loop
    (the first of the loops holding HMMA: the masked tail's loop follows it)."""
    from tileinfer.backends.triton.paged_attention import _decode_config
    from tileinfer.backends.triton.paged_attention_decode import _paged_decode_kernel

    meta = dict(device="meta")
    h, pages_n = KV_HEADS * GROUP, 512
    q = torch.empty(1, h, HEAD_DIM, dtype=torch.bfloat16, **meta)
    pages = torch.empty(pages_n, KV_HEADS, PAGE, HEAD_DIM, dtype=torch.int8 if int8 else torch.bfloat16, **meta)
    sc = torch.empty(pages_n, KV_HEADS, PAGE, dtype=torch.float32, **meta)
    bt = torch.empty(1, pages_n, dtype=torch.int32, **meta)
    pos = torch.empty(1, dtype=torch.int32, **meta)
    part = torch.empty(1, h, splits, HEAD_DIM, dtype=torch.float32, **meta)
    stats = torch.empty(1, h, splits, dtype=torch.float32, **meta)
    args = (q, pages, pages, bt, q, sc, sc, q, part, stats, stats, q.stride(0), q.stride(1), *pages.stride()[:3],
            *pages.stride()[:3], q.stride(0), q.stride(1), sc.stride(0), sc.stride(1), 1, pos, 0.1, splits)
    kw = dict(NUM_HEADS=h, SINGLE_SPLIT=False, CAUSAL=True, KV_INT8=int8, SMOOTH=False, GROUP=GROUP, HEAD_DIM=HEAD_DIM,
              PAGE_SIZE=PAGE, BLOCK_M=16, UPCAST=False, DOT_PRECISION="tf32", PDL=False,
              **_decode_config(GROUP, HEAD_DIM, int8), enable_fp_fusion=True)
    b = sm90_build.compile_launch(_paged_decode_kernel, args, kw)
    loops = sorted(sm90_build.innermost(b.sass, "HMMA"), key=lambda r: r.start)
    sub = sm90_build.Build(**{**b.__dict__, "sass": "\n".join(b.sass.splitlines()[:loops[0].stop])})
    return key_loop(sub)


CANDIDATES = [(0, 0, 0), (0, 1, 0), (0, 3, 0), (0, 0, 1), (0, 1, 1), (2, 3, 1)]  # (K_LAYOUT, V_LAYOUT, CONVERT)


def time_layouts(context: int = 32768, splits: int = 32, layers: int = 8, seed: int = 0) -> list[dict]:
    """On a GPU: the toy at Qwen3-4B's decode attention (8 kv heads, 1 token) over ``context`` keys in
    ``splits`` splits, for each of CANDIDATES; ``layers`` launches a timed call, each over its own pages
    (as the step's layers: no L2 reuse between them), replayed from a CUDA graph. Per candidate: the
    median microseconds a launch, GB/s of the pages' bytes (int8 K and V and their float32 scales) and
    that over the copy bandwidth of the same run (bytes read and written a second); each candidate's
    output is first checked against the slot-major cast's (float16 against bfloat16 products: 2e-2)."""
    from .timing import copy_bandwidth, graph_seconds

    dev = torch.device("cuda")
    tiles = context // PAGE
    g = torch.Generator(device=dev).manual_seed(seed)
    shape = (tiles, KV_HEADS, PAGE, HEAD_DIM)
    pools = [(torch.randint(-127, 128, shape, dtype=torch.int8, device=dev, generator=g),
              torch.randint(-127, 128, shape, dtype=torch.int8, device=dev, generator=g),
              torch.rand(shape[:3], device=dev, generator=g) * 0.02,
              torch.rand(shape[:3], device=dev, generator=g) * 0.02)
             for _ in range(layers)]
    bt = torch.randperm(tiles, device=dev, generator=g).to(torch.int32).reshape(splits, tiles // splits)
    q = torch.randn(KV_HEADS * GROUP, HEAD_DIM, device=dev, generator=g).to(torch.bfloat16)
    scale = HEAD_DIM ** -0.5
    base = attend(q, *pools[0][:2], *pools[0][2:], bt, scale, 0, 0)
    page_bytes = 2 * pools[0][0].numel() + 2 * 4 * pools[0][2].numel()
    bandwidth = copy_bandwidth(dev)
    out = []
    for kl, vl, convert in CANDIDATES:
        names = page_layouts(kl, vl)
        packed = [(pack_pages(k, names[0]), pack_pages(v, names[1]), ks, vs) for k, v, ks, vs in pools]
        got = attend(q, *packed[0], bt, scale, kl, vl, convert)
        torch.testing.assert_close(got, base, rtol=2e-2, atol=2e-2)
        seconds = graph_seconds(lambda: [attend(q, *p, bt, scale, kl, vl, convert) for p in packed], calls=layers)
        out.append(dict(k_layout=names[0], v_layout=names[1], convert=("cast", "prmt_f16")[convert],
                        us=seconds * 1e6, gb_s=page_bytes / seconds / 1e9,
                        of_copy=page_bytes / seconds / bandwidth))
        del packed
    return out


def describe(r: dict) -> str:
    return (f"{r['instructions']} instructions, {r['hmma']} HMMA, LDS.U8 {r['lds_u8']}, shared loads "
            f"{r['shared_loads']}, shared stores {r['shared_stores']}, global loads {r['global_loads']}, conversion "
            f"{r['conversion']}, moves {r['moves']}; {r['registers']} registers, spills {r['spill_stores']}/"
            f"{r['spill_loads']} B, {r['shared_bytes']} B shared")


def main() -> None:
    if "--time" in sys.argv:
        print(f"measured ({torch.cuda.get_device_name()}): 32k keys, 32 splits, 8 kv heads, a launch")
        for r in time_layouts():
            print(f"K {r['k_layout']}, V {r['v_layout']}, {r['convert']}: {r['us']:.1f} us, {r['gb_s']:.0f} GB/s, "
                  f"{100 * r['of_copy']:.1f} % of the copy bandwidth")
        return
    print("compiler figures (sm_90a build, no GPU): the key loop per 64-key tile, one warp")
    for int8 in (False, True):
        print(f"engine decode kernel, {'int8' if int8 else 'bf16'} pages: {describe(engine_build(int8))}")
    for convert, name in ((0, "Triton's cast to bfloat16"), (1, "float16 dots, prmt conversion")):
        for kl in K_LAYOUTS:
            for vl in V_LAYOUTS:
                print(f"toy, K {K_LAYOUTS[kl]}, V {V_LAYOUTS[vl]}, {name}: {describe(build(kl, vl, convert=convert))}")


if __name__ == "__main__":
    main()
