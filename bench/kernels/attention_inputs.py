"""The fused attention inputs (backends/triton/attention_inputs.py) against the reference twin at the Qwen3 shapes, on one GPU.

    python bench/kernels/attention_inputs.py [--models Qwen3-0.6B,Qwen3-4B] [--tokens 1,16,1024] [--repeats N] [--out DIR]

One step's fused qkv ``[T, (H + 2 Hkv) * 128]`` (bfloat16) -> q/k RMSNorm, RoPE, k and v written into
pages of 64 (permuted block table) at consecutive positions after 1,000 cached ones. Checked against
the twin (max abs error over q and the pages), then both timed by bench/timing.py from a CUDA graph
over rotated input copies; a row gives the device time, GB/s (qkv read; q, k, v written) and that as
a fraction of the copy bandwidth. Case ``qkv-int8``: the same into int8 pages with a float32 scale per
vector and smoothed keys (``kv_store=paged_int8``), against the twin's norm and RoPE followed by
``write_quantized`` (max abs error over q and the int8 values; bytes: k and v written as int8 plus
their scales). With --out DIR the records go to DIR/attention_inputs.json.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import op_benchmark  # noqa: E402

START, PAGE, EPS = 1000, 64, 1e-6


def cases(model: str, s: dict, t: int):
    from tileinfer.backends.reference import attention_inputs as ref
    from tileinfer.backends.triton.attention_inputs import attention_inputs
    from tileinfer.model import rope_table

    h, hkv, d = s["num_attention_heads"], s["num_key_value_heads"], s["head_dim"]
    num_pages = -(-(START + t) // PAGE)
    table = rope_table(d, s["rope_theta"], START + t, torch.device("cuda"))
    positions = torch.arange(START, START + t, device="cuda")

    def make_inputs(seed: int):
        g = torch.Generator(device="cuda").manual_seed(seed)
        qkv = (torch.randn(t, (h + 2 * hkv) * d, generator=g, device="cuda") * 2).to(torch.bfloat16)
        q_w, k_w = ((torch.rand(d, generator=g, device="cuda") + 0.5).to(torch.bfloat16) for _ in range(2))
        pages = [torch.zeros(num_pages, hkv, PAGE, d, dtype=torch.bfloat16, device="cuda") for _ in range(2)]
        block_table = torch.randperm(num_pages, generator=g, device="cuda").to(torch.int32)
        q = torch.empty(t, h, d, dtype=torch.bfloat16, device="cuda")
        return qkv, q_w, k_w, pages[0], pages[1], block_table, q

    def args(c):
        return (c[0], c[1], c[2], table.cos, table.sin, positions, c[3], c[4], c[5], h, hkv, d, EPS)

    def kernel(c):
        return attention_inputs(*args(c), out=c[6]), c[3], c[4]

    def twin(c):
        return ref.attention_inputs(*args(c)), c[3], c[4]

    moved = 2 * t * d * ((h + 2 * hkv) + h + 2 * hkv)
    yield dict(case="qkv", shape=[t, (h + 2 * hkv) * d]), make_inputs, kernel, twin, moved
    yield from int8_case(t, h, hkv, d, num_pages, table, positions, make_inputs, args)


def int8_case(t, h, hkv, d, num_pages, table, positions, make_inputs, args):
    """The fused inputs into int8 pages: ``(case, make_inputs, kernel, twin, moved)``."""
    from tileinfer.backends.reference.kv_quant import key_smoothing, write_quantized
    from tileinfer.backends.reference.rms_norm import rms_norm
    from tileinfer.backends.reference.rope import apply_rope
    from tileinfer.backends.triton.attention_inputs import attention_inputs

    def make_int8(seed: int):
        c = make_inputs(seed)
        pages = [torch.zeros(num_pages, hkv, PAGE, d, dtype=torch.int8, device="cuda") for _ in range(2)]
        scales = [torch.zeros(num_pages, hkv, PAGE, dtype=torch.float32, device="cuda") for _ in range(2)]
        return (*c[:3], *pages, c[5], c[6], *scales, key_smoothing(c[2]))

    def kernel(c):
        q = attention_inputs(*args(c), out=c[6], k_scale=c[7], v_scale=c[8], k_smooth=c[9])
        return q, c[3], c[4]

    def twin(c):
        qkv = c[0]
        q, k, v = qkv.split([h * d, hkv * d, hkv * d], dim=-1)
        cos, sin = table.cos[positions], table.sin[positions]
        q = apply_rope(rms_norm(q.reshape(t, h, d), c[1], EPS), cos, sin)
        k = apply_rope(rms_norm(k.reshape(t, hkv, d), c[2], EPS), cos, sin)
        write_quantized(c[3], c[4], c[7], c[8], c[5], positions, k, v.reshape(t, hkv, d), c[9])
        return q, c[3], c[4]

    moved = 2 * t * d * ((h + 2 * hkv) + h) + 2 * t * hkv * (d + 4)
    yield dict(case="qkv-int8", shape=[t, (h + 2 * hkv) * d]), make_int8, kernel, twin, moved


def main(argv: list[str] | None = None) -> int:
    return op_benchmark.main("attention_inputs", __doc__, cases, argv)


if __name__ == "__main__":
    sys.exit(main())
