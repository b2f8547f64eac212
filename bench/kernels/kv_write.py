"""The paged KV write (backends/triton/kv_write.py) against its reference twin at the Qwen3 shapes, on one GPU.

    python bench/kernels/kv_write.py [--models Qwen3-0.6B,Qwen3-4B] [--tokens 1,16,1024] [--repeats N] [--out DIR]

``write_kv`` of a step's k and v ``[T, 8, 128]`` (bfloat16) at consecutive positions after 1,000
cached ones, into pages of 64 through a permuted block table (the twin: ``write_pages`` for k, then
for v). Checked against the twin (max abs error over the pages), then both timed by
bench/timing.py from a CUDA graph over rotated input copies; a row gives the device time, GB/s (k
and v read and written) and that as a fraction of the copy bandwidth. With --out DIR the records
go to DIR/kv_write.json.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import op_benchmark  # noqa: E402

START, PAGE = 1000, 64


def cases(model: str, s: dict, t: int):
    from tileinfer.backends.reference.kv_write import write_pages as ref_write_pages
    from tileinfer.backends.triton.kv_write import write_kv

    hkv, d = s["num_key_value_heads"], s["head_dim"]
    num_pages = -(-(START + t) // PAGE)
    positions = torch.arange(START, START + t, device="cuda")

    def make_inputs(seed: int):
        g = torch.Generator(device="cuda").manual_seed(seed)
        k, v = (torch.randn(t, hkv, d, generator=g, device="cuda").to(torch.bfloat16) for _ in range(2))
        pages = [torch.zeros(num_pages, hkv, PAGE, d, dtype=torch.bfloat16, device="cuda") for _ in range(2)]
        block_table = torch.randperm(num_pages, generator=g, device="cuda").to(torch.int32)
        return k, v, pages[0], pages[1], block_table

    def kernel(c):
        write_kv(c[2], c[3], c[4], positions, c[0], c[1])
        return c[2], c[3]

    def twin(c):
        ref_write_pages(c[2], c[4], positions, c[0])
        ref_write_pages(c[3], c[4], positions, c[1])
        return c[2], c[3]

    yield dict(case="k and v", shape=[t, hkv, d]), make_inputs, kernel, twin, 2 * 2 * 2 * t * hkv * d


def main(argv: list[str] | None = None) -> int:
    return op_benchmark.main("kv_write", __doc__, cases, argv)


if __name__ == "__main__":
    sys.exit(main())
