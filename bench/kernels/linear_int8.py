"""The W8A16 Triton linear (backends/triton/linear_int8.py: GEMV / GEMM) against the BF16 Triton linear and torch (cuBLAS) at the Qwen3 layer shapes, on one GPU.

    python bench/kernels/linear_int8.py [--models Qwen3-0.6B,Qwen3-4B] [--tokens 1,4,16,1024] [--sweep]
                                        [--decode-step] [--repeats N] [--out DIR]

Per layer (default). For each layer's weight ([N, K]: q/k/v and gate/up fused as the engine loads
them) and each T: random int8 rows over [-128, 127] with float32 row scales. Checks
``linear_int8`` against its twin (int8 -> bf16, torch's matmul with float32 accumulation, the
scale) and prints the max error, then times, as bench/kernels/linear.py does (a CUDA graph of one
call per weight copy, rotating among enough copies that no weight is in the L2): the INT8 Triton
linear, the BF16 Triton linear on a bf16 weight of the same shape, and cuBLAS BF16 (F.linear).
Columns: the three times (us), INT8 speed-up over the BF16 Triton linear, INT8 GB/s (int8 weight +
scales + activation + output bytes over time) and that as a fraction of the copy bandwidth
measured in the same run, TFLOP/s for the GEMM rows. The ``gate_up+swiglu`` row runs the SwiGLU
epilogue. ``--sweep`` also times other tiles and Triton's plain int8 cast instead of the conversion
on bit patterns (``bit_convert=False``), for tuning ``gemv_int8_config`` / ``gemm_int8_config``,
with each one's max error against the twin; at T > 16 the persistent GEMM's candidates too
(``PERSISTENT_SWAPPED``, ``PERSISTENT_PLAIN``), on the ``gate_up+swiglu`` row as well.

A kernel-level peer at T = 1 and 16 (the rows without the SwiGLU epilogue): gemlite's A16W8 Triton
GEMV/GEMM (``A16W8_INT8(dtype=bfloat16).from_weights(weight=q, scales=scale[:, None])``, built from
the same int8 weights and scales, bfloat16 output; its own kernel choice and autotuning, untimed),
timed the same way: ``gemlite_us`` and its max error against the twin. Where gemlite does not
import (it needs a GPU to import; bench/device.sh carries it), the run prints why and the record's
``gemlite`` field holds the reason instead of its version.

Decode step (``--decode-step``, --tokens default 1,4,16): the linears of one whole decode step
(every layer with its own weights, the norms in the GEMV prologue and the residual adds in the
epilogue (``options.triton.norm_prologue=true``; the default runs the norm as a kernel), then the lm_head with float32 logits), replayed from
one CUDA graph with PDL, INT8 against BF16: ms per step, the ratio, and the weight bytes over that
as a fraction of the copy bandwidth. This is the ratio the decode target (INT8 >= 1.8x BF16 at
Qwen3-4B) rests on.

With --out DIR the record goes to DIR/linear_int8.json (DIR/linear_int8_decode_step.json with --decode-step).
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import op_benchmark  # noqa: E402
from linear import layer_shapes, persistent_configs, print_best, rotated_seconds, run, sweep  # noqa: E402
from shapes import SHAPES  # noqa: E402
from timing import graph_seconds  # noqa: E402

GEMLITE_TOKENS = (1, 16)  # the step sizes gemlite's A16W8 is timed at (decode, a 16-token verify step)


def parse_args(argv: list[str] | None):
    p = op_benchmark.parser(__doc__, tokens="", tokens_help="1,4,16,1024; with --decode-step 1,4,16")
    p.add_argument("--sweep", action="store_true", help="also time alternative tiles and the plain int8 cast")
    p.add_argument("--decode-step", action="store_true", help="time a whole decode step's linears instead")
    args = op_benchmark.parse_args(p, argv)
    args.tokens = args.tokens or ([1, 4, 16] if args.decode_step else [1, 4, 16, 1024])
    return args


def int8_weight(n: int, k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randint(-128, 128, (n, k), generator=g, device="cuda", dtype=torch.int8)
    scale = (torch.rand(n, generator=g, device="cuda") + 0.5) / (k * 5461.5) ** 0.5
    return q, scale


# Persistent W8A16 candidates for T > 16, as linear.py's PERSISTENT_TILES: transposed (swap_ab, the
# rule's form) and not; the split tail only untransposed (Int8GemmConfig refuses swap_ab with it).
PERSISTENT_SWAPPED = [
    (128, 128, 64, 8, 3, "tma"), (128, 128, 64, 8, 4, "tma"), (128, 128, 128, 8, 3, "tma"), (128, 64, 128, 4, 3, "tma"),
    (128, 64, 128, 4, 4, "tma"), (128, 128, 64, 8, 3, "tma flatten"), (128, 128, 64, 8, 3, ""),
]
PERSISTENT_PLAIN = [(128, 128, 64, 8, 3, "tma"), (128, 128, 128, 8, 3, "tma"), (128, 256, 64, 8, 3, "tma"),
                    (128, 128, 64, 8, 3, "tma split"), (128, 64, 128, 4, 3, "tma split"), (64, 128, 128, 4, 3, "tma split")]


def sweep_configs(n: int, k: int, t: int, sms: int):
    from tileinfer.backends.triton.linear_gemv import gemv_split_k
    from tileinfer.backends.triton.linear_int8 import Int8GemmConfig, Int8GemvConfig, gemm_int8_config, gemv_int8_config

    if t > 16:
        # the rule's tile with Triton's cast, and the best two others of the last sweep (tiles_a1a4273)
        rule = gemm_int8_config(t, n, k, sms)
        yield Int8GemmConfig(**{**rule.__dict__, "bit_convert": False})
        yield Int8GemmConfig(128, 64, 128, 8, 4, 3, swap_ab=True)
        yield Int8GemmConfig(128, 128, 64, 8, 8, 3)
        yield from persistent_configs(Int8GemmConfig, t, n, k, sms, PERSISTENT_SWAPPED, swap_ab=True)
        yield from persistent_configs(Int8GemmConfig, t, n, k, sms, PERSISTENT_PLAIN)
        return
    rule = gemv_int8_config(n, k, t, sms)
    yield Int8GemvConfig(**{**rule.__dict__, "bit_convert": False})
    if t == 1:
        # the rule's 64 int8 elements a thread (16 bytes x 4 in flight, as the BF16 GEMV), and half
        # that (32 float32 accumulators a thread, as the BF16 GEMV holds)
        tiles = [(4, 1024, 2, 1), (4, 2048, 4, 1), (8, 1024, 4, 1), (2, 2048, 2, 1), (4, 512, 1, 1), (8, 512, 2, 1),
                 (16, 1024, 8, 1), (4, 1024, 2, 2), (4, 1024, 4, 1), (2, 1024, 2, 1), (4, 512, 2, 1), (8, 1024, 8, 1),
                 (4, 2048, 8, 1)]
    else:
        tiles = [(32, 256, 4, 4), (32, 128, 4, 4), (32, 512, 4, 3), (64, 256, 4, 3), (16, 256, 4, 3), (16, 512, 4, 2),
                 (64, 128, 4, 4)]
    for bn, bk, w, s in tiles:
        split = gemv_split_k(n, k, bn, bk, sms)
        for sk in sorted({1, split, min(2 * split, -(-k // bk))}):
            yield Int8GemvConfig(bn, min(bk, k), sk, w, s)
            if sk > 1:  # the partials added by the last split's program instead of a reduce kernel
                yield Int8GemvConfig(bn, min(bk, k), sk, w, s, fused_reduce=True)


def per_layer(args, bandwidth: float, sms: int) -> dict:
    import torch.nn.functional as F

    from tileinfer.backends.reference.linear_int8 import linear_int8 as ref_linear_int8
    from tileinfer.backends.triton.linear import linear
    from tileinfer.backends.triton.linear_int8 import gemm_int8_config, gemv_int8_config, linear_int8

    records = []
    gemlite_build, gemlite_what = gemlite_a16w8()
    print(f"peer at T = {', '.join(map(str, GEMLITE_TOKENS))}: {gemlite_what}", flush=True)
    print(f"{'model':<11} {'layer':<15} {'N x K':>13} {'T':>5} {'int8 us':>8} {'bf16 us':>8} {'cublas':>8} "
          f"{'x bf16':>6} {'GB/s':>6} {'of copy':>7} {'TFLOP/s':>8} {'max err':>9}  config")
    for model in args.models:
        for layer, (n, k) in layer_shapes(model).items():
            torch.cuda.empty_cache()
            copies = max(2, math.ceil(op_benchmark.ROTATION_BYTES / (n * k)))
            int8 = [int8_weight(n, k, c) for c in range(copies)]
            bf16 = [(q.to(torch.bfloat16) * s[:, None].to(torch.bfloat16)) for q, s in int8[:max(2, copies // 2)]]
            out_dtype = torch.float32 if layer == "lm_head" else torch.bfloat16
            peer_layers: list | str | None = None  # gemlite's linears of the int8 copies, built at first use
            for swiglu, name in [(False, layer)] + ([(True, "gate_up+swiglu")] if layer == "gate_up" else []):
                for t in args.tokens:
                    x = torch.randn(t, k, device="cuda", dtype=torch.bfloat16)

                    def int8_fn(w, cfg=None, x=x, swiglu=swiglu):
                        return linear_int8(x, w[0], w[1], out_dtype=out_dtype, swiglu=swiglu, config=cfg)

                    def bf16_fn(w, x=x, swiglu=swiglu):
                        return linear(x, w, out_dtype=out_dtype, swiglu=swiglu)

                    def cublas_fn(w, x=x):
                        return F.linear(x, w)

                    y = int8_fn(int8[0])
                    expected = ref_linear_int8(x, *int8[0], out_dtype, swiglu=swiglu)
                    err = (y.float() - expected.float()).abs().max().item()
                    t_int8 = rotated_seconds(int8_fn, int8, args.repeats)
                    t_bf16 = rotated_seconds(bf16_fn, bf16, args.repeats)
                    t_cublas = rotated_seconds(cublas_fn, bf16, args.repeats)
                    n_out = n // 2 if swiglu else n
                    moved = n * k + 4 * n + t * k * 2 + t * n_out * out_dtype.itemsize
                    cfg = gemv_int8_config(n, k, t, sms) if t <= 16 else gemm_int8_config(t, n, k, sms)
                    rec = dict(model=model, layer=name, N=n, K=k, T=t, swiglu=swiglu, out_dtype=str(out_dtype)[6:],
                               int8_us=t_int8 * 1e6, bf16_triton_us=t_bf16 * 1e6, cublas_bf16_us=t_cublas * 1e6,
                               speedup_vs_bf16=t_bf16 / t_int8, int8_gb_s=moved / t_int8 / 1e9,
                               copy_fraction=moved / t_int8 / bandwidth, int8_tflop_s=2 * t * n * k / t_int8 / 1e12,
                               max_abs_err=err, max_abs_ref=expected.float().abs().max().item(), config=cfg.__dict__)
                    if args.sweep and (not swiglu or t > 16):
                        rec["sweep"] = sweep(lambda w, cfg: int8_fn(w, cfg), int8, sweep_configs(n, k, t, sms),
                                             expected, moved, bandwidth, args.repeats)
                    if gemlite_build and not swiglu and t in GEMLITE_TOKENS:
                        if peer_layers is None:
                            try:
                                peer_layers = [gemlite_build(q, s) for q, s in int8]
                            except Exception as e:  # noqa: BLE001 - recorded per row
                                peer_layers = f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]}"
                        rec.update(gemlite_row(peer_layers, x, expected, args.repeats))
                    records.append(rec)
                    tf = f"{rec['int8_tflop_s']:8.1f}" if t > 16 else f"{'':8}"
                    print(f"{model:<11} {name:<15} {f'{n}x{k}':>13} {t:>5} {rec['int8_us']:8.1f} {rec['bf16_triton_us']:8.1f} "
                          f"{rec['cublas_bf16_us']:8.1f} {rec['speedup_vs_bf16']:6.2f} {rec['int8_gb_s']:6.0f} "
                          f"{rec['copy_fraction']:7.1%} {tf} {err:9.2e}  {tuple(cfg.__dict__.values())}"
                          + (f"  gemlite {rec['gemlite_us']:.1f} us" if "gemlite_us" in rec else "")
                          + (f"  gemlite: {rec['gemlite_error']}" if "gemlite_error" in rec else ""), flush=True)
                    print_best(rec.get("sweep", []))
            del int8, bf16, peer_layers
    return dict(sms=sms, gemlite=gemlite_what, results=records)


def gemlite_a16w8():
    """``(build, what)``: ``build(q, scale)`` makes gemlite's A16W8 linear from an int8 weight
    ``q`` ``[N, K]`` and its float32 scales ``[N]`` (a callable ``x [T, K] bf16 -> [T, N] bf16``),
    ``what`` gemlite's version; or ``(None, why)`` where gemlite does not import."""
    try:
        import gemlite
        from gemlite.helper import A16W8_INT8
    except Exception as exc:  # noqa: BLE001 - any import failure is recorded as the reason
        return None, f"gemlite does not import ({type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:200]})"

    def build(q: torch.Tensor, scale: torch.Tensor):
        return A16W8_INT8(device=str(q.device), dtype=torch.bfloat16).from_weights(weight=q, scales=scale[:, None])

    return build, f"gemlite {gemlite.__version__}"


def gemlite_row(layers: list | str, x: torch.Tensor, expected: torch.Tensor, repeats: int) -> dict:
    """gemlite's time per call over the rotated weight copies ``layers`` (as the INT8 Triton
    linear's) and its max error against the twin's ``expected``; ``gemlite_error`` instead where
    it was not built (``layers`` is then the reason) or failed."""
    if isinstance(layers, str):
        return {"gemlite_error": layers}
    try:
        err = (layers[0](x).float() - expected.float()).abs().max().item()
        return {"gemlite_us": rotated_seconds(lambda g: g(x), layers, repeats) * 1e6, "gemlite_max_abs_err": err}
    except Exception as e:  # noqa: BLE001 - a peer kernel that fails is reported, the sweep goes on
        return {"gemlite_error": f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]}"}


def step_fn(kind: str, x, layers, lm_head, final_norm, bf16: dict, q_dim: int):
    """One decode step's linears on x [T, hidden] (norms in the GEMV prologue, residual adds in the
    epilogue, PDL): INT8 weights (``kind="int8"``) or their BF16 copies ``bf16[id(weight)]``."""
    from tileinfer.backends.triton.linear import linear
    from tileinfer.backends.triton.linear_int8 import linear_int8

    def lin(a, w, **kw):
        if kind == "int8":
            return linear_int8(a, w[0], w[1], pdl=True, **kw)
        return linear(a, bf16[id(w)], pdl=True, **kw)

    def run():
        hs = x
        for la in layers:
            qkv = lin(hs, la["qkv"], norm_weight=la["input_norm"])
            hs = lin(qkv[:, :q_dim], la["o"], residual=hs)
            act = lin(hs, la["gate_up"], swiglu=True, norm_weight=la["post_norm"])
            hs = lin(act, la["down"], residual=hs)
        return lin(hs, lm_head, out_dtype=torch.float32, norm_weight=final_norm)
    return run


def decode_step(args, bandwidth: float) -> dict:
    records = []
    for model in args.models:
        s = SHAPES[model]
        h, d, i = s["hidden_size"], s["head_dim"], s["intermediate_size"]
        q_dim, kv = s["num_attention_heads"] * d, s["num_key_value_heads"] * d
        shapes = dict(qkv=(q_dim + 2 * kv, h), o=(h, q_dim), gate_up=(2 * i, h), down=(h, i))
        norm = lambda: (torch.rand(h, device="cuda") + 0.5).to(torch.bfloat16)  # noqa: E731
        layers = [{name: int8_weight(*shape, 10 * n + j) for j, (name, shape) in enumerate(shapes.items())}
                  | dict(input_norm=norm(), post_norm=norm()) for n in range(s["num_hidden_layers"])]
        lm_head, final_norm = int8_weight(s["vocab_size"], h, 7), norm()
        weights = [w for la in layers for w in la.values() if isinstance(w, tuple)] + [lm_head]
        bytes_int8 = sum(q.numel() + 4 * q.shape[0] for q, _ in weights)
        bf16 = {id(w): w[0].to(torch.bfloat16) * w[1][:, None].to(torch.bfloat16)
                for la in layers for w in la.values() if isinstance(w, tuple)}
        bf16[id(lm_head)] = lm_head[0].to(torch.bfloat16) * lm_head[1][:, None].to(torch.bfloat16)
        for t in args.tokens:
            x = torch.randn(t, h, device="cuda", dtype=torch.bfloat16)
            times = {kind: graph_seconds(step_fn(kind, x, layers, lm_head, final_norm, bf16, q_dim), repeats=args.repeats)
                     for kind in ("bf16", "int8")}
            ratio = times["bf16"] / times["int8"]
            frac = bytes_int8 / times["int8"] / bandwidth
            print(f"{model:<11} T={t:<3} bf16 {times['bf16'] * 1e3:7.3f} ms  int8 {times['int8'] * 1e3:7.3f} ms  "
                  f"x{ratio:5.2f}  int8 weights at {frac:6.1%} of copy BW", flush=True)
            records.append(dict(model=model, T=t, bf16_ms=times["bf16"] * 1e3, int8_ms=times["int8"] * 1e3,
                                speedup=ratio, int8_weight_bytes=bytes_int8, int8_bandwidth_fraction=frac))
        layers = lm_head = bf16 = weights = None  # freed before the next model's
        torch.cuda.empty_cache()
    return dict(results=records)


def main(argv: list[str] | None = None) -> int:
    return run(argv, "linear_int8.py", "linear_int8", parse_args, per_layer, decode_step)


if __name__ == "__main__":
    sys.exit(main())
