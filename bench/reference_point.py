"""The reference point on a GPU: a 1,024-token prompt prefilled in one step, then 128 tokens.

    python bench/reference_point.py --shape Qwen3-4B --out DIR [--variant NAME]... [KEY=VALUE ...]

Random weights of the named shape (bench/shapes.py), random prompt tokens. Prefill is the median
of several synchronized prefills (prompt in, first token out); decode is generate's tok/s from
the first new token to the last (median of several runs). Each decode figure is also given as a
fraction of the memory roofline: bytes of weights + KV cache read per step over the device copy
bandwidth measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from shapes import kv_bytes_per_position, weight_bytes, write_random_checkpoint  # noqa: E402
from limits import copy_bandwidth  # noqa: E402

import tileinfer  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="Qwen3-4B")
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    parser.add_argument("--checkpoints", type=Path, default=Path("/tmp/tileinfer-checkpoints"))
    parser.add_argument("--prompt", type=int, default=1024)
    parser.add_argument("--new", type=int, default=128)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--variant", action="append", default=[],
                        help="shipped config name or YAML file (repeatable; default: the default config)")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()

    folder = write_random_checkpoint(args.shape, args.checkpoints / args.shape)
    bandwidth = copy_bandwidth(torch.device("cuda"))
    context = args.prompt + args.new / 2
    step_bytes = weight_bytes(args.shape) + kv_bytes_per_position(args.shape) * context
    roofline_tok_s = bandwidth / step_bytes
    lines = []
    for variant in args.variant or ["default"]:
        sources = [] if variant == "default" else [variant]
        record = measure(folder, sources, args)
        record.update(shape=args.shape, variant=variant, overrides=args.overrides, roofline_tok_s=roofline_tok_s,
                      roofline_fraction=record["decode_tok_s"] / roofline_tok_s,
                      copy_bandwidth_tb_s=bandwidth / 1e12, gpu=torch.cuda.get_device_name(), torch=torch.__version__)
        args.out.mkdir(parents=True, exist_ok=True)
        name = f"reference_point_{args.shape}_{variant}{'_' if args.overrides else ''}{'_'.join(args.overrides)}.json"
        (args.out / name.replace("/", "-").replace("=", "-")).write_text(json.dumps(record, indent=2))
        lines.append(f"{args.shape:<11} {variant:<22} prefill {record['prefill_ms']:7.1f} ms   decode "
                     f"{record['decode_tok_s']:6.1f} tok/s ({record['roofline_fraction']:6.1%} of {roofline_tok_s:.0f})")
        print(lines[-1], flush=True)
    print(f"copy bandwidth {bandwidth / 1e12:.2f} TB/s; {args.prompt}-token prompt, {args.new} new tokens")
    print("\n".join(lines))


def measure(folder: Path, sources: list[str], args) -> dict:
    t0 = time.perf_counter()
    engine = tileinfer.Engine.from_config(*sources, model=str(folder),
                                          overrides=["device=cuda", "dtype=bfloat16", *args.overrides])
    load_s = time.perf_counter() - t0
    vocab = engine.model_config.vocab_size
    prompt = torch.randint(0, vocab, (args.prompt,), generator=torch.Generator().manual_seed(0)).tolist()
    engine.generate(prompt, max_new_tokens=8, ignore_eos=True)  # warm-up: compiles the kernels
    prefill = statistics.median(engine.generate(prompt, max_new_tokens=1).stats.prefill_ms for _ in range(args.runs))
    runs = [engine.generate(prompt, max_new_tokens=args.new, ignore_eos=True).stats for _ in range(args.runs)]
    decode = statistics.median(s.decode_tok_s for s in runs)
    del engine
    torch.cuda.empty_cache()
    return {"prompt_tokens": args.prompt, "new_tokens": args.new, "prefill_ms": prefill,
            "prefill_tok_s": args.prompt / prefill * 1e3, "decode_tok_s": decode, "load_s": load_s,
            "decode_runs": [s.decode_tok_s for s in runs]}


if __name__ == "__main__":
    main()
