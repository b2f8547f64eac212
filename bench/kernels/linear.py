"""The Triton linear (backends/triton/linear.py: GEMV / GEMM) against torch (cuBLAS) at the Qwen3 layer shapes, on one GPU.

    python bench/kernels/linear.py [--models Qwen3-0.6B,Qwen3-4B] [--tokens 1,4,16,1024] [--sweep] [--eager]
                                   [--decode-step [--alt-tiles]] [--repeats N] [--out DIR]

Per layer (default). For each layer's weight ([N, K], bf16, q/k/v and gate/up fused as the engine
loads them) and each T: checks the Triton ``linear`` against the reference twin (``F.linear``;
``torch.mm`` with a float32 output for the lm_head logits) and prints the max error, then times
both with bench/timing.py: a CUDA graph of one call per weight copy, rotating among enough copies
(>= 256 MB in all) that no weight is in the 60 MB L2, time / copies. The graph keeps the host's
launch overhead out of the kernel times, as the engine's CUDA graphs do; ``--eager`` adds the time
of plain calls. The ``gate_up+swiglu`` row times ``linear(x, w, swiglu=True)`` against F.linear +
silu * up. Columns: Triton and cuBLAS time (us), Triton GB/s (weight + activation + output bytes
over time), that as a fraction of the copy bandwidth (measured in the same run), and TFLOP/s for
the GEMM rows. ``--sweep`` also times other GEMV/GEMM tiles per shape (for tuning the rules of
linear_gemv.py / linear_gemm.py), with each one's max error against the twin; at T > 16 the
persistent GEMM's candidates too (``PERSISTENT_TILES``: TMA, flattened tile loops, split tails),
on the ``gate_up+swiglu`` row as well.

Decode step (``--decode-step``, --tokens default 1,4,16). The linears of one whole decode step
(every layer with its own weights, then the lm_head), replayed from one CUDA graph, as ms per step
and weight bytes over that as a fraction of the copy bandwidth. Variants: ``cublas`` (torch for
every projection, SwiGLU as its own op); ``triton`` (the tile rule, SwiGLU fused into gate_up);
``triton-pdl`` (the same with programmatic dependent launch); ``per-op`` (the residual stream with
its RMSNorms and residual adds, one kernel per op, PDL: the ``triton`` linear of the engine);
``fused`` (the RMSNorm in each GEMV's prologue, the residual add in its epilogue, PDL);
``--alt-tiles`` adds ``triton-pdl/<tile>``: PDL with another T = 1 tile for the layers with N <=
6,144. PDL variants must equal the plain launch bit for bit, ``fused`` must equal ``per-op``.

With --out DIR the record goes to DIR/linear.json (DIR/linear_decode_step.json with --decode-step).
"""

from __future__ import annotations

import math
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import op_benchmark  # noqa: E402
from limits import copy_bandwidth  # noqa: E402  (bench/, on the path through op_benchmark)
from shapes import SHAPES  # noqa: E402
from timing import graph_seconds, median_seconds  # noqa: E402

ROTATION_BYTES = op_benchmark.ROTATION_BYTES
ALT_TILES = {  # name: (BLOCK_N, BLOCK_K, split_k, num_warps, num_stages), for T = 1 small layers
    "bn4-bk1024-w4": (4, 1024, 1, 4, 1), "bn2-bk1024-w2": (2, 1024, 1, 2, 1), "bn8-bk512-w4": (8, 512, 1, 4, 1),
    "bn4-bk512-w2-s2": (4, 512, 1, 2, 2), "bn1-bk1024-w2": (1, 1024, 1, 2, 1), "bn4-bk512-split2": (4, 512, 2, 2, 1),
}


def parse_args(argv: list[str] | None):
    p = op_benchmark.parser(__doc__, tokens="", tokens_help="1,4,16,1024; with --decode-step 1,4,16")
    p.add_argument("--sweep", action="store_true", help="also time alternative tiles (per-layer mode)")
    p.add_argument("--eager", action="store_true", help="also time plain calls, host launch overhead included")
    p.add_argument("--decode-step", action="store_true", help="time a whole decode step's linears instead")
    p.add_argument("--alt-tiles", action="store_true", help="with --decode-step: also time the alternative T = 1 tiles")
    args = op_benchmark.parse_args(p, argv)
    args.tokens = args.tokens or ([1, 4, 16] if args.decode_step else [1, 4, 16, 1024])
    return args


def layer_shapes(model: str) -> dict[str, tuple[int, int]]:
    """(N, K) of each projection's weight as the engine holds it."""
    s = SHAPES[model]
    h, d, i = s["hidden_size"], s["head_dim"], s["intermediate_size"]
    q, kv = s["num_attention_heads"] * d, s["num_key_value_heads"] * d
    return {"qkv": (q + 2 * kv, h), "o_proj": (h, q), "gate_up": (2 * i, h), "down": (h, i),
            "lm_head": (s["vocab_size"], h)}


def rotated_seconds(fn, weights, repeats: int) -> float:
    """Seconds per call of fn(w) from a CUDA graph of one call per weight copy (each reads a weight
    not in L2)."""
    return graph_seconds(lambda: [fn(w) for w in weights], repeats=repeats, calls=len(weights))


# Persistent GEMM candidates (linear_gemm_persistent.py) for T > 16: (BLOCK_M, BLOCK_N, BLOCK_K,
# num_warps, num_stages, options); "split" takes split_plan's rows and K splits for the shape (and
# is left out where the plan does not split).
PERSISTENT_TILES = [
    (128, 128, 64, 8, 3, "tma"), (128, 128, 64, 8, 4, "tma"), (128, 128, 64, 8, 3, "tma flatten"),
    (128, 128, 64, 8, 4, "tma flatten"), (128, 128, 64, 8, 3, ""), (128, 128, 64, 8, 3, "tma split"),
    (128, 256, 64, 8, 3, "tma"), (128, 256, 64, 8, 3, "tma flatten"), (128, 256, 64, 8, 3, "tma split"),
    (128, 128, 128, 8, 3, "tma"), (128, 128, 64, 4, 4, "tma"), (128, 64, 64, 4, 4, "tma split"),
    (64, 128, 64, 4, 4, "tma split"),
]


PERSISTENT_FIELDS = ("persistent", "tma", "flatten", "split_rows", "split_k", "programs")


def persistent_configs(cls, t: int, n: int, k: int, sms: int, tiles, **fixed):
    """``cls`` (GemmConfig / Int8GemmConfig) persistent configs of ``tiles`` for a GEMM of ``t`` rows
    on an ``[n, k]`` weight; the split ones with ``split_plan``'s rows and K splits, skipped where
    the plan does not split."""
    from tileinfer.backends.triton.linear_gemm_persistent import split_plan

    for bm, bn, bk, w, s, options in tiles:
        opts = dict(persistent=True, tma="tma" in options, flatten="flatten" in options, **fixed)
        if "split" in options:
            rows, splits = split_plan(t, n, k, bm, bn, bk, sms)
            if rows == 0:
                continue
            opts |= dict(split_rows=rows, split_k=splits)
        yield cls(bm, bn, bk, 8, w, s, **opts)


def sweep_configs(n: int, k: int, t: int, sms: int):
    from tileinfer.backends.triton.linear_gemm import GEMM_TILES, GemmConfig
    from tileinfer.backends.triton.linear_gemv import GemvConfig, gemv_split_k

    if t > 16:
        for bm, bn, bk, w, s, _ in list(GEMM_TILES) + [(128, 128, 64, 8, 4, 0), (128, 256, 64, 8, 3, 0),
                                                       (128, 128, 128, 8, 3, 0)]:
            yield GemmConfig(bm, bn, bk, 8, w, s)
        yield from persistent_configs(GemmConfig, t, n, k, sms, PERSISTENT_TILES)
        return
    if t == 1:
        tiles = [(16, 512, 4, 1), (16, 512, 4, 2), (8, 512, 4, 1), (8, 512, 2, 1), (4, 512, 2, 1), (4, 512, 1, 1),
                 (16, 256, 4, 1), (8, 256, 2, 1), (32, 512, 8, 1), (8, 1024, 4, 1), (16, 1024, 8, 1)]
    else:
        tiles = [(32, 256, 4, 3), (32, 256, 4, 2), (32, 128, 4, 4), (64, 256, 4, 3), (64, 128, 4, 3),
                 (16, 256, 4, 3), (16, 256, 4, 2), (16, 512, 4, 2), (32, 512, 4, 2), (64, 256, 8, 3),
                 (16, 128, 2, 4), (16, 256, 2, 3), (16, 512, 2, 2), (32, 128, 2, 4), (16, 1024, 4, 2),
                 (32, 256, 8, 3)]
    for bn, bk, w, s in tiles:
        rule = gemv_split_k(n, k, bn, bk, sms)
        for split in sorted({1, rule, min(2 * rule, -(-k // bk))}):
            yield GemvConfig(bn, bk, split, w, s)
            if split > 1:  # the partials added by the last split's program instead of a reduce kernel
                yield GemvConfig(bn, bk, split, w, s, fused_reduce=True)


def sweep(fn, weights, configs, expected: torch.Tensor, moved: int, bandwidth: float, repeats: int) -> list[dict]:
    """Each config's time of ``fn(w, cfg)`` over the rotating ``weights`` and its max error against
    ``expected`` (``fn(weights[0], cfg)``'s reference); a config that fails to compile or run is
    reported with its error."""
    rows = []
    for cfg in configs:
        try:
            err = (fn(weights[0], cfg).float() - expected.float()).abs().max().item()
            s = rotated_seconds(lambda w, cfg=cfg: fn(w, cfg), weights, repeats)
        except Exception as e:  # noqa: BLE001 -- a tile that does not compile is reported
            rows.append(dict(config=cfg.__dict__, error=str(e).splitlines()[0][:200]))
            continue
        rows.append(dict(config=cfg.__dict__, us=s * 1e6, copy_fraction=moved / s / bandwidth, max_abs_err=err))
    return rows


def print_best(rows: list[dict], best: int = 3) -> None:
    """The ``best`` fastest swept configs of a row (the persistent GEMM's named by its options), and
    the fastest persistent one if it is not among them; errors are counted."""
    timed = sorted((r for r in rows if "us" in r), key=lambda r: r["us"])
    shown = timed[:best] + [r for r in timed[best:] if r["config"].get("persistent")][:1]
    for r in shown:
        c = r["config"]
        name = tuple(v for k, v in c.items() if k not in PERSISTENT_FIELDS)
        if c.get("persistent"):
            name = f"{name} persistent" + "".join(f" {k}" for k in ("tma", "flatten") if c[k])
            name += f" split {c['split_rows']}x{c['split_k']}" if c["split_rows"] else ""
        print(f"{'':>42} sweep {r['us']:8.1f} us {r['copy_fraction']:6.1%} err {r['max_abs_err']:.1e}  {name}")
    if len(timed) < len(rows):
        print(f"{'':>42} sweep: {len(rows) - len(timed)} configs failed (their errors are in the record)")


def per_layer(args, bandwidth: float, sms: int) -> dict:
    from tileinfer.backends.reference.linear import linear as ref_linear
    from tileinfer.backends.reference.silu_mul import silu_mul as ref_silu_mul
    from tileinfer.backends.triton.linear import gemm_config, gemv_config, linear

    records = []
    print(f"{'model':<11} {'layer':<15} {'N x K':>13} {'T':>5} {'triton us':>10} {'cublas us':>10} "
          f"{'GB/s':>7} {'of copy':>7} {'TFLOP/s':>8} {'cublas TF':>9} {'max err':>9}  config")
    for model in args.models:
        for layer, (n, k) in layer_shapes(model).items():
            torch.cuda.empty_cache()
            copies = max(2, math.ceil(ROTATION_BYTES / (n * k * 2)))
            weights = [(torch.randn(n, k, device="cuda") / k**0.5).to(torch.bfloat16) for _ in range(copies)]
            out_dtype = torch.float32 if layer == "lm_head" else torch.bfloat16
            for swiglu, name in [(False, layer)] + ([(True, "gate_up+swiglu")] if layer == "gate_up" else []):
                for t in args.tokens:
                    x = torch.randn(t, k, device="cuda", dtype=torch.bfloat16)

                    def triton_fn(w, cfg=None, x=x, swiglu=swiglu):
                        return linear(x, w, out_dtype=out_dtype, swiglu=swiglu, config=cfg)

                    def torch_fn(w, x=x, swiglu=swiglu):
                        y = ref_linear(x, w, out_dtype)
                        return ref_silu_mul(y) if swiglu else y

                    y, expected = triton_fn(weights[0]), torch_fn(weights[0])
                    err = (y.float() - expected.float()).abs().max().item()
                    t_triton = rotated_seconds(triton_fn, weights, args.repeats)
                    t_torch = rotated_seconds(torch_fn, weights, args.repeats)
                    t_eager = None
                    if args.eager:
                        t_eager = median_seconds(lambda: [triton_fn(w) for w in weights], "cuda") / len(weights)
                    n_out = n // 2 if swiglu else n
                    moved = n * k * 2 + t * k * 2 + t * n_out * out_dtype.itemsize
                    flops = 2 * t * n * k
                    cfg = gemv_config(n, k, t, sms) if t <= 16 else gemm_config(t, n, k, sms)
                    rec = dict(model=model, layer=name, N=n, K=k, T=t, swiglu=swiglu, out_dtype=str(out_dtype)[6:],
                               triton_us=t_triton * 1e6, cublas_us=t_torch * 1e6,
                               triton_eager_us=t_eager * 1e6 if t_eager else None,
                               triton_gb_s=moved / t_triton / 1e9, cublas_gb_s=moved / t_torch / 1e9,
                               copy_fraction=moved / t_triton / bandwidth, triton_tflop_s=flops / t_triton / 1e12,
                               cublas_tflop_s=flops / t_torch / 1e12, max_abs_err=err,
                               max_abs_ref=expected.float().abs().max().item(), config=cfg.__dict__)
                    if args.sweep and (not swiglu or t > 16):
                        rec["sweep"] = sweep(lambda w, cfg: triton_fn(w, cfg), weights, sweep_configs(n, k, t, sms),
                                             expected, moved, bandwidth, args.repeats)
                    records.append(rec)
                    tf = f"{rec['triton_tflop_s']:8.1f} {rec['cublas_tflop_s']:9.1f}" if t > 16 else f"{'':8} {'':9}"
                    print(f"{model:<11} {name:<15} {f'{n}x{k}':>13} {t:>5} {rec['triton_us']:10.1f} "
                          f"{rec['cublas_us']:10.1f} {rec['triton_gb_s']:7.0f} {rec['copy_fraction']:7.1%} {tf} "
                          f"{err:9.2e}  {tuple(cfg.__dict__.values())}"
                          + (f"  eager {rec['triton_eager_us']:.1f} us" if t_eager else ""), flush=True)
                    print_best(rec.get("sweep", []))
            del weights
    gemv = [r for r in records if r["T"] <= 16 and not r["swiglu"]]
    if gemv:
        print(f"GEMV median fraction of copy bandwidth: {statistics.median(r['copy_fraction'] for r in gemv):.1%}")
    return dict(sms=sms, results=records)


def step_fn(layers, lm_head, dims, x, kind: str, tiles: dict | None = None, pdl: bool = False):
    """A function that runs every layer's projections on x [T, h] and returns the logits."""
    from tileinfer.backends.reference.linear import linear as ref_linear
    from tileinfer.backends.reference.silu_mul import silu_mul as ref_silu_mul
    from tileinfer.backends.triton.linear import linear

    if kind in ("per-op", "fused"):
        from tileinfer.backends.triton.add import add
        from tileinfer.backends.triton.linear import norm_warps
        from tileinfer.backends.triton.rms_norm import rms_norm
        from tileinfer.backends.triton.silu_mul import silu_mul

        def per_op(a, w, swiglu=False, norm_weight=None, residual=None, out_dtype=None, pdl=False):
            """One kernel per op: the norm with the GEMV prologue's warps, the GEMV, SwiGLU, the add."""
            if norm_weight is not None:
                a = rms_norm(a, norm_weight, 1e-6, pdl=pdl, num_warps=norm_warps(a.shape[0], *w.shape))
            y = linear(a, w, out_dtype=out_dtype, pdl=pdl)
            y = silu_mul(y, pdl=pdl) if swiglu else y
            return y if residual is None else add(y, residual, pdl=pdl)

        lin = linear if kind == "fused" else per_op

        def residual_stream():
            h = x
            for layer in layers:
                qkv = lin(h, layer["qkv"], norm_weight=layer["input_norm"], pdl=pdl)
                h = lin(qkv[:, :dims["q"]], layer["o"], residual=h, pdl=pdl)
                act = lin(h, layer["gate_up"], swiglu=True, norm_weight=layer["post_norm"], pdl=pdl)
                h = lin(act, layer["down"], residual=h, pdl=pdl)
            return lin(h, lm_head, out_dtype=torch.float32, norm_weight=dims["final_norm"], pdl=pdl)

        return residual_stream

    def project(a, w, swiglu=False, out_dtype=None):
        if kind == "cublas":
            y = ref_linear(a, w, out_dtype)
            return ref_silu_mul(y) if swiglu else y
        cfg = tiles.get(tuple(w.shape)) if tiles and a.shape[0] == 1 else None
        return linear(a, w, swiglu=swiglu, out_dtype=out_dtype, config=cfg, pdl=pdl)

    def run():
        a = x
        for layer in layers:
            qkv = project(a, layer["qkv"])
            o = project(qkv[:, :dims["q"]], layer["o"])
            a = project(project(o, layer["gate_up"], swiglu=True), layer["down"])
        return project(a, lm_head, out_dtype=torch.float32)

    return run


def decode_step(args, bandwidth: float) -> dict:
    from tileinfer.backends.triton.linear_gemv import GemvConfig

    records = []
    for model in args.models:
        torch.manual_seed(0)
        s = SHAPES[model]
        h, d, i = s["hidden_size"], s["head_dim"], s["intermediate_size"]
        q, kv = s["num_attention_heads"] * d, s["num_key_value_heads"] * d
        weight = lambda n, k: (torch.randn(n, k, device="cuda") / k**0.5).to(torch.bfloat16)  # noqa: E731
        norm = lambda: (torch.rand(h, device="cuda") + 0.5).to(torch.bfloat16)  # noqa: E731
        layers = [dict(qkv=weight(q + 2 * kv, h), o=weight(h, q), gate_up=weight(2 * i, h), down=weight(h, i),
                       input_norm=norm(), post_norm=norm()) for _ in range(s["num_hidden_layers"])]
        lm_head, dims = weight(s["vocab_size"], h), dict(q=q, final_norm=norm())
        weight_bytes = 2 * (lm_head.numel() + sum(w.numel() for la in layers for w in la.values() if w.dim() == 2))
        for t in args.tokens:
            x = torch.randn(t, h, device="cuda", dtype=torch.bfloat16)
            variants = {"cublas": step_fn(layers, lm_head, dims, x, "cublas"),
                        "triton": step_fn(layers, lm_head, dims, x, "triton"),
                        "triton-pdl": step_fn(layers, lm_head, dims, x, "triton", pdl=True),
                        "per-op": step_fn(layers, lm_head, dims, x, "per-op", pdl=True),
                        "fused": step_fn(layers, lm_head, dims, x, "fused", pdl=True)}
            if t == 1 and args.alt_tiles:
                for name, (bn, bk, split, warps, stages) in ALT_TILES.items():
                    tiles = {shape: GemvConfig(bn, min(bk, shape[1]), split, warps, stages)
                             for shape in [(q + 2 * kv, h), (h, q), (h, i)]}
                    variants[f"triton-pdl/{name}"] = step_fn(layers, lm_head, dims, x, "triton", tiles, pdl=True)
            plain, chain = variants["triton"]().clone(), variants["per-op"]().clone()
            base = None
            for name, fn in variants.items():
                got = fn().clone()
                if name == "triton-pdl":
                    assert torch.equal(got, plain), "triton-pdl differs from the plain launch"
                if name == "fused":
                    assert torch.equal(got, chain), "fused differs from per-op"
                ref = chain if name in ("per-op", "fused") else plain
                err = ((got - ref).norm() / ref.norm()).item()
                seconds = graph_seconds(fn, repeats=args.repeats)
                base = base or seconds
                frac = weight_bytes / seconds / bandwidth
                print(f"{model:<11} T={t:<3} {name:<28} {seconds * 1e6:8.1f} us  {frac:6.1%} of copy BW  "
                      f"x{base / seconds:5.2f} vs cublas  rel.err {err:.1e}", flush=True)
                records.append(dict(model=model, T=t, variant=name, us=seconds * 1e6, bandwidth_fraction=frac,
                                    speedup_vs_cublas=base / seconds, rel_err=err, weight_bytes=weight_bytes))
        del layers, lm_head
        torch.cuda.empty_cache()
    return dict(results=records)


def run(argv: list[str] | None, script: str, record: str, parse_args, per_layer, decode_step) -> int:
    """The main of this benchmark and of linear_int8.py: ``script``'s arguments, the GPU check, the
    device line, ``per_layer`` or ``decode_step`` (``--decode-step``), and the JSON record
    ``record`` (``record``_decode_step)."""
    args = parse_args(argv)
    if not op_benchmark.gpu_visible(script):
        return 2
    import triton

    from tileinfer.backends.triton.interpreter import num_sms

    t_start = time.perf_counter()
    sms = num_sms(torch.cuda.current_device())
    bandwidth = copy_bandwidth(torch.device("cuda"))
    print(f"{torch.cuda.get_device_name()}: {sms} SMs, copy bandwidth {bandwidth / 1e12:.2f} TB/s "
          f"(read + write), torch {torch.__version__}, triton {triton.__version__}", flush=True)
    result = decode_step(args, bandwidth) if args.decode_step else per_layer(args, bandwidth, sms)
    print(f"total {time.perf_counter() - t_start:.0f} s")
    name = f"{record}_decode_step" if args.decode_step else record
    op_benchmark.write_record(args.out, name, dict(copy_bandwidth_tb_s=bandwidth / 1e12, **result))
    return 0


def main(argv: list[str] | None = None) -> int:
    return run(argv, "linear.py", "linear", parse_args, per_layer, decode_step)


if __name__ == "__main__":
    sys.exit(main())
