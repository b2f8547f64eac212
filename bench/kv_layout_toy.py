"""A toy of the split-KV decode attention's key loop over int8 KV pages (issue 28) for byte orders of a
page made for the MMA operands, built for sm_90a on any machine (bench/sm90_build.py; no GPU, no run):
``python -m bench.kv_layout_toy`` prints, per layout, the instructions per key-loop iteration (one
64-key tile) of one warp, the one-byte shared loads (``LDS.U8``), the shared-memory stores and loads
of the loop (round trips of a tile between layouts), registers and spills, and the same for the
engine's decode kernel (``_paged_decode_kernel``, 1 token) as a check that the toy's slot-major loop
is the engine's.

Tiling and grid: the engine's decode rule at Qwen3-4B's attention (head_dim 128, 4 query heads per kv
head padded to BLOCK_M = 16 rows, BLOCK_N = 64 keys = one page of 64 slots, 4 warps, 3 stages),
grid ``(num_kv_heads,)``: a program scans all ``n_tiles`` pages of its kv head (block table
``[n_tiles]``) with the online softmax of ``attend_tiles_int8`` (paged_attention_tiles.py,
unmasked: every key is visible) and writes ``acc / l`` float32 ``[GROUP, D]``. Byte orders of a
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

Every figure is the compiler's, never a measurement.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import sm90_build
from .gemm_build import grouped

K_LAYOUTS = {0: "rows", 1: "pairs", 2: "quads"}
V_LAYOUTS = {0: "rows", 1: "columns", 2: "columns_pairs", 3: "columns_quads"}
HEAD_DIM, GROUP, PAGE, KV_HEADS = 128, 4, 64, 8  # Qwen3-4B: 32 q heads, 8 kv heads


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
                K_LAYOUT: tl.constexpr, V_LAYOUT: tl.constexpr, DOT_PRECISION: tl.constexpr):
    head = tl.program_id(0)
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    offs_n = tl.arange(0, BLOCK_N)
    q = tl.load(q_ptr + (head * GROUP + offs_m)[:, None] * HEAD_DIM + offs_d[None, :],
                mask=(offs_m < GROUP)[:, None], other=0.0)
    k_base = k_ptr + head * BLOCK_N * HEAD_DIM
    v_base = v_ptr + head * BLOCK_N * HEAD_DIM
    rows = offs_n[:, None] * HEAD_DIM + offs_d[None, :]  # [BLOCK_N, D], slot-major
    cols = offs_d[:, None] * BLOCK_N + offs_n[None, :]  # [D, BLOCK_N], transposed
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    page = tl.load(bt_ptr).to(tl.int64)
    for i in tl.range(0, n_tiles):
        k = tl.load(k_base + page * stride_p + rows).to(q.dtype)
        if K_LAYOUT != 0:
            k = _unpack(k, BLOCK_N, HEAD_DIM, K_LAYOUT)
        if V_LAYOUT == 0:
            v = tl.load(v_base + page * stride_p + rows).to(q.dtype)
        else:
            vt = tl.load(v_base + page * stride_p + cols).to(q.dtype)
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
           block_table: torch.Tensor, scale: float, k_layout: int, v_layout: int) -> torch.Tensor:
    """The toy's attention of ``q`` ``[Hkv * GROUP, D]`` over the pages ``block_table`` names, K and V
    in the layouts (already packed: :func:`pack_pages`), scales ``[P, Hkv, 64]``: float32 ``[Hkv *
    GROUP, D]`` (launched on q's device; the interpreter's on the CPU)."""
    hkv = k.shape[1]
    out = torch.full((q.shape[0], q.shape[1]), float("nan"), dtype=torch.float32, device=q.device)
    precision = "ieee" if q.dtype == torch.float32 else "tf32"
    _toy_kernel[(hkv,)](q, k, v, k_scale, v_scale, block_table, out, block_table.numel(), k.stride(0),
                        k_scale.stride(0), scale * 1.4426950408889634, GROUP=q.shape[0] // hkv, HEAD_DIM=q.shape[1],
                        BLOCK_M=max(16, triton.next_power_of_2(q.shape[0] // hkv)), BLOCK_N=k.shape[2],
                        K_LAYOUT=k_layout, V_LAYOUT=v_layout, DOT_PRECISION=precision, num_warps=4, num_stages=3)
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


def build(k_layout: int, v_layout: int, tiles: int = 512) -> dict:
    """The toy at Qwen3-4B's decode attention (1 token, 8 kv heads, ``tiles`` pages a head) built for
    sm_90a: :func:`key_loop` of it."""
    meta = dict(device="meta")
    q = torch.empty(KV_HEADS * GROUP, HEAD_DIM, dtype=torch.bfloat16, **meta)
    pages = torch.empty(tiles, KV_HEADS, PAGE, HEAD_DIM, dtype=torch.int8, **meta)
    scales = torch.empty(tiles, KV_HEADS, PAGE, dtype=torch.float32, **meta)
    bt = torch.empty(tiles, dtype=torch.int32, **meta)
    out = torch.empty(KV_HEADS * GROUP, HEAD_DIM, dtype=torch.float32, **meta)
    b = sm90_build.compile_launch(_toy_kernel, (q, pages, pages, scales, scales, bt, out, tiles, pages.stride(0),
                                                scales.stride(0), 0.1), dict(
        GROUP=GROUP, HEAD_DIM=HEAD_DIM, BLOCK_M=16, BLOCK_N=PAGE, K_LAYOUT=k_layout, V_LAYOUT=v_layout,
        DOT_PRECISION="tf32", num_warps=4, num_stages=3))
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


def describe(r: dict) -> str:
    return (f"{r['instructions']} instructions, {r['hmma']} HMMA, LDS.U8 {r['lds_u8']}, shared loads "
            f"{r['shared_loads']}, shared stores {r['shared_stores']}, global loads {r['global_loads']}, conversion "
            f"{r['conversion']}, moves {r['moves']}; {r['registers']} registers, spills {r['spill_stores']}/"
            f"{r['spill_loads']} B, {r['shared_bytes']} B shared")


def main() -> None:
    print("compiler figures (sm_90a build, no GPU): the key loop per 64-key tile, one warp")
    for int8 in (False, True):
        print(f"engine decode kernel, {'int8' if int8 else 'bf16'} pages: {describe(engine_build(int8))}")
    for kl in K_LAYOUTS:
        for vl in V_LAYOUTS:
            print(f"toy, K {K_LAYOUTS[kl]}, V {V_LAYOUTS[vl]}: {describe(build(kl, vl))}")


if __name__ == "__main__":
    main()
