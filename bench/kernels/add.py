"""The residual add (backends/triton/add.py) against its reference twin at the Qwen3 shapes, on one GPU.

    python bench/kernels/add.py [--models Qwen3-0.6B,Qwen3-4B] [--tokens 1,16,1024] [--repeats N] [--out DIR]

``round(x + residual)`` on the decoder's ``[T, hidden]`` residual stream, bfloat16. Checked against
the twin (max abs error), then both timed by bench/timing.py from a CUDA graph over rotated input
copies; a row gives the device time, GB/s (two reads and a write) and that as a fraction of the
copy bandwidth. With --out DIR the records go to DIR/add.json.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import op_benchmark  # noqa: E402


def cases(model: str, s: dict, t: int):
    from tileinfer.backends.reference import add as ref
    from tileinfer.backends.triton.add import add

    shape = (t, s["hidden_size"])

    def make_inputs(seed: int):
        g = torch.Generator(device="cuda").manual_seed(seed)
        x, r = (torch.randn(shape, generator=g, device="cuda").to(torch.bfloat16) for _ in range(2))
        return x, r, torch.empty_like(x)

    yield (dict(case="residual", shape=list(shape)), make_inputs, lambda c: add(c[0], c[1], out=c[2]),
           lambda c: ref.add(c[0], c[1]), 3 * 2 * t * s["hidden_size"])


def main(argv: list[str] | None = None) -> int:
    return op_benchmark.main("add", __doc__, cases, argv)


if __name__ == "__main__":
    sys.exit(main())
