"""RMSNorm (backends/triton/rms_norm.py) against its reference twin at the Qwen3 shapes, on one GPU.

    python bench/kernels/rms_norm.py [--models Qwen3-0.6B,Qwen3-4B] [--tokens 1,16,1024] [--repeats N] [--out DIR]

Two cases per model and step size T, bfloat16: the decoder's rows ``[T, hidden]`` and the q heads
``[T, heads, 128]`` of the attention inputs. Each is checked against the twin (max abs error), then
both are timed by bench/timing.py from a CUDA graph over rotated input copies; a row gives the
device time, GB/s (x read + out written + weight) and that as a fraction of the copy bandwidth.
With --out DIR the records go to DIR/rms_norm.json.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import op_benchmark  # noqa: E402

EPS = 1e-6


def cases(model: str, s: dict, t: int):
    from tileinfer.backends.reference import rms_norm as ref
    from tileinfer.backends.triton.rms_norm import rms_norm

    for name, shape in (("rows", (t, s["hidden_size"])), ("q heads", (t, s["num_attention_heads"], s["head_dim"]))):
        def make_inputs(seed: int, shape=shape):
            g = torch.Generator(device="cuda").manual_seed(seed)
            x = torch.randn(shape, generator=g, device="cuda").to(torch.bfloat16)
            w = (torch.rand(shape[-1], generator=g, device="cuda") + 0.5).to(torch.bfloat16)
            return x, w, torch.empty_like(x)

        moved = 2 * (2 * torch.Size(shape).numel() + shape[-1])
        yield (dict(case=name, shape=list(shape)), make_inputs, lambda c: rms_norm(c[0], c[1], EPS, out=c[2]),
               lambda c: ref.rms_norm(c[0], c[1], EPS), moved)


def main(argv: list[str] | None = None) -> int:
    return op_benchmark.main("rms_norm", __doc__, cases, argv)


if __name__ == "__main__":
    sys.exit(main())
