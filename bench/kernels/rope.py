"""RoPE (backends/triton/rope.py) against its reference twin at the Qwen3 shapes, on one GPU.

    python bench/kernels/rope.py [--models Qwen3-0.6B,Qwen3-4B] [--tokens 1,16,1024] [--repeats N] [--out DIR]

The rotation of the q heads ``[T, heads, 128]`` at consecutive positions after 1,000 cached ones,
bfloat16, the cos/sin rows gathered from float32 tables (the twin is given them gathered, as the
reference attention does). Checked against the twin (max abs error), then both timed by
bench/timing.py from a CUDA graph over rotated input copies; a row gives the device time, GB/s (q
read and written, the cos/sin rows read) and that as a fraction of the copy bandwidth. With --out
DIR the records go to DIR/rope.json.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import op_benchmark  # noqa: E402

START = 1000


def cases(model: str, s: dict, t: int):
    from tileinfer.backends.reference.rope import apply_rope as ref_apply_rope
    from tileinfer.backends.triton.rope import apply_rope
    from tileinfer.model import rope_table

    heads, d = s["num_attention_heads"], s["head_dim"]
    table = rope_table(d, s["rope_theta"], START + t, torch.device("cuda"))
    positions = torch.arange(START, START + t, device="cuda")

    def make_inputs(seed: int):
        g = torch.Generator(device="cuda").manual_seed(seed)
        x = torch.randn(t, heads, d, generator=g, device="cuda").to(torch.bfloat16)
        return x, torch.empty_like(x)

    moved = 2 * 2 * t * heads * d + 2 * 4 * t * d // 2
    yield (dict(case="q heads", shape=[t, heads, d]), make_inputs,
           lambda c: apply_rope(c[0], table.cos, table.sin, positions, out=c[1]),
           lambda c: ref_apply_rope(c[0], table.cos[positions], table.sin[positions]), moved)


def main(argv: list[str] | None = None) -> int:
    return op_benchmark.main("rope", __doc__, cases, argv)


if __name__ == "__main__":
    sys.exit(main())
