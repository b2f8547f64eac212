"""Paged attention (backends/triton/paged_attention.py) at Qwen3-4B's attention shape (32 q heads, 8 kv heads, D 128, page 64, bf16), on one GPU.

    python bench/kernels/paged_attention.py [--repeats N] [--peak-tflops F] [--out DIR]

Times, with bench/timing.py (median of CUDA-graph replays, so that the figures are device time and
not Python's launch overhead):
- the split-KV decode (kernel 1 + combine, as called) after 1,024 / 8,192 / 32,768 cached positions
  for 1 and 16 new tokens and num_splits 4, 8, 16 (and decode_splits' default); each figure is
  also given as bytes of K and V read per second and as a fraction of the device copy bandwidth
  (bytes read + written of a large tensor copy, measured in the same run);
- the prefill kernel on a 1,024-token prompt (and a 1,024-token chunk after 4,096 cached positions),
  in TFLOP/s (4 T L_avg H D, L_avg = start + (T + 1) / 2 with the causal halving) against
  --peak-tflops;
- torch's scaled_dot_product_attention on dense K/V of the same shapes, as a point of comparison.
Every case is first checked against the reference twin (backends/reference/paged_attention.py); the
max error is printed. ``host_us`` is the wall time per call of back-to-back launches (what a step
costs without CUDA graphs). The timing floor (a decode over 65 keys) is printed too. With --out DIR
the record goes to DIR/paged_attention.json.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import op_benchmark  # noqa: E402
from limits import copy_bandwidth  # noqa: E402  (bench/, on the path through op_benchmark)
from timing import graph_seconds, host_seconds  # noqa: E402

SHAPE = dict(heads=32, kv_heads=8, head_dim=128, page_size=64)  # Qwen3-4B
CONTEXTS = (1024, 8192, 32768)
DECODE_TOKENS = (1, 16)
SPLITS = (4, 8, 16)  # plus decode_splits(L) when it is none of these
PREFILL = ((1024, 0), (1024, 4096))  # (T, start): a prompt, and a chunk after a cached prefix


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="folder for paged_attention.json (default: print only)")
    parser.add_argument("--repeats", type=int, default=50, help="timed graph replays per case (median; default 50)")
    parser.add_argument("--peak-tflops", type=float, default=800.0,
                        help="bf16 dense matmul peak for the prefill's fraction (default 800)")
    return parser.parse_args(argv)


def make_cache(length: int, t: int, seed: int):
    """q [t, H, D] and bf16 pages holding [0, length) through a permuted block table, plus dense K/V."""
    from tileinfer.backends.reference.kv_write import write_pages
    from tileinfer.backends.reference.paged_attention import gather_pages

    h, hkv, d, page = SHAPE["heads"], SHAPE["kv_heads"], SHAPE["head_dim"], SHAPE["page_size"]
    gen = torch.Generator(device="cuda").manual_seed(seed)
    num_pages = -(-length // page) + 4
    k_pages = torch.zeros(num_pages, hkv, page, d, dtype=torch.bfloat16, device="cuda")
    v_pages = torch.zeros_like(k_pages)
    block_table = torch.randperm(num_pages, generator=gen, device="cuda").to(torch.int32)
    pos = torch.arange(length, device="cuda")
    for pages in (k_pages, v_pages):
        values = torch.randn(length, hkv, d, generator=gen, device="cuda", dtype=pages.dtype)
        write_pages(pages, block_table, pos, values)
    q = torch.randn(t, h, d, generator=gen, device="cuda", dtype=torch.bfloat16)
    k, v = gather_pages(k_pages, block_table, length), gather_pages(v_pages, block_table, length)
    return q, k_pages, v_pages, block_table, k, v


def max_error(out: torch.Tensor, q, k_pages, v_pages, block_table, start: int, scale: float) -> float:
    from tileinfer.backends.reference.paged_attention import paged_attention

    expected = paged_attention(q, k_pages, v_pages, block_table, start, scale)
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


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not op_benchmark.gpu_visible("paged_attention.py"):
        return 2
    import triton

    from tileinfer.backends.triton.paged_attention import (
        decode_splits,
        paged_decode_attention,
        paged_prefill_attention,
    )

    def bench(fn) -> float:
        return graph_seconds(fn, repeats=args.repeats)

    t_start = time.perf_counter()
    bandwidth = copy_bandwidth(torch.device("cuda"))
    h, hkv, d = SHAPE["heads"], SHAPE["kv_heads"], SHAPE["head_dim"]
    scale = d ** -0.5
    print(f"{torch.cuda.get_device_name()}  torch {torch.__version__}  triton {triton.__version__}")
    print(f"copy bandwidth {bandwidth / 1e12:.2f} TB/s (read + write)")
    print(f"shape: {h} q heads, {hkv} kv heads, head_dim {d}, page {SHAPE['page_size']}, bf16")
    q, k_pages, v_pages, bt, _, _ = make_cache(65, 1, seed=1)
    positions = torch.tensor([64], device="cuda")  # made outside the graph, as a captured step's are
    floor_s = bench(lambda: paged_decode_attention(q, k_pages, v_pages, bt, 64, scale, positions=positions,
                                                   num_splits=2))
    print(f"timing floor (decode over 65 keys, 2 splits, graph replay): {floor_s * 1e6:.1f} us")

    decode = []
    print("\ndecode: context  T  splits |  kernel us  host us | KV GB/s  of copy bw | sdpa us | max err")
    for context in CONTEXTS:
        for t in DECODE_TOKENS:
            length = context + t
            q, k_pages, v_pages, bt, k, v = make_cache(length, t, seed=context + t)
            kv_bytes = 2 * length * hkv * d * 2
            sdpa_s = bench(sdpa_fn(q, k, v, context, scale))
            default = decode_splits(length)
            positions = torch.arange(context, length, device="cuda")
            for splits in SPLITS + ((default,) if default not in SPLITS else ()):
                out = torch.empty_like(q)
                fn = lambda: paged_decode_attention(q, k_pages, v_pages, bt, context, scale,  # noqa: E731
                                                    positions=positions, num_splits=splits, out=out)
                fn()
                err = max_error(out, q, k_pages, v_pages, bt, context, scale)
                seconds = bench(fn)
                row = dict(context=context, new_tokens=t, num_splits=splits, default_splits=splits == default,
                           kernel_us=seconds * 1e6, host_us=host_seconds(fn) * 1e6, kv_bytes=kv_bytes,
                           kv_gb_s=kv_bytes / seconds / 1e9,
                           fraction_of_copy=kv_bytes / seconds / bandwidth, sdpa_us=sdpa_s * 1e6, max_error=err)
                decode.append(row)
                label = f"{splits}{'*' if splits == default else ' '}"
                print(f"        {context:7d} {t:2d} {label:>7} | {row['kernel_us']:9.1f} {row['host_us']:8.1f} | "
                      f"{row['kv_gb_s']:7.0f} {row['fraction_of_copy']:10.1%} | {row['sdpa_us']:7.1f} | {err:.2e}")
            del q, k_pages, v_pages, bt, k, v
    print("        (* = decode_splits default)")

    prefill = []
    print("\nprefill: T  start |  kernel us  TFLOP/s  of peak | sdpa us  TFLOP/s | max err")
    for t, start in PREFILL:
        q, k_pages, v_pages, bt, k, v = make_cache(start + t, t, seed=7 + t + start)
        out = torch.empty_like(q)
        fn = lambda: paged_prefill_attention(q, k_pages, v_pages, bt, start, scale, out=out)  # noqa: E731
        fn()
        err = max_error(out, q, k_pages, v_pages, bt, start, scale)
        seconds = bench(fn)
        sdpa_s = bench(sdpa_fn(q, k, v, start, scale))
        flops = 4 * t * (start + (t + 1) / 2) * h * d
        row = dict(new_tokens=t, start=start, kernel_us=seconds * 1e6, tflops=flops / seconds / 1e12,
                   fraction_of_peak=flops / seconds / 1e12 / args.peak_tflops, sdpa_us=sdpa_s * 1e6,
                   sdpa_tflops=flops / sdpa_s / 1e12, host_us=host_seconds(fn) * 1e6, flops=flops, max_error=err)
        prefill.append(row)
        print(f"        {t:4d} {start:5d} | {row['kernel_us']:9.1f} {row['tflops']:8.1f} "
              f"{row['fraction_of_peak']:8.1%} | "
              f"{row['sdpa_us']:7.1f} {row['sdpa_tflops']:8.1f} | {err:.2e}")

    elapsed = time.perf_counter() - t_start
    print(f"\n{elapsed:.0f} s")
    op_benchmark.write_record(args.out, "paged_attention", dict(
        shape=SHAPE, dtype="bfloat16", copy_bandwidth_tb_s=bandwidth / 1e12, timing_floor_us=floor_s * 1e6,
        peak_tflops=args.peak_tflops, decode=decode, prefill=prefill, elapsed_s=elapsed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
