"""The Triton linear (backends/triton/linear.py) for both weight formats against cuBLAS at the Qwen3
layer shapes, on one GPU.

    python -m bench kernels linear [--models Qwen3-0.6B,Qwen3-4B] [--tokens 1,4,16,1024] [--formats bf16,int8,...]
        [--layers qkv,...] [--sweep [--sweep-filter WORD]] [--eager] [--decode-step] [--repeats N] [--records FILE]

Per layer (default). For each format (``bf16``: bf16 weights; ``int8``: random int8 rows over
[-128, 127] with float32 row scales; ``int8f``: the same in the ``fragments`` layout,
backends/triton/linear_layout.py; ``int8d``, T > 16
only: int8 rows dequantized into a bf16 scratch, then the BF16 GEMM with the scales, timed as one
call: ``options.triton.int8_prefill_dequant``), each layer's weight ([N, K], q/k/v and gate/up fused as the
engine loads them) and each T: checks the Triton ``linear`` against the twin (backends/reference/
linear.py) and prints the max error, then times, with bench/timing.py, a CUDA graph of one call per
weight copy, rotating among enough copies (>= 256 MB in all) that no weight is in the 60 MB L2,
time / copies: the rule's tiles (``triton us``), cuBLAS bf16 on a bf16 weight of the shape, the BF16
Triton linear on that weight for int8 rows (``x bf16``: its time over int8's), and at T > 16 where
the rule takes the persistent TMA GEMM, the tiled GEMM's own rule (``tiled us``, the rule without
the persistent kernel): the comparison that re-times the prefill rule (``--tokens 128,512,1024,
4096``). ``--eager`` adds plain calls' time. The ``gate_up+swiglu`` row runs the SwiGLU epilogue.
Columns: those times, GB/s (weight + scales + activation + output bytes over time), that as a
fraction of the copy bandwidth (measured in the same run), TFLOP/s at T > 16. ``--sweep`` also times
other tiles per shape (``sweep_configs``: GEMV tiles, split-K with and without the fused reduce,
the GEMM's tiles, the persistent kernel's with TMA, flattened loops and split tails; for int8 the
rule's tile with Triton's plain cast and with the byte-permute conversion, ``int8_convert`` ``cast``
/ ``permute``), each with its max error against the twin; ``--sweep-filter WORD`` keeps the swept
configs whose description (as printed) holds WORD.
A kernel-level peer at T = 1 and 16 for int8: gemlite's A16W8 GEMV/GEMM
(``A16W8_INT8(dtype=bfloat16).from_weights(weight=q, scales=scale[:, None])``, built from the same
weights and scales; its own kernel choice and autotuning, untimed), or the reason it does not import
(it needs a GPU to import; bench/device.sh carries it).

Decode step (``--decode-step``, --tokens default 1,4,16): the linears of one whole decode step
(every layer with its own weights, the norms as kernels, then the lm_head with float32 logits),
replayed from one CUDA graph: ms per step and weight bytes over that as a fraction of the copy
bandwidth. Variants: ``cublas`` (the twin for every projection, the norm, SwiGLU and add as torch
ops); per format ``per-op`` (one Triton kernel per op, PDL) and ``fused`` (SwiGLU and the residual
add in the GEMV/GEMM epilogue, PDL: the engine's default). ``fused`` must equal ``per-op`` bit for bit.

Records: kind ``linear`` (one per layer, T and format; ``sweep`` the swept configs) and
``linear_decode_step``.
"""

from __future__ import annotations

import math
import statistics
import time

import torch

from .. import records
from ..shapes import SHAPES
from ..timing import copy_bandwidth, graph_seconds, median_seconds
from . import ROTATION_BYTES, common_arguments, gpu_visible, name_list
from .linear_peers import gemlite_a16w8, gemlite_row

FORMATS = ("bf16", "int8", "int8f", "int8d")
# the int8 weight's layout of each format
LAYOUT = {"bf16": "rows", "int8": "rows", "int8f": "fragments", "int8d": "rows"}
LAYERS = ("qkv", "o_proj", "gate_up", "down", "lm_head")
GEMLITE_TOKENS = (1, 16)  # the step sizes gemlite's A16W8 is timed at (decode, a 16-token verify step)
# Persistent GEMM candidates for T > 16: (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages, options);
# "split" takes split_plan's rows and K splits for the shape (left out where the plan does not split).
PERSISTENT_TILES = {
    "bf16": [(128, 128, 64, 8, 3, "tma"), (128, 128, 64, 8, 4, "tma"), (128, 128, 64, 8, 3, "tma flatten"),
             (128, 128, 64, 8, 4, "tma flatten"), (128, 128, 64, 8, 3, ""), (128, 128, 64, 8, 3, "tma split"),
             (128, 256, 64, 8, 3, "tma"), (128, 256, 64, 8, 3, "tma flatten"), (128, 256, 64, 8, 3, "tma split"),
             (128, 128, 128, 8, 3, "tma"), (128, 128, 64, 4, 4, "tma"), (128, 64, 64, 4, 4, "tma split"),
             (64, 128, 64, 4, 4, "tma split"), (128, 64, 64, 4, 4, "tma"), (64, 128, 64, 4, 4, "tma"),
             (128, 128, 64, 8, 4, "tma split")],
    # int8 transposed (swap_ab) but the split tail, which GemmConfig allows only untransposed
    "int8": [(128, 128, 64, 8, 3, "tma swap"), (128, 128, 128, 8, 3, "tma swap"), (128, 64, 128, 4, 3, "tma swap"),
             (128, 128, 64, 8, 3, "tma flatten swap"), (128, 128, 64, 8, 3, "swap"), (128, 256, 64, 8, 3, "tma"),
             (128, 256, 64, 8, 3, "tma flatten"), (128, 128, 64, 8, 3, "tma split"), (128, 64, 128, 4, 3, "tma split"),
             (128, 128, 128, 8, 4, "tma swap"), (128, 256, 128, 8, 3, "tma swap"), (128, 128, 128, 4, 3, "tma swap"),
             (64, 128, 128, 4, 3, "tma swap"), (64, 64, 128, 4, 3, "tma swap"), (64, 128, 128, 4, 3, "tma split")],
}
PERSISTENT_TILES["int8f"] = PERSISTENT_TILES["int8"]
GEMV_TILES = {  # (BLOCK_N, BLOCK_K, num_warps, num_stages) swept at T = 1 and at T = 2..16
    (1, "bf16"): [(16, 512, 4, 1), (8, 512, 4, 1), (8, 512, 2, 1), (4, 512, 2, 1), (4, 512, 1, 1), (16, 256, 4, 1),
                  (8, 256, 2, 1), (8, 1024, 4, 1), (16, 1024, 8, 1), (4, 1024, 4, 1)],
    (1, "int8"): [(4, 1024, 2, 1), (4, 2048, 4, 1), (8, 1024, 4, 1), (2, 2048, 2, 1), (4, 512, 1, 1), (8, 512, 2, 1),
                  (16, 1024, 8, 1), (4, 1024, 4, 1), (2, 1024, 2, 1), (4, 512, 2, 1)],
    (2, "bf16"): [(32, 256, 4, 3), (32, 128, 4, 4), (64, 256, 4, 3), (64, 128, 4, 3), (16, 256, 4, 3),
                  (16, 512, 4, 2), (16, 128, 2, 4), (16, 256, 2, 3), (32, 128, 2, 4), (32, 256, 8, 3)],
    (2, "int8"): [(32, 256, 4, 4), (32, 128, 4, 4), (32, 512, 4, 3), (64, 256, 4, 3), (16, 256, 4, 3),
                  (16, 512, 4, 2), (16, 128, 2, 4), (64, 128, 4, 4)],
}
PERSISTENT_FIELDS = ("persistent", "tma", "flatten", "split_rows", "split_k", "programs")


def arguments(p) -> None:
    p.description, p.epilog = __doc__.split("\n\n")[0], __doc__.split("\n\n", 1)[1]
    common_arguments(p, None, "1,4,16,1024; with --decode-step 1,4,16")
    p.add_argument("--formats", type=name_list(FORMATS, "weight format"), default=list(FORMATS),
                   help="weight formats: bf16, int8, int8f (int8 in the fragments layout), int8d (int8 dequantized, "
                   "then the BF16 GEMM; T > 16); default all")
    p.add_argument("--layers", type=name_list(LAYERS, "layer"), default=list(LAYERS),
                   help="comma-separated layers (default all: " + ",".join(LAYERS) + ")")
    p.add_argument("--sweep", action="store_true", help="also time alternative tiles (per-layer mode)")
    p.add_argument("--sweep-filter", metavar="WORD", help="sweep only the configs whose description holds WORD")
    p.add_argument("--eager", action="store_true", help="also time plain calls, host launch overhead included")
    p.add_argument("--decode-step", action="store_true", help="time a whole decode step's linears instead")


def layer_shapes(model: str) -> dict[str, tuple[int, int]]:
    """(N, K) of each projection's weight as the engine holds it."""
    s = SHAPES[model]
    h, d, i = s["hidden_size"], s["head_dim"], s["intermediate_size"]
    q, kv = s["num_attention_heads"] * d, s["num_key_value_heads"] * d
    return {"qkv": (q + 2 * kv, h), "o_proj": (h, q), "gate_up": (2 * i, h), "down": (h, i),
            "lm_head": (s["vocab_size"], h)}


def weight(fmt: str, n: int, k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(w, scale)``: bf16 ~ N(0, 1/K) (scale None), or int8 over [-128, 127] with row scales (int8f:
    packed in the fragments layout)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    if fmt == "bf16":
        return (torch.randn(n, k, generator=g, device="cuda") / k**0.5).to(torch.bfloat16), None
    q = torch.randint(-128, 128, (n, k), generator=g, device="cuda", dtype=torch.int8)
    if fmt == "int8f":
        from tileinfer.backends.reference.linear import pack_fragments

        q = pack_fragments(q)
    return q, (torch.rand(n, generator=g, device="cuda") + 0.5) / (k * 5461.5) ** 0.5


def as_bf16(w: tuple) -> torch.Tensor:
    return w[0] if w[1] is None else (w[0].float() * w[1][:, None]).to(torch.bfloat16)


def rotated_seconds(fn, weights, repeats: int) -> float:
    """Seconds per call of fn(w) from a CUDA graph of one call per weight copy (each not in L2)."""
    return graph_seconds(lambda: [fn(w) for w in weights], repeats=repeats, calls=len(weights))


def sweep_configs(n: int, k: int, t: int, sms: int, fmt: str, swiglu: bool = False):
    """The configs ``--sweep`` times for an ``[n, k]`` weight at T = ``t`` (see the module docstring;
    ``swiglu``: for the fused SwiGLU call)."""
    from tileinfer.backends.triton.linear_tiles import (GEMM_TILES, GemmConfig, GemvConfig, gemm_config, gemv_config,
                                                        gemv_split_k, split_plan)

    fmt = "bf16" if fmt == "int8d" else fmt  # the dequantized path runs the BF16 GEMM
    int8 = fmt != "bf16"
    if t > 16:
        rule = gemm_config(t, n, k, sms, int8=int8)
        if int8:
            for convert in ("cast", "permute"):
                yield GemmConfig(**{**rule.__dict__, "int8_convert": convert})
        for bm, bn, bk, w, s, _ in GEMM_TILES["int8" if int8 else "none"][:2]:
            yield GemmConfig(bm, bn, bk, 8, w, s, swap_ab=int8)
        for bm, bn, bk, w, s, options in PERSISTENT_TILES[fmt]:
            opts = dict(persistent=True, tma="tma" in options, flatten="flatten" in options, swap_ab="swap" in options)
            if "split" in options:
                rows, splits = split_plan(t, n, k, bm, bn, bk, sms)
                if rows == 0:
                    continue
                opts |= dict(split_rows=rows, split_k=splits)
            yield GemmConfig(bm, bn, bk, 8, w, s, **opts)
        return
    if int8:
        for convert in ("cast", "permute"):
            yield GemvConfig(**{**gemv_config(n, k, t, sms, int8=True).__dict__, "int8_convert": convert})
    for bn, bk, w, s in GEMV_TILES[(min(t, 2), "int8" if int8 else fmt)]:
        bk = min(bk, max(16, 2 ** math.ceil(math.log2(k))))
        rule = gemv_split_k(n, k, bn, bk, sms)
        for split in sorted({1, rule, min(2 * rule, -(-k // bk))}):
            yield GemvConfig(bn, bk, split, w, s, late_launch=t > 1)
            if split > 1:  # the partials added by the last split's program instead of a reduce kernel
                yield GemvConfig(bn, bk, split, w, s, fused_reduce=True, late_launch=t > 1)


def sweep(fn, weights, configs, expected: torch.Tensor, moved: int, bandwidth: float, repeats: int) -> list[dict]:
    """Each config's time of ``fn(w, cfg)`` over the rotating ``weights`` and its max error against
    ``expected``; a config that fails to compile or run is reported with its error."""
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


def describe(c: dict) -> str:
    fields = ("block_m", "block_n", "block_k") if "block_m" in c else ("block_n", "block_k")
    name = "x".join(str(c[f]) for f in fields)
    name += f" w{c['num_warps']} s{c['num_stages']}" + "".join(
        f" {f}" for f in ("persistent", "tma", "flatten", "swap_ab", "fused_reduce") if c.get(f))
    name += " ws" if c.get("warp_specialize") else ""  # in records: the warp-specialized tiles that faulted
    name += f" split{c['split_k']}" if c.get("split_k", 1) > 1 and "block_m" not in c else ""
    name += f" tail {c['split_rows']}x{c['split_k']}" if c.get("split_rows") else ""
    convert = c.get("int8_convert", "bits" if c.get("bit_convert", True) else "cast")  # or a record's bit_convert
    return name + ("" if convert == "bits" else f" {convert}")


def print_best(rows: list[dict], best: int = 3) -> None:
    """The ``best`` fastest swept configs (and the fastest persistent one); failures counted."""
    timed = sorted((r for r in rows if "us" in r), key=lambda r: r["us"])
    for r in timed[:best] + [r for r in timed[best:] if r["config"].get("persistent")][:1]:
        print(f"{'':>42} sweep {r['us']:8.1f} us {r['copy_fraction']:6.1%} err {r['max_abs_err']:.1e}  "
              f"{describe(r['config'])}")
    if len(timed) < len(rows):
        print(f"{'':>42} sweep: {len(rows) - len(timed)} configs failed (their errors are in the record)")


def layer_rows(args, run, fmt: str, model: str, layer: str, n: int, k: int, bandwidth: float, sms: int) -> None:
    """The records of one weight (every T, with and without SwiGLU) in ``fmt``."""
    from tileinfer.backends.reference.linear import linear as ref_linear
    from tileinfer.backends.triton.int8_dequant import dequantize_int8
    from tileinfer.backends.triton.linear import linear, rule_config
    from tileinfer.backends.triton.linear_tiles import gemm_config

    int8, layout = fmt != "bf16", LAYOUT[fmt]
    scratch = torch.empty(n, k, dtype=torch.bfloat16, device="cuda") if fmt == "int8d" else None
    copies = max(2, math.ceil(ROTATION_BYTES / (n * k * (1 if int8 else 2))))
    weights = [weight(fmt, n, k, seed) for seed in range(copies)]
    bf16 = [(as_bf16(w), None) for w in weights[:max(2, copies // (2 if int8 else 1))]]
    out_dtype = torch.float32 if layer == "lm_head" else torch.bfloat16
    peers: list | str | None = None
    for swiglu, name in [(False, layer)] + ([(True, "gate_up+swiglu")] if layer == "gate_up" else []):
        for t in [t for t in args.tokens if scratch is None or t > 16]:
            x = torch.randn(t, k, device="cuda", dtype=torch.bfloat16)

            def triton_fn(w, cfg=None, x=x, swiglu=swiglu):
                if scratch is not None and w[1] is not None:  # int8d: the dequantization, then the BF16 GEMM
                    w = (dequantize_int8(w[0], torch.bfloat16, out=scratch), w[1])
                return linear(x, *w, out_dtype=out_dtype, swiglu=swiglu, config=cfg,
                              int8_layout=layout if w[1] is not None else "rows")

            def cublas_fn(w, x=x, swiglu=swiglu):
                return ref_linear(x, w[0], out_dtype=out_dtype, swiglu=swiglu)

            expected = ref_linear(x, *weights[0], out_dtype=out_dtype, swiglu=swiglu, int8_layout=layout)
            err = (triton_fn(weights[0]).float() - expected.float()).abs().max().item()
            cfg = rule_config(x, scratch if scratch is not None else weights[0][0], weights[0][1], swiglu=swiglu,
                              out_dtype=out_dtype)
            us = {"triton_us": rotated_seconds(triton_fn, weights, args.repeats),
                  "cublas_us": rotated_seconds(cublas_fn, bf16, args.repeats),
                  "bf16_triton_us": rotated_seconds(triton_fn, bf16, args.repeats) if int8 else None,
                  "tiled_us": None, "triton_eager_us": None}
            if t > 16 and cfg.persistent:
                tiled = gemm_config(t, n, k, sms, int8=int8 and scratch is None, swiglu=swiglu)
                us["tiled_us"] = rotated_seconds(lambda w: triton_fn(w, tiled), weights, args.repeats)
            if args.eager:
                us["triton_eager_us"] = median_seconds(lambda: [triton_fn(w) for w in weights], "cuda") / len(weights)
            us = {key: None if v is None else v * 1e6 for key, v in us.items()}
            n_out = n // 2 if swiglu else n
            moved = n * k * (1 if int8 else 2) + (4 * n if int8 else 0) + 2 * t * k \
                + t * n_out * out_dtype.itemsize
            seconds = us["triton_us"] / 1e6
            rec = dict(format=fmt, model=model, layer=name, N=n, K=k, T=t, swiglu=swiglu, sms=sms,
                       out_dtype=str(out_dtype)[6:], **us, gb_s=moved / seconds / 1e9,
                       copy_fraction=moved / seconds / bandwidth, tflop_s=2 * t * n * k / seconds / 1e12,
                       max_abs_err=err, max_abs_ref=expected.float().abs().max().item(), config=cfg.__dict__,
                       copy_bandwidth_tb_s=bandwidth / 1e12)
            if args.sweep and (not swiglu or t > 16):
                configs = [c for c in sweep_configs(n, k, t, sms, fmt, swiglu)
                           if args.sweep_filter is None or args.sweep_filter in describe(c.__dict__)]
                rec["sweep"] = sweep(triton_fn, weights, configs, expected, moved, bandwidth, args.repeats)
            if fmt == "int8" and not swiglu and t in GEMLITE_TOKENS:
                build, rec["gemlite"] = gemlite_a16w8()
                if peers is None:
                    try:
                        peers = [build(*w) for w in weights] if build else rec["gemlite"]
                    except Exception as e:  # noqa: BLE001 - recorded per row
                        peers = f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]}"
                rec.update(gemlite_row(peers, x, expected, args.repeats))
            run.add("linear", **rec)
            cell = lambda v: f"{v:9.1f}" if v is not None else f"{'-':>9}"  # noqa: E731
            print(f"{fmt:<5} {model:<11} {name:<15} {f'{n}x{k}':>12} {t:>5} {cell(rec['triton_us'])} "
                  f"{cell(rec['tiled_us'])} {cell(rec['cublas_us'])} {cell(rec['bf16_triton_us'])} "
                  f"{rec['copy_fraction']:7.1%} {rec['tflop_s'] if t > 16 else 0:8.1f} {err:9.2e}  "
                  f"{describe(cfg.__dict__)}"
                  + (f"  gemlite {rec['gemlite_us']:.1f} us" if "gemlite_us" in rec else ""), flush=True)
            print_best(rec.get("sweep", []))


def per_layer(args, run, bandwidth: float, sms: int) -> None:
    print(f"{'fmt':<5} {'model':<11} {'layer':<15} {'N x K':>12} {'T':>5} {'triton us':>9} {'tiled us':>9} "
          f"{'cublas us':>9} {'bf16 us':>9} {'of copy':>7} {'TFLOP/s':>8} {'max err':>9}  config")
    for fmt in args.formats:
        for model in args.models:
            for layer, (n, k) in ((la, nk) for la, nk in layer_shapes(model).items() if la in args.layers):
                torch.cuda.empty_cache()
                layer_rows(args, run, fmt, model, layer, n, k, bandwidth, sms)
    gemv = [r for r in run.records if r["T"] <= 16 and not r["swiglu"]]
    if gemv:
        print(f"GEMV median fraction of copy bandwidth: {statistics.median(r['copy_fraction'] for r in gemv):.1%}")


def step_fn(layers, lm_head, dims, x, kind: str, layout: str = "rows"):
    """One decode step's projections on x [T, hidden] (norms, SwiGLU, residual adds) -> the logits:
    ``cublas`` the twins, ``per-op`` / ``fused`` the Triton kernels with PDL (the fused call's tiles);
    ``layout``: the int8 weights' layout."""
    from tileinfer.backends.reference.linear import linear as ref_linear
    from tileinfer.backends.reference.rms_norm import rms_norm as ref_rms_norm
    from tileinfer.backends.triton.add import add
    from tileinfer.backends.triton.linear import linear, rule_config
    from tileinfer.backends.triton.rms_norm import rms_norm
    from tileinfer.backends.triton.silu_mul import silu_mul

    def lin(a, w, norm=None, swiglu=False, residual=None, out_dtype=None):
        if kind == "cublas":
            a = a if norm is None else ref_rms_norm(a, norm, 1e-6)
            return ref_linear(a, *w, out_dtype=out_dtype, swiglu=swiglu, residual=residual, int8_layout=layout)
        a = a if norm is None else rms_norm(a, norm, 1e-6, pdl=True)
        if kind == "fused":
            return linear(a, *w, out_dtype=out_dtype, swiglu=swiglu, residual=residual, pdl=True, int8_layout=layout)
        cfg = rule_config(a, *w, swiglu=swiglu, out_dtype=out_dtype)
        y = linear(a, *w, out_dtype=out_dtype, config=cfg, pdl=True, int8_layout=layout)
        y = silu_mul(y, pdl=True) if swiglu else y
        return y if residual is None else add(y, residual, pdl=True)

    def run():
        h = x
        for la in layers:
            qkv = lin(h, la["qkv"], norm=la["input_norm"])
            h = lin(qkv[:, :dims["q"]], la["o"], residual=h)
            h = lin(lin(h, la["gate_up"], norm=la["post_norm"], swiglu=True), la["down"], residual=h)
        return lin(h, lm_head, norm=dims["final_norm"], out_dtype=torch.float32)

    return run


def decode_step(args, run, bandwidth: float) -> None:
    for model in args.models:
        s = SHAPES[model]
        h, d, i = s["hidden_size"], s["head_dim"], s["intermediate_size"]
        q, kv = s["num_attention_heads"] * d, s["num_key_value_heads"] * d
        shapes = dict(qkv=(q + 2 * kv, h), o=(h, q), gate_up=(2 * i, h), down=(h, i))
        norm = lambda: (torch.rand(h, device="cuda") + 0.5).to(torch.bfloat16)  # noqa: E731
        for fmt in args.formats:
            layers = [{name: weight(fmt, *shape, 10 * n + j) for j, (name, shape) in enumerate(shapes.items())}
                      | dict(input_norm=norm(), post_norm=norm()) for n in range(s["num_hidden_layers"])]
            lm_head, dims = weight(fmt, s["vocab_size"], h, 7), dict(q=q, final_norm=norm())
            ws = [w for la in layers for w in la.values() if isinstance(w, tuple)] + [lm_head]
            weight_bytes = sum(w.numel() * w.element_size() + (0 if sc is None else 4 * sc.numel()) for w, sc in ws)
            for t in args.tokens:
                x = torch.randn(t, h, device="cuda", dtype=torch.bfloat16)
                kinds = ("cublas", "per-op", "fused") if fmt == "bf16" else ("per-op", "fused")
                fns = {kind: step_fn(layers, lm_head, dims, x, kind, LAYOUT[fmt]) for kind in kinds}
                chain = fns["per-op"]().clone()
                assert torch.equal(fns["fused"](), chain), f"{fmt} fused differs from per-op"
                for kind, fn in fns.items():
                    seconds = graph_seconds(fn, repeats=args.repeats)
                    frac = weight_bytes / seconds / bandwidth
                    print(f"{model:<11} {fmt:<5} T={t:<3} {kind:<8} {seconds * 1e3:8.3f} ms  {frac:6.1%} of copy BW",
                          flush=True)
                    run.add("linear_decode_step", format=fmt, model=model, T=t, variant=kind, ms=seconds * 1e3,
                            weight_bytes=weight_bytes, bandwidth_fraction=frac, copy_bandwidth_tb_s=bandwidth / 1e12)
            del layers, lm_head, ws
            torch.cuda.empty_cache()


def main(args) -> int:
    if not gpu_visible("linear"):
        return 2
    import triton

    from tileinfer.backends.triton.interpreter import num_sms

    args.tokens = args.tokens or ([1, 4, 16] if args.decode_step else [1, 4, 16, 1024])
    began = time.perf_counter()
    sms = num_sms(torch.cuda.current_device())
    bandwidth = copy_bandwidth(torch.device("cuda"))
    print(f"{torch.cuda.get_device_name()}: {sms} SMs, copy bandwidth {bandwidth / 1e12:.2f} TB/s (read + write), "
          f"torch {torch.__version__}, triton {triton.__version__}", flush=True)
    run = records.Run("cuda", commit=args.commit, path=args.records)
    decode_step(args, run, bandwidth) if args.decode_step else per_layer(args, run, bandwidth, sms)
    print(f"{time.perf_counter() - began:.0f} s; appended {len(run.records)} records to {run.path}")
    return 0


def tables() -> list:
    from ..report import Table, markdown, number

    def per_layer_table(rows: list[dict]) -> str:
        body = [[r["format"], r["layer"], str(r["T"]), number(r.get("triton_us")), number(r.get("tiled_us")),
                 number(r.get("cublas_us")), number(r.get("bf16_triton_us")), f"{r.get('copy_fraction', 0):.1%}",
                 describe(r["config"])] for r in sorted(rows, key=lambda r: (r["format"], r["T"], r["layer"]))]
        return markdown(["format", "layer", "T", "Triton us (rule)", "tiled GEMM us", "cuBLAS bf16 us",
                         "BF16 Triton us", "of copy bandwidth", "rule's tiles"], body)

    def step_table(rows: list[dict]) -> str:
        body = [[r["format"], str(r["T"]), r["variant"], f"{r['ms']:.3f}", f"{r['bandwidth_fraction']:.1%}"]
                for r in sorted(rows, key=lambda r: (r["format"], r["T"], r["variant"]))]
        return markdown(["format", "T", "variant", "ms", "weights at of copy bandwidth"], body)

    def missing(rows: list[dict], _group: str) -> list[str]:  # a run of a few layers (a sweep) is not the table
        return [f"bf16 {layer}" for layer in LAYERS if not any(r["format"] == "bf16" and r["layer"] == layer
                                                                 for r in rows)]

    return [Table("linear", "{group}: the linear per layer", per_layer_table, group=lambda r: r["model"],
                  select=lambda r: "triton_us" in r and "gb_s" in r, missing=missing),
            Table("linear_decode_step", "{group}: a decode step's linears", step_table, group=lambda r: r["model"],
                  select=lambda r: "ms" in r and "variant" in r)]
