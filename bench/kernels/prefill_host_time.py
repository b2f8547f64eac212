"""Is the eager prefill bound by the host? Host enqueue time, wall time and kernel time of one prefill.

    python bench/kernels/prefill_host_time.py [--shapes Qwen3-4B,Qwen3-0.6B] [--tokens 1024] [--rounds 20] [--out DIR]

The default config on random weights of each shape (bench/shapes.py, a real checkpoint folder
through the normal loader). One prefill is ``tileinfer.decoding.prefill`` from an empty KV store:
``host`` is the time until it returns (every kernel enqueued, nothing synchronized), ``wall`` the
time until the device is done; medians of ``--rounds`` after a warm-up. Then one prefill under
torch.profiler: the sum of its kernel durations (``kernels``) and their number (``launches``).
If ``host`` is close to ``wall`` and ``kernels`` well below it, the device waits for the host.
Last, the host's cost of one launch: an empty Triton kernel and a one-element torch add, 2,000
launches each. Prints a table; with --out writes prefill_host_time.json.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from shapes import write_random_checkpoint  # noqa: E402

from script_args import engine_script_parser, gpu_visible  # noqa: E402

import tileinfer  # noqa: E402
from tileinfer.decoding import prefill  # noqa: E402


@triton.jit
def _empty_kernel(x_ptr):
    tl.store(x_ptr, tl.load(x_ptr))


def one_prefill(engine: tileinfer.Engine, ids: list[int]) -> tuple[float, float]:
    """(host ms, wall ms) of one prefill from an empty KV store."""
    with torch.inference_mode():
        engine.kv.reset()
        torch.cuda.synchronize()
        began = time.perf_counter()
        prefill(engine.model, engine.kv, engine.sampler, ids)
        enqueued = time.perf_counter()
        torch.cuda.synchronize()
        done = time.perf_counter()
    return (enqueued - began) * 1e3, (done - began) * 1e3


def kernel_time(engine: tileinfer.Engine, ids: list[int]) -> tuple[float, int]:
    """(sum of kernel durations in ms, number of kernels) of one prefill under the profiler."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        one_prefill(engine, ids)
    kernels = [e for e in prof.events()
               if e.device_type == torch.autograd.DeviceType.CUDA and e.device_time_total > 0]
    return sum(e.device_time_total for e in kernels) / 1e3, len(kernels)


def launch_cost(launches: int = 2000) -> dict[str, float]:
    """Host microseconds per launch of an empty Triton kernel and of a one-element torch add."""
    x = torch.zeros(1, device="cuda")
    costs = {}
    for name, launch in (("triton_empty_us", lambda: _empty_kernel[(1,)](x)), ("torch_add_us", lambda: x.add_(1))):
        for _ in range(50):
            launch()
        torch.cuda.synchronize()
        began = time.perf_counter()
        for _ in range(launches):
            launch()
        costs[name] = (time.perf_counter() - began) / launches * 1e6
        torch.cuda.synchronize()
    return costs


def measure(shape: str, tokens: int, rounds: int, checkpoints: Path) -> dict:
    folder = write_random_checkpoint(shape, checkpoints / shape)
    engine = tileinfer.Engine.from_config(model=str(folder), device="cuda", progress=False,
                                          overrides=[f"kv_capacity={tokens + 64}"])
    ids = torch.randint(0, engine.model_config.vocab_size, (tokens,),
                        generator=torch.Generator().manual_seed(0)).tolist()
    for _ in range(3):
        one_prefill(engine, ids)
    host, wall = zip(*(one_prefill(engine, ids) for _ in range(rounds)))
    kernels_ms, launches = kernel_time(engine, ids)
    record = {"shape": shape, "tokens": tokens, "rounds": rounds, "host_ms": statistics.median(host),
              "wall_ms": statistics.median(wall), "kernels_ms": kernels_ms, "launches": launches}
    del engine
    torch.cuda.empty_cache()
    return record


def main(argv: list[str] | None = None) -> int:
    parser = engine_script_parser(__doc__)
    parser.add_argument("--tokens", type=int, default=1024, help="prompt length of the prefill")
    parser.add_argument("--rounds", type=int, default=20, help="timed prefills per shape (median)")
    args = parser.parse_args(argv)
    if not gpu_visible("prefill_host_time.py"):
        return 2
    records = [measure(s, args.tokens, args.rounds, args.checkpoints) for s in args.shapes.split(",")]
    costs = launch_cost()
    print(f"{'shape':<12} {'host ms':>8} {'wall ms':>8} {'kernels ms':>10} {'launches':>8}  host/wall  kernels/wall")
    for r in records:
        print(f"{r['shape']:<12} {r['host_ms']:8.2f} {r['wall_ms']:8.2f} {r['kernels_ms']:10.2f} {r['launches']:8d}"
              f"  {r['host_ms'] / r['wall_ms']:9.2f}  {r['kernels_ms'] / r['wall_ms']:12.2f}")
    print(f"host cost of one launch: empty Triton kernel {costs['triton_empty_us']:.1f} us, "
          f"one-element torch add {costs['torch_add_us']:.1f} us")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "prefill_host_time.json").write_text(json.dumps({"prefills": records, "launch": costs}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
