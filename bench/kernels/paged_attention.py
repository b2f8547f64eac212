"""Paged attention (backends/triton/paged_attention.py) at Qwen3-4B's attention shape, on one GPU.

    python -m bench kernels paged_attention [--kv bf16,int8] [--contexts 1024,8192,32768]
        [--int8-tiles 32,64] [--repeats N] [--peak-tflops F]
    python -m bench kernels paged_attention --prefill-prompts 8192,32768 [--prefill-tiles NAMES] [--page-size P]
    python -m bench kernels paged_attention --build [--prefill-tiles NAMES] [--page-size P]    # no GPU

The shape: 32 q heads, 8 kv heads, D 128, page 64, bf16 q. The INT8 KV figure (decode attention at
32k with int8 against bf16 pages, bandwidth counted on the int8 bytes): ``--contexts 32768``.

Times, with bench/timing.py (median of CUDA-graph replays, so that the figures are device time and
not Python's launch overhead), for each page format of --kv (bf16 pages; int8 pages with a float32
scale per cached vector and keys smoothed, ``kv_store=paged_int8``):
- the split-KV decode (kernel 1 + combine, as called) after 1,024 / 8,192 / 32,768 cached positions
  for 1 and 16 new tokens and num_splits 4, 8, 16, 32, 64 (and decode_splits' default); each figure is
  also given as bytes of K and V read per second (as stored: 2 bytes per element for bf16, 1 byte
  plus a 4-byte scale per vector for int8) and as a fraction of the device copy bandwidth (bytes
  read + written of a large tensor copy, measured in the same run); int8 rows are timed with each
  key tile of --int8-tiles (default: the kernel's own), and a summary gives the int8/bf16 speedup
  of each (context, T) at the default splits;
- the prefill kernel on a 1,024-token prompt (and a 1,024-token chunk after 4,096 cached positions),
  in TFLOP/s (4 T L_avg H D, L_avg = start + (T + 1) / 2 with the causal halving) against
  --peak-tflops;
- torch's scaled_dot_product_attention on dense bf16 K/V of the same shapes, as a point of
  comparison.
With ``--prefill-prompts``, only this: the prefill attention of prompts of those lengths as the
engine runs them, in chunks of 4,096 tokens (configs/default.yaml's prefill_chunk; chunk ``i`` at
start ``4,096 i``), bf16 pages, with each prefill tile candidate of --prefill-tiles
(bench/kernels/paged_attention_build.py's CANDIDATES: the rule and the 128-row shapes): the sum of
the chunks' kernel times, TFLOP/s over the prompt against --peak-tflops, and each chunk's output
against the rule's (bit-identical or the max difference; the rule's first chunk against the twin).
Records: kind ``attention``, phase ``prefill_prompt``. ``--build`` compiles the candidates for sm_90
instead (no GPU, nothing timed; kind ``attention_build``, paged_attention_build.py).

Every case is first checked against the reference twin (backends/reference/paged_attention.py, the
same int8 pages and scales); the max error is printed. ``host_us`` is the wall time per call of
back-to-back launches (what a step costs without CUDA graphs). The timing floor (a decode over 65
keys) is printed too. Records: kind ``attention``, ``phase`` decode or prefill.
"""

from __future__ import annotations

import dataclasses
import time

import torch

from .. import records
from ..timing import copy_bandwidth, graph_seconds, host_seconds
from . import gpu_visible, integers, name_list
from .paged_attention_build import CANDIDATES, CHUNK, candidate_tiles

SHAPE = dict(heads=32, kv_heads=8, head_dim=128, page_size=64)  # Qwen3-4B
CONTEXTS = (1024, 8192, 32768)
DECODE_TOKENS = (1, 16)
SPLITS = (4, 8, 16, 32, 64)  # plus decode_splits(L) when it is none of these; 32, 64: int8 tiles carry half the bytes
PREFILL = ((1024, 0), (1024, 4096))  # (T, start): a prompt, and a chunk after a cached prefix
KV_FORMATS = ("bf16", "int8")


def arguments(p) -> None:
    p.description = __doc__.split("\n\n")[0]
    p.epilog = __doc__.split("\n\n", 1)[1]
    p.add_argument("--repeats", type=int, default=50, help="timed graph replays per case (median; default 50)")
    p.add_argument("--peak-tflops", type=float, default=800.0,
                   help="bf16 dense matmul peak for the prefill's fraction (default 800)")
    p.add_argument("--kv", type=name_list(KV_FORMATS, "page format"), default=list(KV_FORMATS),
                   help="page formats: bf16, int8 (default both)")
    p.add_argument("--contexts", type=integers, default=list(CONTEXTS),
                   help="cached positions of the decode cases (default 1024,8192,32768)")
    p.add_argument("--int8-tiles", type=integers, default=[], help="key tiles (BLOCK_N) to time the int8 kernels "
                   "with, e.g. 32,64 (default: the kernels' own)")
    p.add_argument("--prefill-prompts", type=integers, default=[], help="only time the chunked prefill attention "
                   "of prompts of these lengths, e.g. 8192,32768, with each of --prefill-tiles")
    p.add_argument("--prefill-tiles", type=name_list(CANDIDATES, "prefill tile candidate"), default=list(CANDIDATES),
                   help=f"prefill tile candidates (default all: {','.join(CANDIDATES)})")
    p.add_argument("--page-size", type=int, default=64, help="positions per page of --prefill-prompts and --build "
                   "(default 64, the engine's)")
    p.add_argument("--build", action="store_true", help="compile the --prefill-tiles candidates for sm_90 and print "
                   "the compiler's figures (no GPU; nothing timed)")
    records.arguments(p)


def kv_bytes(length: int, kv: str) -> int:
    """Bytes of K and V a step reads over ``length`` positions, as stored."""
    hkv, d = SHAPE["kv_heads"], SHAPE["head_dim"]
    return 2 * length * hkv * (2 * d if kv == "bf16" else d + 4)


def make_cache(length: int, t: int, seed: int, kv: str = "bf16", page: int = SHAPE["page_size"]):
    """q [t, H, D] bf16 and pages holding [0, length) through a permuted block table: ``(q,
    k_pages, v_pages, block_table, int8 keywords (empty for bf16), dense bf16 K, V)``. Int8 pages
    are written by the reference quantizer, keys smoothed by a random k-norm weight's smoothing."""
    from tileinfer.backends.reference.kv_quant import key_smoothing, write_quantized
    from tileinfer.backends.reference.kv_write import write_pages

    h, hkv, d = SHAPE["heads"], SHAPE["kv_heads"], SHAPE["head_dim"]
    gen = torch.Generator(device="cuda").manual_seed(seed)
    num_pages = -(-length // page) + 4
    block_table = torch.randperm(num_pages, generator=gen, device="cuda").to(torch.int32)
    pos = torch.arange(length, device="cuda")
    norm = torch.rand(d, generator=gen, device="cuda") * 3 + 0.1
    k = (torch.randn(length, hkv, d, generator=gen, device="cuda") * norm).to(torch.bfloat16)
    v = torch.randn(length, hkv, d, generator=gen, device="cuda", dtype=torch.bfloat16)
    q = torch.randn(t, h, d, generator=gen, device="cuda", dtype=torch.bfloat16)
    if kv == "bf16":
        k_pages = torch.zeros(num_pages, hkv, page, d, dtype=torch.bfloat16, device="cuda")
        v_pages = torch.zeros_like(k_pages)
        write_pages(k_pages, block_table, pos, k)
        write_pages(v_pages, block_table, pos, v)
        return q, k_pages, v_pages, block_table, {}, k, v
    k_pages = torch.zeros(num_pages, hkv, page, d, dtype=torch.int8, device="cuda")
    v_pages = torch.zeros_like(k_pages)
    k_scale = torch.zeros(num_pages, hkv, page, dtype=torch.float32, device="cuda")
    v_scale = torch.zeros_like(k_scale)
    k_smooth = key_smoothing(norm)
    write_quantized(k_pages, v_pages, k_scale, v_scale, block_table, pos, k, v, k_smooth)
    return q, k_pages, v_pages, block_table, dict(k_scale=k_scale, v_scale=v_scale, k_smooth=k_smooth), k, v


def max_error(out: torch.Tensor, q, k_pages, v_pages, block_table, start: int, scale: float, int8: dict) -> float:
    from tileinfer.backends.reference.paged_attention import paged_attention

    expected = paged_attention(q, k_pages, v_pages, block_table, start, scale, **int8)
    return (out.float() - expected.float()).abs().max().item()


def sdpa_fn(q, k, v, start: int, scale: float):
    """torch SDPA on dense [1, H, T, D] / [1, Hkv, L, D] tensors with the same causal alignment."""
    import torch.nn.functional as F

    t, length = q.shape[0], k.shape[0]
    qd, kd, vd = q.transpose(0, 1)[None], k.transpose(0, 1).contiguous()[None], v.transpose(0, 1).contiguous()[None]
    mask = None
    if t > 1:
        mask = torch.arange(length, device="cuda")[None, :] <= torch.arange(start, start + t, device="cuda")[:, None]
    return lambda: F.scaled_dot_product_attention(qd, kd, vd, attn_mask=mask, scale=scale, enable_gqa=True)


def tiles(kv: str, int8_tiles: list[int]) -> list[int | None]:
    """The key tiles to time a format with (None: the kernels' own)."""
    return (int8_tiles or [None]) if kv == "int8" else [None]


def with_tile(block_n: int | None):
    """The kernels' configs with the key tile ``block_n`` (None: unchanged); restore with the
    returned value."""
    from tileinfer.backends.triton import paged_attention as P

    saved = P._decode_config, P._prefill_config
    if block_n is not None:
        P._decode_config = lambda *a, **kw: dict(saved[0](*a, **kw), BLOCK_N=block_n)
        P._prefill_config = lambda *a, **kw: dataclasses.replace(saved[1](*a, **kw), block_n=block_n)
    return saved


def restore(saved) -> None:
    from tileinfer.backends.triton import paged_attention as P

    P._decode_config, P._prefill_config = saved


def kernel_tile(kv: str, block_n: int | None, prefill: bool = False) -> int:
    """The key tile a case runs with."""
    from tileinfer.backends.triton import paged_attention as P

    if block_n:
        return block_n
    if prefill:
        return P._prefill_config(64, SHAPE["head_dim"], kv == "int8").block_n
    return P._decode_config(64, SHAPE["head_dim"], kv == "int8")["BLOCK_N"]


def decode_rows(args, kv: str, bench, bandwidth: float, scale: float) -> list[dict]:
    from tileinfer.backends.triton.paged_attention import decode_splits, paged_decode_attention

    rows = []
    for context in args.contexts:
        for t in DECODE_TOKENS:
            length = context + t
            q, k_pages, v_pages, bt, int8, k, v = make_cache(length, t, context + t, kv)
            moved = kv_bytes(length, kv)
            sdpa_s = bench(sdpa_fn(q, k, v, context, scale)) if kv == "bf16" else None
            default = decode_splits(length, kv == "int8")
            positions = torch.arange(context, length, device="cuda")
            for block_n in tiles(kv, args.int8_tiles):
                saved = with_tile(block_n)
                try:
                    for splits in SPLITS + ((default,) if default not in SPLITS else ()):
                        out = torch.empty_like(q)
                        fn = lambda: paged_decode_attention(q, k_pages, v_pages, bt, context, scale,  # noqa: E731
                                                            positions=positions, num_splits=splits, out=out, **int8)
                        fn()
                        err = max_error(out, q, k_pages, v_pages, bt, context, scale, int8)
                        seconds = bench(fn)
                        row = dict(kv=kv, block_n=kernel_tile(kv, block_n), context=context, new_tokens=t,
                                   num_splits=splits, default_splits=splits == default, kernel_us=seconds * 1e6,
                                   host_us=host_seconds(fn) * 1e6, kv_bytes=moved, kv_gb_s=moved / seconds / 1e9,
                                   fraction_of_copy=moved / seconds / bandwidth,
                                   sdpa_us=None if sdpa_s is None else sdpa_s * 1e6, max_error=err)
                        rows.append(row)
                        label = f"{splits}{'*' if splits == default else ' '}"
                        sdpa = f"{row['sdpa_us']:7.1f}" if sdpa_s is not None else "      -"
                        print(f"   {kv:>4} {row['block_n']:3d} {context:7d} {t:2d} {label:>7} | "
                              f"{row['kernel_us']:9.1f} {row['host_us']:8.1f} | {row['kv_gb_s']:7.0f} "
                              f"{row['fraction_of_copy']:10.1%} | {sdpa} | {err:.2e}", flush=True)
                finally:
                    restore(saved)
            torch.cuda.empty_cache()
    return rows


def prefill_rows(args, kv: str, bench, scale: float) -> list[dict]:
    from tileinfer.backends.triton.paged_attention import paged_prefill_attention

    h, d = SHAPE["heads"], SHAPE["head_dim"]
    rows = []
    for t, start in PREFILL:
        q, k_pages, v_pages, bt, int8, k, v = make_cache(start + t, t, 7 + t + start, kv)
        sdpa_s = bench(sdpa_fn(q, k, v, start, scale))
        flops = 4 * t * (start + (t + 1) / 2) * h * d
        for block_n in tiles(kv, args.int8_tiles):
            saved = with_tile(block_n)
            try:
                out = torch.empty_like(q)
                fn = lambda: paged_prefill_attention(q, k_pages, v_pages, bt, start, scale, out=out,  # noqa: E731
                                                     **int8)
                fn()
                err = max_error(out, q, k_pages, v_pages, bt, start, scale, int8)
                seconds = bench(fn)
                row = dict(kv=kv, block_n=kernel_tile(kv, block_n, prefill=True), new_tokens=t, start=start,
                           kernel_us=seconds * 1e6,
                           tflops=flops / seconds / 1e12, fraction_of_peak=flops / seconds / 1e12 / args.peak_tflops,
                           sdpa_us=sdpa_s * 1e6, sdpa_tflops=flops / sdpa_s / 1e12, host_us=host_seconds(fn) * 1e6,
                           flops=flops, max_error=err)
                rows.append(row)
                print(f"   {kv:>4} {row['block_n']:3d} {t:4d} {start:5d} | {row['kernel_us']:9.1f} "
                      f"{row['tflops']:8.1f} {row['fraction_of_peak']:8.1%} | "
                      f"{row['sdpa_us']:7.1f} {row['sdpa_tflops']:8.1f} | {err:.2e}", flush=True)
            finally:
                restore(saved)
    return rows


def prompt_rows(args, bench, scale: float) -> list[dict]:
    """The chunked prefill attention of each --prefill-prompts prompt with each --prefill-tiles
    candidate (the module docstring)."""
    from tileinfer.backends.triton.paged_attention import paged_prefill_attention

    h, hkv, d = SHAPE["heads"], SHAPE["kv_heads"], SHAPE["head_dim"]
    rows = []
    for prompt in args.prefill_prompts:
        q, k_pages, v_pages, bt, _, _, _ = make_cache(prompt, CHUNK, 11 + prompt, page=args.page_size)
        chunks = [(start, min(CHUNK, prompt - start)) for start in range(0, prompt, CHUNK)]
        flops = sum(4 * t * (start + (t + 1) / 2) * h * d for start, t in chunks)
        rule = [paged_prefill_attention(q[:t], k_pages, v_pages, bt, start, scale) for start, t in chunks]
        twin_error = max_error(rule[0], q[:chunks[0][1]], k_pages, v_pages, bt, 0, scale, {})
        for name in args.prefill_tiles:
            tiles = candidate_tiles(name, CHUNK * h // hkv, d)
            chunk_us, diff, same = [], 0.0, True
            for (start, t), expected in zip(chunks, rule):
                out = torch.empty_like(q[:t])
                fn = lambda: paged_prefill_attention(q[:t], k_pages, v_pages, bt, start, scale, out=out,  # noqa: E731
                                                     tiles=tiles)
                fn()
                same = same and torch.equal(out, expected)
                diff = max(diff, (out.float() - expected.float()).abs().max().item())
                chunk_us.append(bench(fn) * 1e6)
            seconds = sum(chunk_us) / 1e6
            row = dict(kv="bf16", prompt=prompt, chunk=CHUNK, page_size=args.page_size, tiles=name,
                       config=dataclasses.asdict(tiles), kernel_us=sum(chunk_us), chunk_us=chunk_us, flops=flops,
                       tflops=flops / seconds / 1e12, fraction_of_peak=flops / seconds / 1e12 / args.peak_tflops,
                       bit_identical_to_rule=same, max_diff_vs_rule=diff, rule_twin_error=twin_error)
            rows.append(row)
            print(f"   {name:>12} {prompt:6d} | {row['kernel_us']:10.1f} {row['tflops']:8.1f} "
                  f"{row['fraction_of_peak']:8.1%} | {'same bits' if same else f'max diff {diff:.2e}'}", flush=True)
        q = k_pages = v_pages = rule = None  # freed before the next prompt's cache
        torch.cuda.empty_cache()
    return rows


def speedups(decode: list[dict]) -> list[dict]:
    """int8 against bf16 pages at the default splits, per (context, T) and int8 key tile."""
    bf16 = {(r["context"], r["new_tokens"]): r for r in decode if r["kv"] == "bf16" and r["default_splits"]}
    out = []
    for r in decode:
        base = bf16.get((r["context"], r["new_tokens"]))
        if r["kv"] == "int8" and r["default_splits"] and base is not None:
            out.append(dict(context=r["context"], new_tokens=r["new_tokens"], block_n=r["block_n"],
                            bf16_us=base["kernel_us"], int8_us=r["kernel_us"],
                            speedup=base["kernel_us"] / r["kernel_us"], int8_fraction_of_copy=r["fraction_of_copy"]))
    return out


def main(args) -> int:
    if args.build:
        from .paged_attention_build import build_main

        return build_main(args.prefill_tiles, args.page_size, args.commit, args.records)
    if not gpu_visible("paged_attention"):
        return 2
    from tileinfer.backends.triton.paged_attention import paged_decode_attention

    def bench(fn) -> float:
        return graph_seconds(fn, repeats=args.repeats)

    t_start = time.perf_counter()
    bandwidth = copy_bandwidth(torch.device("cuda"))
    h, hkv, d = SHAPE["heads"], SHAPE["kv_heads"], SHAPE["head_dim"]
    scale = d ** -0.5
    print(f"copy bandwidth {bandwidth / 1e12:.2f} TB/s (read + write); shape: {h} q heads, {hkv} kv heads, head_dim "
          f"{d}, page {SHAPE['page_size']}, q bf16; pages: {', '.join(args.kv)}")
    q, k_pages, v_pages, bt, _, _, _ = make_cache(65, 1, seed=1)
    positions = torch.tensor([64], device="cuda")  # made outside the graph, as a captured step's are
    floor_s = bench(lambda: paged_decode_attention(q, k_pages, v_pages, bt, 64, scale, positions=positions,
                                                   num_splits=2))
    print(f"timing floor (decode over 65 keys, 2 splits, graph replay): {floor_s * 1e6:.1f} us")
    run = records.Run("cuda", commit=args.commit, path=args.records)
    common = dict(shape="Qwen3-4B", copy_bandwidth_tb_s=bandwidth / 1e12, timing_floor_us=floor_s * 1e6)
    if args.prefill_prompts:
        print(f"\nprefill prompts in chunks of {CHUNK}, pages of {args.page_size}: tiles  prompt |  kernel us  "
              f"TFLOP/s  of peak | against the rule")
        for row in prompt_rows(args, bench, scale):
            run.add("attention", phase="prefill_prompt", **common, **row)
        print(f"\n{time.perf_counter() - t_start:.0f} s; appended {len(run.records)} records to {run.path}")
        return 0
    print("\ndecode: kv tile context  T  splits |  kernel us  host us | KV GB/s  of copy bw | sdpa us | max err")
    decode = [row for kv in args.kv for row in decode_rows(args, kv, bench, bandwidth, scale)]
    print("        (* = decode_splits default; KV bytes as stored: int8 counts 1 byte + a 4-byte scale per vector)")
    for r in speedups(decode):
        print(f"int8/bf16 decode, context {r['context']}, T {r['new_tokens']}, tile {r['block_n']}: "
              f"{r['bf16_us']:.1f} -> {r['int8_us']:.1f} us "
              f"({r['speedup']:.2f}x), {r['int8_fraction_of_copy']:.1%} of the copy bandwidth on the int8 bytes")
    print("\nprefill: kv tile    T  start |  kernel us  TFLOP/s  of peak | sdpa us  TFLOP/s | max err")
    prefill = [row for kv in args.kv for row in prefill_rows(args, kv, bench, scale)]
    for phase, rows in (("decode", decode), ("prefill", prefill)):
        for row in rows:
            run.add("attention", phase=phase, **common, **row)
    print(f"\n{time.perf_counter() - t_start:.0f} s; appended {len(run.records)} records to {run.path}")
    return 0


def tables() -> list:
    from ..report import Table, markdown

    def decode(rows: list[dict]) -> str:
        chosen = sorted((r for r in rows if r["default_splits"]),
                        key=lambda r: (r["kv"], r["context"], r["new_tokens"], r["block_n"]))
        body = [[r["kv"], str(r["block_n"]), str(r["context"]),
                 str(r["new_tokens"]), str(r["num_splits"]), f"{r['kernel_us']:.1f}", f"{r['kv_gb_s']:.0f}",
                 f"{r['fraction_of_copy']:.1%}", "-" if r["sdpa_us"] is None else f"{r['sdpa_us']:.1f}"]
                for r in chosen]
        return "At the default splits.\n\n" + markdown(["pages", "key tile", "context", "T", "splits", "us",
                                                        "KV GB/s", "of copy bandwidth", "SDPA us (dense bf16)"], body)

    def prefill(rows: list[dict]) -> str:
        body = [[r["kv"], str(r["block_n"]), str(r["new_tokens"]), str(r["start"]), f"{r['kernel_us']:.1f}",
                 f"{r['tflops']:.0f}", f"{r['sdpa_us']:.1f}", f"{r['sdpa_tflops']:.0f}"]
                for r in sorted(rows, key=lambda r: (r["kv"], r["start"], r["block_n"]))]
        return markdown(["pages", "key tile", "T", "after", "us", "TFLOP/s", "SDPA us", "SDPA TFLOP/s"], body)

    def prompts(rows: list[dict]) -> str:
        body = [[str(r["prompt"]), str(r["page_size"]), r["tiles"], f"{r['kernel_us'] / 1e3:.2f}", f"{r['tflops']:.0f}",
                 "yes" if r["bit_identical_to_rule"] else f"no (max diff {r['max_diff_vs_rule']:.1e})"]
                for r in sorted(rows, key=lambda r: (r["prompt"], r["page_size"], r["kernel_us"]))]
        return markdown(["prompt", "page", "tiles", "attention ms", "TFLOP/s", "same bits as the rule"], body)

    # Records with ``prefetch`` true time an int8 decode loop the kernel does not have (a measured
    # loss, docs/performance-log.md).
    return [Table("attention", "{group}: paged decode attention", decode, group=lambda r: r["shape"],
                  select=lambda r: r["phase"] == "decode" and not r.get("prefetch")),
            Table("attention", "{group}: paged prefill attention", prefill, group=lambda r: r["shape"],
                  select=lambda r: r["phase"] == "prefill"),
            Table("attention", "{group}: prefill attention of a prompt in 4,096-token chunks, by tile candidate",
                  prompts, group=lambda r: r["shape"], select=lambda r: r["phase"] == "prefill_prompt")]
