"""Triton linear (GEMV / GEMM) against torch (cuBLAS) at the Qwen3 layer shapes, on one GPU.

    python bench/kernels/bench_linear.py [--out DIR] [--models Qwen3-4B,Qwen3-0.6B] [--tokens 1,4,16,1024]
                                         [--sweep] [--eager]

For each layer's weight ([N, K], bf16, q/k/v and gate/up fused as the engine loads them) and each
T: checks the Triton ``linear`` against the reference twin (``F.linear``; ``torch.mm`` with a
float32 output for the lm_head logits) and prints the max error, then times both: a CUDA graph
of one call per weight copy, rotating among enough copies (>= 256 MB in all) that no weight is in
the 60 MB L2, replayed under ``triton.testing.do_bench`` (median, warm-up, L2 flushed before each
replay), time / copies. The graph keeps the host's launch overhead (tens of us per Triton launch
on the H200 machine) out of the kernel times, as the engine's CUDA graphs will; ``--eager`` adds
the time of a plain call. The fused ``gate_up+swiglu`` row times ``linear(x, w,
epilogue="swiglu")`` against F.linear + silu * up. The device copy bandwidth (a 2 GiB ``copy_``, bytes read + written) is measured in the same run.
Columns: Triton and cuBLAS time (us), Triton GB/s (weight + activation + output bytes over time),
that as a fraction of copy bandwidth, and TFLOP/s for the GEMM rows. ``--sweep`` also times a few
other GEMV/GEMM tiles per shape (for tuning the rules in backends/triton/linear.py). ``--out DIR``
writes the results as JSON there.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from shapes import SHAPES  # noqa: E402
from limits import copy_bandwidth  # noqa: E402

ROTATION_BYTES = 256 * 2**20  # > 4x the H200's 60 MB L2
DEFAULT_TOKENS = (1, 4, 16, 1024)


def layer_shapes(model: str) -> dict[str, tuple[int, int]]:
    """(N, K) of each projection's weight as the engine holds it."""
    s = SHAPES[model]
    h, d, i = s["hidden_size"], s["head_dim"], s["intermediate_size"]
    q, kv = s["num_attention_heads"] * d, s["num_key_value_heads"] * d
    return {"qkv": (q + 2 * kv, h), "o_proj": (h, q), "gate_up": (2 * i, h), "down": (h, i),
            "lm_head": (s["vocab_size"], h)}


def cases(models: list[str], tokens: list[int]) -> list[dict]:
    """One record per (model, layer, epilogue, T); lm_head writes float32 logits."""
    out = []
    for model in models:
        for layer, (n, k) in layer_shapes(model).items():
            variants = [("none", layer)] + ([("swiglu", "gate_up+swiglu")] if layer == "gate_up" else [])
            for epilogue, name in variants:
                for t in tokens:
                    out.append(dict(model=model, layer=name, N=n, K=k, T=t, epilogue=epilogue,
                                    out_dtype="float32" if layer == "lm_head" else "bfloat16"))
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="folder for the JSON record")
    parser.add_argument("--models", default="Qwen3-4B,Qwen3-0.6B")
    parser.add_argument("--tokens", default=",".join(map(str, DEFAULT_TOKENS)))
    parser.add_argument("--sweep", action="store_true", help="also time alternative tiles")
    parser.add_argument("--rep-ms", type=float, default=40.0, help="do_bench repetition time per case")
    parser.add_argument("--eager", action="store_true",
                        help="also time the Triton call without a graph (host launch overhead included)")
    args = parser.parse_args(argv)
    args.models = [m for m in args.models.split(",") if m]
    for m in args.models:
        if m not in SHAPES:
            parser.error(f"unknown model {m!r}; valid: {', '.join(SHAPES)}")
    args.tokens = [int(t) for t in args.tokens.split(",") if t]
    return args


def rotating(fn, weights):
    """fn(w) over the weight copies in turn, so that each call reads a weight not in L2."""
    state = {"i": 0}

    def call():
        state["i"] = (state["i"] + 1) % len(weights)
        return fn(weights[state["i"]])

    return call


def graph_time(fn, weights, rep_ms: float) -> float:
    """Seconds per call of fn(w), from a CUDA graph of one call per weight copy (in turn, so each
    reads a weight not in L2), replayed under do_bench (median, warm-up, L2 flushed before each
    replay). The graph removes the host's launch overhead (tens of us per Triton launch), which
    would otherwise hide the kernel time of every layer but the largest."""
    import triton.testing

    fn(weights[0])  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for w in weights:
            fn(w)
    ms = triton.testing.do_bench(graph.replay, warmup=10, rep=rep_ms, return_mode="median")
    del graph
    return ms * 1e-3 / len(weights)


def sweep_configs(case: dict, sms: int):
    from tileinfer.backends.triton.linear import GEMM_TILES, GemmConfig, GemvConfig, gemv_split_k

    n, k, t = case["N"], case["K"], case["T"]
    if t > 16:
        tiles = list(GEMM_TILES) + [(128, 128, 64, 8, 4, 0), (128, 256, 64, 8, 3, 0), (128, 128, 128, 8, 3, 0)]
        for bm, bn, bk, w, s, _ in tiles:
            yield GemmConfig(bm, bn, bk, 8, w, s)
        return
    if t == 1:
        tiles = [(16, 512, 4, 1), (16, 512, 4, 2), (8, 512, 4, 1), (8, 512, 2, 1), (4, 512, 2, 1), (4, 512, 1, 1),
                 (16, 256, 4, 1), (8, 256, 2, 1), (32, 512, 8, 1), (8, 1024, 4, 1), (16, 1024, 8, 1)]
    else:
        tiles = [(32, 256, 4, 3), (32, 256, 4, 2), (32, 128, 4, 4), (64, 256, 4, 3), (64, 128, 4, 3),
                 (16, 256, 4, 3), (16, 256, 4, 2), (16, 512, 4, 2), (32, 512, 4, 2), (64, 256, 8, 3)]
    k_blocks = lambda bk: -(-k // bk)  # noqa: E731
    for bn, bk, w, s in tiles:
        rule = gemv_split_k(n, k, bn, bk, sms)
        for split in sorted({1, rule, min(2 * rule, k_blocks(bk))}):
            yield GemvConfig(bn, bk, split, w, s)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print("error: bench_linear.py needs a CUDA GPU (none is visible)", file=sys.stderr)
        return 2
    import triton
    import triton.testing

    from tileinfer.backends.reference.linear import linear as ref_linear
    from tileinfer.backends.reference.linear import silu_mul as ref_silu_mul
    from tileinfer.backends.triton.linear import gemm_config, gemv_config, linear, num_sms

    t_start = time.perf_counter()
    torch.manual_seed(0)
    sms = num_sms(torch.cuda.current_device())
    bandwidth = copy_bandwidth(torch.device("cuda"))
    print(f"{torch.cuda.get_device_name()}: {sms} SMs, copy bandwidth {bandwidth / 1e12:.2f} TB/s "
          f"(read + write), torch {torch.__version__}, triton {triton.__version__}", flush=True)

    def bench(fn) -> float:
        return triton.testing.do_bench(fn, warmup=10, rep=args.rep_ms, return_mode="median") * 1e-3

    records = []
    weights_for: dict[tuple[int, int], list[torch.Tensor]] = {}
    header = (f"{'model':<11} {'layer':<15} {'N x K':>13} {'T':>5} {'triton us':>10} {'cublas us':>10} "
              f"{'GB/s':>7} {'of copy':>7} {'TFLOP/s':>8} {'cublas TF':>9} {'max err':>9}  config")
    print(header)
    for case in cases(args.models, args.tokens):
        n, k, t, epilogue = case["N"], case["K"], case["T"], case["epilogue"]
        out_dtype = getattr(torch, case["out_dtype"])
        if (n, k) not in weights_for:
            weights_for.clear()  # one shape's copies at a time
            torch.cuda.empty_cache()
            copies = max(2, math.ceil(ROTATION_BYTES / (n * k * 2)))
            weights_for[(n, k)] = [(torch.randn(n, k, device="cuda") / k**0.5).to(torch.bfloat16)
                                   for _ in range(copies)]
        weights = weights_for[(n, k)]
        x = torch.randn(t, k, device="cuda", dtype=torch.bfloat16)

        def triton_fn(w, cfg=None):
            return linear(x, w, out_dtype=out_dtype, epilogue=epilogue, config=cfg)

        def torch_fn(w):
            y = ref_linear(x, w, out_dtype)
            return ref_silu_mul(y) if epilogue == "swiglu" else y

        y, expected = triton_fn(weights[0]), torch_fn(weights[0])
        err = (y.float() - expected.float()).abs().max().item()
        scale = expected.float().abs().max().item()
        t_triton = graph_time(triton_fn, weights, args.rep_ms)
        t_torch = graph_time(torch_fn, weights, args.rep_ms)
        t_eager = bench(rotating(triton_fn, weights)) if args.eager else None
        n_out = n // 2 if epilogue == "swiglu" else n
        moved = n * k * 2 + t * k * 2 + t * n_out * out_dtype.itemsize
        flops = 2 * t * n * k
        cfg = gemv_config(n, k, t, sms) if t <= 16 else gemm_config(t, n, k, sms)
        rec = dict(case, triton_us=t_triton * 1e6, cublas_us=t_torch * 1e6,
                   triton_eager_us=t_eager * 1e6 if t_eager else None, triton_gb_s=moved / t_triton / 1e9,
                   cublas_gb_s=moved / t_torch / 1e9, copy_fraction=moved / t_triton / bandwidth,
                   triton_tflop_s=flops / t_triton / 1e12, cublas_tflop_s=flops / t_torch / 1e12,
                   max_abs_err=err, max_abs_ref=scale, config=cfg.__dict__)
        if args.sweep and epilogue == "none":
            rec["sweep"] = []
            for alt in sweep_configs(case, sms):
                try:
                    s = graph_time(lambda w, alt=alt: triton_fn(w, alt), weights, args.rep_ms)
                except Exception as e:  # noqa: BLE001 -- a tile that does not compile is just skipped
                    rec["sweep"].append(dict(config=alt.__dict__, error=str(e).splitlines()[0][:200]))
                    continue
                rec["sweep"].append(dict(config=alt.__dict__, us=s * 1e6, copy_fraction=moved / s / bandwidth))
        records.append(rec)
        tf = f"{rec['triton_tflop_s']:8.1f} {rec['cublas_tflop_s']:9.1f}" if t > 16 else f"{'':8} {'':9}"
        print(f"{case['model']:<11} {case['layer']:<15} {f'{n}x{k}':>13} {t:>5} {rec['triton_us']:10.1f} "
              f"{rec['cublas_us']:10.1f} {rec['triton_gb_s']:7.0f} {rec['copy_fraction']:7.1%} {tf} "
              f"{err:9.2e}  {tuple(cfg.__dict__.values())}"
              + (f"  eager {rec['triton_eager_us']:.1f} us" if t_eager else ""), flush=True)
        if "sweep" in rec:
            ok = [s for s in rec["sweep"] if "us" in s]
            for s in sorted(ok, key=lambda s: s["us"])[:3]:
                print(f"{'':>42} sweep {s['us']:8.1f} us {s['copy_fraction']:6.1%}  {tuple(s['config'].values())}")
            for s in rec["sweep"]:
                if "error" in s:
                    print(f"{'':>42} sweep failed {tuple(s['config'].values())}: {s['error']}")

    gemv = [r for r in records if r["T"] <= 16 and r["epilogue"] == "none"]
    if gemv:
        print(f"GEMV median fraction of copy bandwidth: {statistics.median(r['copy_fraction'] for r in gemv):.1%}; "
              f"weight-bytes-weighted: {sum(r['N'] * r['K'] for r in gemv) * 2 / sum(r['triton_us'] * 1e-6 * bandwidth for r in gemv):.1%}")
    print(f"total {time.perf_counter() - t_start:.0f} s")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        try:
            commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                    cwd=Path(__file__).parent).stdout.strip() or None
        except OSError:
            commit = None
        record = dict(gpu=torch.cuda.get_device_name(), sms=sms, copy_bandwidth_tb_s=bandwidth / 1e12,
                      torch=torch.__version__, triton=triton.__version__, commit=commit, results=records)
        path = args.out / "bench_linear.json"
        path.write_text(json.dumps(record, indent=1))
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
