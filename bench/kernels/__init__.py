"""Kernel micro-benchmarks on one GPU: each Triton op against its reference twin at the Qwen3 shapes.

    python -m bench kernels ops [--op add,rms_norm,...] [--models Qwen3-0.6B,Qwen3-4B] [--tokens 1,16,1024]
    python -m bench kernels paged_attention [...]     # the split-KV decode and prefill (paged_attention.py)
    python -m bench kernels linear [...]              # GEMV / GEMM per layer, tile sweeps, a decode step (linear.py)

``ops`` times the small ops of a decoder layer (``OPS``): the residual add, RMSNorm (rows and q
heads), RoPE (q heads after 1,000 positions), SwiGLU, the paged KV write, the fused attention
inputs (q/k norm, RoPE, KV write; also into int8 pages) and an int8 weight's values written into a
bf16 buffer (``int8_dequant``). Each case is checked against its twin (max abs error), then both
are timed by bench/timing.py from a CUDA graph of one call per input copy, rotating among enough
copies that the working set is not in the H200's 60 MB L2; a record (kind
``kernel``) gives the device times, GB/s (bytes read + written) and that as a fraction of the copy
bandwidth measured in the same run.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable

import torch

from .. import records
from ..shapes import SHAPES
from ..timing import copy_bandwidth, graph_seconds

MODELS = ("Qwen3-0.6B", "Qwen3-4B")
ROTATION_BYTES = 256 * 2**20  # > 4x the H200's 60 MB L2
MAX_COPIES = 64  # tiny steps stay in L2 anyway: their figure is the launch floor
START, PAGE, EPS = 1000, 64, 1e-6  # cached positions before the step, page size, norm epsilon
BENCHMARKS = ("ops", "paged_attention", "linear")


def names(text: str) -> list[str]:
    return [t for t in text.split(",") if t]


def integers(text: str) -> list[int]:
    return [int(t) for t in names(text)]


def name_list(valid: Iterable[str], what: str) -> Callable[[str], list[str]]:
    """An argparse type: comma-separated names out of ``valid`` (a ``what`` each); an unknown one is
    a usage error."""
    valid = list(valid)

    def parse(text: str) -> list[str]:
        import argparse

        unknown = [n for n in names(text) if n not in valid]
        if unknown:
            raise argparse.ArgumentTypeError(f"unknown {what} {unknown[0]!r}; valid: {', '.join(valid)}")
        return names(text)

    return parse


models = name_list(SHAPES, "model")


def common_arguments(p, tokens: list[int] | None, tokens_help: str) -> None:
    """--models, --tokens, --repeats, and the records' --commit and --records."""
    p.add_argument("--models", type=models, default=list(MODELS), help=f"comma-separated shapes of bench/shapes.py "
                   f"(default {','.join(MODELS)})")
    p.add_argument("--tokens", type=integers, default=tokens,
                   help=f"comma-separated step sizes T (default {tokens_help})")
    p.add_argument("--repeats", type=int, default=50, help="timed graph replays per case (median; default 50)")
    records.arguments(p)


def gpu_visible(name: str) -> bool:
    """True with a CUDA GPU; else one line on stderr saying that ``name`` needs one."""
    if torch.cuda.is_available():
        return True
    print(f"error: python -m bench kernels {name} needs a CUDA GPU (none is visible)", file=sys.stderr)
    return False


def copies_for(make_inputs: Callable[[int], object], bytes_per_copy: int) -> list:
    """Enough input sets (seeds 0, 1, ...) that their bytes exceed the L2 several times (at most ``MAX_COPIES``)."""
    n = max(2, min(MAX_COPIES, -(-ROTATION_BYTES // max(1, bytes_per_copy))))
    return [make_inputs(seed) for seed in range(n)]


def _flat(result) -> list[torch.Tensor]:
    return list(result) if isinstance(result, (tuple, list)) else [result]


def max_error(kernel: Callable, twin: Callable, make_inputs: Callable[[int], object]) -> float:
    """Largest absolute difference between the kernel's outputs and the twin's on the same inputs
    (each on its own copy: kernels may write into their inputs)."""
    got, expected = _flat(kernel(make_inputs(0))), _flat(twin(make_inputs(0)))
    return max((a.float() - b.float()).abs().max().item() for a, b in zip(got, expected))


def measure(make_inputs: Callable[[int], object], kernel: Callable, twin: Callable, moved: int, bandwidth: float,
            repeats: int) -> dict:
    """The error against the twin, then the device time of the kernel and of the twin (graph replays
    over rotated input copies) in us, GB/s and fractions of the copy bandwidth (``moved`` bytes)."""
    err = max_error(kernel, twin, make_inputs)
    copies = copies_for(make_inputs, moved)
    seconds = {name: graph_seconds(lambda fn=fn: [fn(c) for c in copies], repeats=repeats, calls=len(copies))
               for name, fn in (("kernel", kernel), ("twin", twin))}
    return dict(kernel_us=seconds["kernel"] * 1e6, twin_us=seconds["twin"] * 1e6, bytes=moved,
                kernel_gb_s=moved / seconds["kernel"] / 1e9, copy_fraction=moved / seconds["kernel"] / bandwidth,
                twin_copy_fraction=moved / seconds["twin"] / bandwidth, max_abs_err=err)


# -- the ops: for a model's shape ``s`` and T tokens, yield (case, shape, make_inputs, kernel, twin, bytes) ----

def _randn(g, *shape, scale: float = 1.0) -> torch.Tensor:
    return (torch.randn(*shape, generator=g, device="cuda") * scale).to(torch.bfloat16)


def add_cases(s: dict, t: int) -> Iterable[tuple]:
    """``round(x + residual)`` on the decoder's ``[T, hidden]`` residual stream."""
    from tileinfer.backends.reference import add as ref
    from tileinfer.backends.triton.add import add

    shape = (t, s["hidden_size"])

    def make(seed: int):
        g = torch.Generator(device="cuda").manual_seed(seed)
        x, r = _randn(g, *shape), _randn(g, *shape)
        return x, r, torch.empty_like(x)

    yield "residual", shape, make, lambda c: add(c[0], c[1], out=c[2]), lambda c: ref.add(c[0], c[1]), 6 * t * shape[1]


def rms_norm_cases(s: dict, t: int) -> Iterable[tuple]:
    """The decoder's rows ``[T, hidden]`` and the q heads ``[T, heads, 128]``."""
    from tileinfer.backends.reference import rms_norm as ref
    from tileinfer.backends.triton.rms_norm import rms_norm

    for name, shape in (("rows", (t, s["hidden_size"])), ("q heads", (t, s["num_attention_heads"], s["head_dim"]))):
        def make(seed: int, shape=shape):
            g = torch.Generator(device="cuda").manual_seed(seed)
            x = _randn(g, *shape)
            return x, (torch.rand(shape[-1], generator=g, device="cuda") + 0.5).to(torch.bfloat16), torch.empty_like(x)

        yield (name, shape, make, lambda c: rms_norm(c[0], c[1], EPS, out=c[2]),
               lambda c: ref.rms_norm(c[0], c[1], EPS), 2 * (2 * torch.Size(shape).numel() + shape[-1]))


def rope_cases(s: dict, t: int) -> Iterable[tuple]:
    """The q heads ``[T, heads, 128]`` at the positions after START, cos/sin gathered from float32 tables."""
    from tileinfer.backends.reference.rope import apply_rope as ref_apply_rope
    from tileinfer.backends.triton.rope import apply_rope
    from tileinfer.model import rope_table

    heads, d = s["num_attention_heads"], s["head_dim"]
    table = rope_table(d, s["rope_theta"], START + t, torch.device("cuda"))
    pos = torch.arange(START, START + t, device="cuda")

    def make(seed: int):
        x = _randn(torch.Generator(device="cuda").manual_seed(seed), t, heads, d)
        return x, torch.empty_like(x)

    yield ("q heads", (t, heads, d), make, lambda c: apply_rope(c[0], table.cos, table.sin, pos, out=c[1]),
           lambda c: ref_apply_rope(c[0], table.cos[pos], table.sin[pos]), 4 * t * heads * d + 4 * t * d)


def silu_mul_cases(s: dict, t: int) -> Iterable[tuple]:
    """``silu(gate) * up`` of the fused ``[T, 2I]`` gate/up projection."""
    from tileinfer.backends.reference import silu_mul as ref
    from tileinfer.backends.triton.silu_mul import silu_mul

    inter = s["intermediate_size"]

    def make(seed: int):
        g = torch.Generator(device="cuda").manual_seed(seed)
        return _randn(g, t, 2 * inter, scale=3.0), torch.empty(t, inter, dtype=torch.bfloat16, device="cuda")

    yield ("gate_up", (t, 2 * inter), make, lambda c: silu_mul(c[0], out=c[1]), lambda c: ref.silu_mul(c[0]),
           6 * t * inter)


def _pages(g, t: int, hkv: int, d: int, dtype=torch.bfloat16):
    num_pages = -(-(START + t) // PAGE)
    pages = [torch.zeros(num_pages, hkv, PAGE, d, dtype=dtype, device="cuda") for _ in range(2)]
    return pages, torch.randperm(num_pages, generator=g, device="cuda").to(torch.int32)


def kv_write_cases(s: dict, t: int) -> Iterable[tuple]:
    """A step's k and v ``[T, 8, 128]`` written after START positions into pages of 64 through a
    permuted block table (the twin: ``write_pages`` for k, then for v)."""
    from tileinfer.backends.reference.kv_write import write_pages
    from tileinfer.backends.triton.kv_write import write_kv

    hkv, d = s["num_key_value_heads"], s["head_dim"]
    pos = torch.arange(START, START + t, device="cuda")

    def make(seed: int):
        g = torch.Generator(device="cuda").manual_seed(seed)
        k, v = _randn(g, t, hkv, d), _randn(g, t, hkv, d)
        (k_pages, v_pages), table = _pages(g, t, hkv, d)
        return k, v, k_pages, v_pages, table

    def kernel(c):
        write_kv(c[2], c[3], c[4], pos, c[0], c[1])
        return c[2], c[3]

    def twin(c):
        write_pages(c[2], c[4], pos, c[0])
        write_pages(c[3], c[4], pos, c[1])
        return c[2], c[3]

    yield "k and v", (t, hkv, d), make, kernel, twin, 8 * t * hkv * d


def attention_inputs_cases(s: dict, t: int) -> Iterable[tuple]:
    """One step's fused qkv ``[T, (H + 2 Hkv) * 128]`` -> q/k RMSNorm, RoPE, k and v written into pages
    after START positions; ``qkv-int8``: into int8 pages with a float32 scale per vector and smoothed
    keys, against the twin's norm and RoPE followed by ``write_quantized``."""
    from tileinfer.backends.reference import attention_inputs as ref
    from tileinfer.backends.reference.kv_quant import key_smoothing, write_quantized
    from tileinfer.backends.reference.rms_norm import rms_norm
    from tileinfer.backends.reference.rope import apply_rope
    from tileinfer.backends.triton.attention_inputs import attention_inputs
    from tileinfer.model import rope_table

    h, hkv, d = s["num_attention_heads"], s["num_key_value_heads"], s["head_dim"]
    table = rope_table(d, s["rope_theta"], START + t, torch.device("cuda"))
    pos = torch.arange(START, START + t, device="cuda")

    def make(seed: int, dtype=torch.bfloat16):
        g = torch.Generator(device="cuda").manual_seed(seed)
        qkv = _randn(g, t, (h + 2 * hkv) * d, scale=2.0)
        q_w, k_w = ((torch.rand(d, generator=g, device="cuda") + 0.5).to(torch.bfloat16) for _ in range(2))
        (k_pages, v_pages), block_table = _pages(g, t, hkv, d, dtype)
        q = torch.empty(t, h, d, dtype=torch.bfloat16, device="cuda")
        if dtype == torch.bfloat16:
            return qkv, q_w, k_w, k_pages, v_pages, block_table, q
        scales = [torch.zeros(k_pages.shape[:3], dtype=torch.float32, device="cuda") for _ in range(2)]
        return qkv, q_w, k_w, k_pages, v_pages, block_table, q, *scales, key_smoothing(k_w)

    def args(c):
        return (c[0], c[1], c[2], table.cos, table.sin, pos, c[3], c[4], c[5], h, hkv, d, EPS)

    yield ("qkv", (t, (h + 2 * hkv) * d), make, lambda c: (attention_inputs(*args(c), out=c[6]), c[3], c[4]),
           lambda c: (ref.attention_inputs(*args(c)), c[3], c[4]), 2 * t * d * ((h + 2 * hkv) + h + 2 * hkv))

    def int8_twin(c):
        q, k, v = c[0].split([h * d, hkv * d, hkv * d], dim=-1)
        cos, sin = table.cos[pos], table.sin[pos]
        q = apply_rope(rms_norm(q.reshape(t, h, d), c[1], EPS), cos, sin)
        k = apply_rope(rms_norm(k.reshape(t, hkv, d), c[2], EPS), cos, sin)
        write_quantized(c[3], c[4], c[7], c[8], c[5], pos, k, v.reshape(t, hkv, d), c[9])
        return q, c[3], c[4]

    yield ("qkv-int8", (t, (h + 2 * hkv) * d), lambda seed: make(seed, torch.int8),
           lambda c: (attention_inputs(*args(c), out=c[6], k_scale=c[7], v_scale=c[8], k_smooth=c[9]), c[3], c[4]),
           int8_twin, 2 * t * d * ((h + 2 * hkv) + h) + 2 * t * hkv * (d + 4))


def int8_dequant_cases(s: dict, t: int) -> Iterable[tuple]:
    """An int8 weight's values into a bf16 buffer (the first half of ``options.triton.int8_prefill_dequant``),
    per layer weight of the decoder (q/k/v and gate/up fused); T does not enter (one case per T all the same)."""
    from tileinfer.backends.reference.int8_dequant import dequantize_int8 as ref
    from tileinfer.backends.triton.int8_dequant import dequantize_int8

    h, d, inter = s["hidden_size"], s["head_dim"], s["intermediate_size"]
    q, kv = s["num_attention_heads"] * d, s["num_key_value_heads"] * d
    for case, (n, k) in dict(qkv=(q + 2 * kv, h), o_proj=(h, q), gate_up=(2 * inter, h), down=(h, inter)).items():

        def make(seed: int, n=n, k=k):
            g = torch.Generator(device="cuda").manual_seed(seed)
            w = torch.randint(-128, 128, (n, k), generator=g, device="cuda", dtype=torch.int8)
            return w, torch.empty(n, k, dtype=torch.bfloat16, device="cuda")

        yield (case, (n, k), make, lambda c: dequantize_int8(c[0], torch.bfloat16, out=c[1]),
               lambda c: ref(c[0], torch.bfloat16), 3 * n * k)


OPS = {"add": add_cases, "rms_norm": rms_norm_cases, "rope": rope_cases, "silu_mul": silu_mul_cases,
       "kv_write": kv_write_cases, "attention_inputs": attention_inputs_cases,
       "int8_dequant": int8_dequant_cases}


def ops_main(args) -> int:
    if not gpu_visible("ops"):
        return 2
    bandwidth = copy_bandwidth(torch.device("cuda"))
    run = records.Run("cuda", commit=args.commit, path=args.records)
    print(f"copy bandwidth {bandwidth / 1e12:.2f} TB/s (read + write)\n{'op':<17} {'model':<11} {'case':<10} "
          f"{'T':>5} {'triton us':>10} {'twin us':>9} {'GB/s':>7} {'of copy':>8} {'max err':>9}")
    for op in args.op:
        for model in args.models:
            for t in args.tokens:
                for case, shape, make, kernel, twin, moved in OPS[op](SHAPES[model], t):
                    m = measure(make, kernel, twin, moved, bandwidth, args.repeats)
                    run.add("kernel", op=op, model=model, case=case, T=t, shape=list(shape),
                            copy_bandwidth_tb_s=bandwidth / 1e12, **m)
                    print(f"{op:<17} {model:<11} {case:<10} {t:>5} {m['kernel_us']:10.1f} {m['twin_us']:9.1f} "
                          f"{m['kernel_gb_s']:7.0f} {m['copy_fraction']:8.1%} {m['max_abs_err']:9.2e}", flush=True)
                    torch.cuda.empty_cache()
    print(f"appended {len(run.records)} records to {run.path}")
    return 0


def arguments(p) -> None:
    from . import linear, paged_attention

    p.description, p.epilog = __doc__.split("\n\n")[0], __doc__.split("\n\n", 1)[1]
    sub = p.add_subparsers(dest="benchmark", required=True, metavar="{" + ",".join(BENCHMARKS) + "}")
    ops = sub.add_parser("ops", help="the small ops against their twins", description=__doc__.split("\n\n")[2])
    ops.add_argument("--op", type=name_list(OPS, "op"), default=list(OPS),
                     help=f"comma-separated (default {','.join(OPS)})")
    common_arguments(ops, [1, 16, 1024], "1,16,1024")
    paged_attention.arguments(sub.add_parser("paged_attention", help=paged_attention.__doc__.split("\n")[0]))
    linear.arguments(sub.add_parser("linear", help=linear.__doc__.split("\n")[0]))


def main(args) -> int:
    from . import linear, paged_attention

    return {"ops": ops_main, "paged_attention": paged_attention.main, "linear": linear.main}[args.benchmark](args)


def ops_table(rows: list[dict]) -> str:
    from ..report import markdown

    order = sorted(rows, key=lambda r: (list(OPS).index(r["op"]) if r["op"] in OPS else len(OPS), r["case"], r["T"]))
    body = [[r["op"], r["case"], str(r["T"]), f"{r['kernel_us']:.1f}", f"{r['twin_us']:.1f}", f"{r['kernel_gb_s']:.0f}",
             f"{r['copy_fraction']:.1%}", f"{r['max_abs_err']:.2e}"] for r in order]
    return markdown(["op", "case", "T", "Triton us", "twin us", "GB/s", "of copy bandwidth", "max error"], body)


def tables() -> list:
    from ..report import Table
    from . import linear, paged_attention

    return [Table("kernel", "{group}: the small ops against their twins", ops_table, group=lambda r: r["model"]),
            *paged_attention.tables(), *linear.tables()]
