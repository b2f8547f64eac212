"""SwiGLU (backends/triton/silu_mul.py) against its reference twin at the Qwen3 shapes, on one GPU.

    python bench/kernels/silu_mul.py [--models Qwen3-0.6B,Qwen3-4B] [--tokens 1,16,1024] [--repeats N] [--out DIR]

``silu(gate) * up`` of the fused ``[T, 2I]`` gate/up projection, bfloat16. Checked against the twin
(max abs error), then both timed by bench/timing.py from a CUDA graph over rotated input copies; a
row gives the device time, GB/s (2I read, I written per token) and that as a fraction of the copy
bandwidth. With --out DIR the records go to DIR/silu_mul.json.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import op_benchmark  # noqa: E402


def cases(model: str, s: dict, t: int):
    from tileinfer.backends.reference import silu_mul as ref
    from tileinfer.backends.triton.silu_mul import silu_mul

    inter = s["intermediate_size"]

    def make_inputs(seed: int):
        g = torch.Generator(device="cuda").manual_seed(seed)
        gate_up = (torch.randn(t, 2 * inter, generator=g, device="cuda") * 3).to(torch.bfloat16)
        return gate_up, torch.empty(t, inter, dtype=torch.bfloat16, device="cuda")

    yield (dict(case="gate_up", shape=[t, 2 * inter]), make_inputs, lambda c: silu_mul(c[0], out=c[1]),
           lambda c: ref.silu_mul(c[0]), 3 * 2 * t * inter)


def main(argv: list[str] | None = None) -> int:
    return op_benchmark.main("silu_mul", __doc__, cases, argv)


if __name__ == "__main__":
    sys.exit(main())
