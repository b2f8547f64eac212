"""The linears of one whole decode step (every layer, then the lm_head), replayed from one CUDA graph.

    python bench/kernels/bench_decode_linears.py [--models Qwen3-4B,Qwen3-0.6B] [--tokens 1,4,16] [--out DIR]

Each layer has its own random BF16 weights (q/k/v and gate/up fused, as the engine loads them), so
nothing stays in L2 between layers; the activations flow as in the model: h -> qkv, q rows -> o_proj,
-> gate_up (+ SwiGLU) -> down -> the next layer's h; the lm_head writes float32 logits. Variants:

- ``cublas``: torch (``reference.linear``) for every projection, SwiGLU as its own op;
- ``triton``: ``backends.triton.linear`` with the tile rule, SwiGLU fused into gate_up;
- ``triton-pdl``: the same kernels launched with programmatic dependent launch (each kernel lets the
  next start early; the next issues its first weight loads before waiting);
- ``triton-pdl/<tile>`` (with ``--alt-tiles``): PDL, and an alternative T = 1 tile for the layers
  with N <= 6,144 (qkv, o_proj, down), to see whether more bytes in flight per SM lift the small
  layers;
- ``norms-chain``: the decoder's residual stream with its RMSNorms and residual adds as kernels of
  their own (``linear_unfused``: norm, GEMV, add; PDL), the per-op engine's linears;
- ``norms-fused``: the same step as the engine's ``linear=triton_fused`` runs it: the RMSNorm in
  each GEMV's prologue, the residual add in its epilogue (PDL); bit-identical to ``norms-chain``.

Timing: ``triton.testing.do_bench`` of the graph replay (median). Each row: ms per step, weight
bytes over that time as a fraction of the copy bandwidth measured in the same run, and the ratio
to cuBLAS. Checks first that every Triton variant's logits equal the plain Triton launch's bit for
bit (PDL and tiles with the same K order) or are close to cuBLAS's.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from limits import copy_bandwidth  # noqa: E402
from shapes import SHAPES  # noqa: E402

ALT_TILES = {  # name: (BLOCK_N, BLOCK_K, split_k, num_warps, num_stages), for T = 1 small layers
    "bn4-bk1024-w4": (4, 1024, 1, 4, 1),
    "bn2-bk1024-w2": (2, 1024, 1, 2, 1),
    "bn8-bk512-w4": (8, 512, 1, 4, 1),
    "bn4-bk512-w2-s2": (4, 512, 1, 2, 2),
    "bn1-bk1024-w2": (1, 1024, 1, 2, 1),
    "bn4-bk512-split2": (4, 512, 2, 2, 1),
}


def make_layers(shape: str, device: torch.device) -> tuple[list[dict], torch.Tensor, dict]:
    s = SHAPES[shape]
    h, d, i = s["hidden_size"], s["head_dim"], s["intermediate_size"]
    q, kv = s["num_attention_heads"] * d, s["num_key_value_heads"] * d

    def weight(n: int, k: int) -> torch.Tensor:
        return (torch.randn(n, k, device=device) / k**0.5).to(torch.bfloat16)

    def norm_weight() -> torch.Tensor:
        return (torch.rand(h, device=device) + 0.5).to(torch.bfloat16)

    layers = [dict(qkv=weight(q + 2 * kv, h), o=weight(h, q), gate_up=weight(2 * i, h), down=weight(h, i),
                   input_norm=norm_weight(), post_norm=norm_weight())
              for _ in range(s["num_hidden_layers"])]
    return layers, weight(s["vocab_size"], h), dict(h=h, q=q, kv=kv, i=i, final_norm=norm_weight())


def step_fn(layers, lm_head, dims, x, kind: str, tiles: dict | None = None, pdl: bool = False):
    """A function that runs every layer's projections on x [T, h] and returns the logits."""
    from tileinfer.backends.reference.linear import linear as ref_linear
    from tileinfer.backends.reference.linear import silu_mul as ref_silu_mul
    from tileinfer.backends.triton.linear import linear, linear_unfused

    if kind.startswith("norms-"):
        lin = linear if kind == "norms-fused" else linear_unfused

        def residual_stream():
            h = x
            for layer in layers:
                qkv = lin(h, layer["qkv"], norm_weight=layer["input_norm"], pdl=pdl)
                h = lin(qkv[:, :dims["q"]], layer["o"], residual=h, pdl=pdl)
                act = lin(h, layer["gate_up"], epilogue="swiglu", norm_weight=layer["post_norm"], pdl=pdl)
                h = lin(act, layer["down"], residual=h, pdl=pdl)
            return lin(h, lm_head, out_dtype=torch.float32, norm_weight=dims["final_norm"], pdl=pdl)

        return residual_stream

    def tri(a, w, epilogue="none", out_dtype=None):
        cfg = tiles.get(tuple(w.shape)) if tiles and a.shape[0] == 1 else None
        return linear(a, w, epilogue=epilogue, out_dtype=out_dtype, config=cfg, pdl=pdl)

    def run():
        a = x
        for layer in layers:
            if kind == "cublas":
                qkv = ref_linear(a, layer["qkv"])
                o = ref_linear(qkv[:, :dims["q"]], layer["o"])
                act = ref_silu_mul(ref_linear(o, layer["gate_up"]))
                a = ref_linear(act, layer["down"])
            else:
                qkv = tri(a, layer["qkv"])
                o = tri(qkv[:, :dims["q"]], layer["o"])
                act = tri(o, layer["gate_up"], "swiglu")
                a = tri(act, layer["down"])
        if kind == "cublas":
            return ref_linear(a, lm_head, torch.float32)
        return tri(a, lm_head, out_dtype=torch.float32)

    return run


def alt_tiles(name: str, dims: dict) -> dict:
    from tileinfer.backends.triton.linear import GemvConfig

    bn, bk, split, warps, stages = ALT_TILES[name]
    h, q, kv, i = dims["h"], dims["q"], dims["kv"], dims["i"]
    return {shape: GemvConfig(bn, min(bk, k), split, warps, stages)
            for shape in [(q + 2 * kv, h), (h, q), (h, i)] for k in [shape[1]]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="Qwen3-4B,Qwen3-0.6B")
    parser.add_argument("--tokens", default="1,4,16")
    parser.add_argument("--rep-ms", type=float, default=300.0)
    parser.add_argument("--alt-tiles", action="store_true", help="also time the alternative T = 1 tiles")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("error: bench_decode_linears.py needs a CUDA GPU (none is visible)", file=sys.stderr)
        return 2
    import triton
    import triton.testing

    device = torch.device("cuda")
    bandwidth = copy_bandwidth(device)
    print(f"{torch.cuda.get_device_name()}, copy bandwidth {bandwidth / 1e12:.2f} TB/s, torch {torch.__version__}, "
          f"triton {triton.__version__}", flush=True)
    records = []
    for shape in args.models.split(","):
        torch.manual_seed(0)
        layers, lm_head, dims = make_layers(shape, device)
        weight_bytes = 2 * (lm_head.numel() + sum(w.numel() for layer in layers for w in layer.values() if w.dim() == 2))
        for t in [int(v) for v in args.tokens.split(",")]:
            x = torch.randn(t, dims["h"], device=device, dtype=torch.bfloat16)
            variants = {"cublas": step_fn(layers, lm_head, dims, x, "cublas"),
                        "triton": step_fn(layers, lm_head, dims, x, "triton"),
                        "triton-pdl": step_fn(layers, lm_head, dims, x, "triton", pdl=True)}
            variants["norms-chain"] = step_fn(layers, lm_head, dims, x, "norms-chain", pdl=True)
            variants["norms-fused"] = step_fn(layers, lm_head, dims, x, "norms-fused", pdl=True)
            if t == 1 and args.alt_tiles:
                for name in ALT_TILES:
                    variants[f"triton-pdl/{name}"] = step_fn(layers, lm_head, dims, x, "triton",
                                                             alt_tiles(name, dims), pdl=True)
            plain = variants["triton"]().clone()
            chain = variants["norms-chain"]().clone()
            base = None
            for name, fn in variants.items():
                try:
                    got = fn().clone()
                    torch.cuda.synchronize()
                    if name.startswith("triton-pdl") and "split" not in name and "/" not in name:
                        assert torch.equal(got, plain), f"{name} differs from the plain launch"
                    if name == "norms-fused":
                        assert torch.equal(got, chain), "norms-fused differs from norms-chain"
                    ref = chain if name.startswith("norms-") else plain
                    err = ((got - ref).norm() / ref.norm()).item()
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph):
                        fn()
                    ms = triton.testing.do_bench(graph.replay, warmup=20, rep=args.rep_ms, return_mode="median")
                    del graph
                except Exception as exc:  # noqa: BLE001 - a variant that fails is reported, not fatal
                    print(f"{shape:<11} T={t:<3} {name:<28} FAILED: {str(exc).splitlines()[0][:160]}", flush=True)
                    records.append(dict(shape=shape, T=t, variant=name, error=str(exc)[:500]))
                    continue
                base = base or ms
                frac = weight_bytes / (ms * 1e-3) / bandwidth
                print(f"{shape:<11} T={t:<3} {name:<28} {ms * 1e3:8.1f} us  {frac:6.1%} of copy BW  "
                      f"x{base / ms:5.2f} vs cublas  rel.err vs unfused {err:.1e}", flush=True)
                records.append(dict(shape=shape, T=t, variant=name, us=ms * 1e3, bandwidth_fraction=frac,
                                    speedup_vs_cublas=base / ms, rel_err_vs_unfused=err, weight_bytes=weight_bytes))
        del layers, lm_head
        torch.cuda.empty_cache()
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "bench_decode_linears.json").write_text(json.dumps(
            dict(records=records, copy_bandwidth=bandwidth, gpu=torch.cuda.get_device_name(), torch=torch.__version__,
                 triton=triton.__version__, date=time.strftime("%Y-%m-%d")), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
