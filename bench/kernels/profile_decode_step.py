"""Where a decode step's time goes: the engine's default config, its kernels as the CUDA profiler sees them.

    python bench/kernels/profile_decode_step.py [--shapes Qwen3-4B,Qwen3-0.6B] [--steps 32] [--out DIR]

Random weights of each shape (bench/shapes.py, a real checkpoint folder through the normal loader),
a 1,024-token prompt, a warm-up generation, then ``--steps`` decode steps under torch.profiler
(CUDA activity: kernels replayed from CUDA graphs are recorded one by one). Prints per shape the
wall time per step, the GPU time per step (sum of kernel durations), and the kernels grouped by
name (time per step, launches per step, mean duration), largest first; with --out writes a JSON of
the same and the gzip'ed Chrome trace.
"""

from __future__ import annotations

import gzip
import json
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from shapes import write_random_checkpoint  # noqa: E402

from script_args import engine_script_parser, gpu_visible  # noqa: E402

import tileinfer  # noqa: E402


def profile(shape: str, steps: int, checkpoints: Path, out: Path | None) -> dict:
    folder = write_random_checkpoint(shape, checkpoints / shape)
    engine = tileinfer.Engine.from_config(model=str(folder), device="cuda", progress=False)
    prompt = torch.randint(0, engine.model_config.vocab_size, (1024,), generator=torch.Generator().manual_seed(0)).tolist()
    engine.generate(prompt, max_new_tokens=steps, ignore_eos=True)  # warm-up
    torch.cuda.synchronize()
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as prof:
        began = time.perf_counter()
        result = engine.generate(prompt, max_new_tokens=steps + 1, ignore_eos=True)
        torch.cuda.synchronize()
        wall = time.perf_counter() - began
    kernels: dict[str, list[float]] = defaultdict(list)
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA and e.device_time_total > 0:
            kernels[e.name].append(e.device_time_total)  # us
    total_us = sum(sum(v) for v in kernels.values())
    decode_s = 1 / result.stats.decode_tok_s
    rows = sorted(((name, sum(v), len(v)) for name, v in kernels.items()), key=lambda r: -r[1])
    record = {"shape": shape, "steps": steps, "decode_tok_s": result.stats.decode_tok_s, "wall_s": wall,
              "prefill_ms": result.stats.prefill_ms, "kernel_us_total": total_us,
              "kernels": [{"name": n, "us": us, "launches": c} for n, us, c in rows]}
    print(f"\n{shape}: decode {result.stats.decode_tok_s:.0f} tok/s ({decode_s * 1e3:.3f} ms a step); kernels of the "
          f"whole profiled generation (prefill + {steps} steps) {total_us / 1e3:.2f} ms")
    print(f"{'us/step':>9} {'launches/step':>13} {'mean us':>8}  kernel")
    for name, us, count in rows[:28]:
        print(f"{us / steps:9.1f} {count / steps:13.2f} {us / count:8.2f}  {name[:110]}")
    if out:
        out.mkdir(parents=True, exist_ok=True)
        trace = out / f"trace_{shape}.json"
        prof.export_chrome_trace(str(trace))
        with open(trace, "rb") as f, gzip.open(str(trace) + ".gz", "wb") as g:
            g.write(f.read())
        trace.unlink()
    del engine
    torch.cuda.empty_cache()
    return record


def main(argv: list[str] | None = None) -> int:
    parser = engine_script_parser(__doc__)
    parser.add_argument("--steps", type=int, default=32)
    args = parser.parse_args(argv)
    if not gpu_visible("profile_decode_step.py"):
        return 2
    records = [profile(s, args.steps, args.checkpoints, args.out) for s in args.shapes.split(",")]
    if args.out:
        (args.out / "profile_decode_step.json").write_text(json.dumps(records, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
