"""What one decode or verify step costs: ms per step of T tokens after N cached positions.

    python bench/step_costs.py [--shape NAME... | --model DIR] [--variant NAME]... [--tokens 1,2,4,8,16]
                               [--contexts 1024,8192] [--loop PROPOSER@K]... [--profile] [--out DIR]

For each shape and variant the engine is built once (its KV pool sized for the longest context),
a random prompt of N tokens is prefilled, and then the step runner the engine decodes with (CUDA
graphs in the default config) is called with T tokens at position N, over and over, each call
timed with CUDA events after a warm-up (``timing.median_seconds``, median of 50). Every call writes
the same positions N .. N+T-1, so every call is the same step. Records are the matrix's
rows with workload ``step{T}_ctx{N}`` and unit ``ms``, plus ``ratio_to_step1`` (the step's cost over
the 1-token step's at the same context, what divides every proposer's speedup) and
``roofline_ms`` (the bytes a step reads, weights once plus the cached K and V, at the copy
bandwidth measured in the same run). ``--profile`` also records, per step, the device time of each
kernel (torch.profiler over 10 calls, summed by kernel name, per call) as the row's ``kernels_us``
and prints the kernels that make up the step's cost. ``--loop ngram@15`` also times the
device-resident speculative loop's whole step with that proposer drafting K tokens (the proposer's
draft, the verify of K + 1 tokens, the acceptance: one graph replay; a step of the default
variant, the proposer's defaults otherwise, e.g. the shipped drafters with the shipped model),
after the same N positions: workload ``loop_{proposer}{K}_ctx{N}``, ``ratio_to_step1`` over the
first variant's 1-token step, the measured step-cost ratio a proposer's speedup divides by.
Without a GPU the shape is tiny and the contexts 32x shorter, which checks the script, not the
figures. Writes ``step_costs.json`` under --out and prints a table.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import torch  # noqa: E402

import limits as limits_mod  # noqa: E402
import records  # noqa: E402
from roofline import decode_step_bytes  # noqa: E402
from shapes import cpu_refusal, write_random_checkpoint  # noqa: E402
from timing import median_seconds  # noqa: E402
from variants import engine_args  # noqa: E402
from workloads import EngineRunner, free_memory, random_prompt  # noqa: E402

import tileinfer  # noqa: E402

SCRATCH = Path("/tmp/tileinfer-checkpoints")
MAX_LOOP_K = 15  # the device loop drafts at most 15 tokens a step


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 2)[2],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    gpu = torch.cuda.is_available()
    p.add_argument("--shape", action="append", help="model shape (bench/shapes.py); default Qwen3-0.6B and "
                   "Qwen3-4B on a GPU, tiny on a CPU")
    p.add_argument("--model", type=Path, metavar="DIR", help="a real checkpoint folder instead of the random shapes "
                   "(e.g. models/target, the shipped model: its speculative table divides by these ratios); "
                   "named after the folder")
    p.add_argument("--variant", action="append", help="variant of bench/variants.py (default: default)")
    p.add_argument("--tokens", default="1,2,4,8,16", help="tokens per step, comma-separated (default 1,2,4,8,16)")
    p.add_argument("--contexts", default="1024,8192" if gpu else "32,256",
                   help="cached positions before the step, comma-separated (default 1024,8192; 32,256 on a CPU)")
    p.add_argument("--repeats", type=int, default=50 if gpu else 3, help="timed calls per step (median)")
    p.add_argument("--checkpoints", type=Path, default=SCRATCH, help="where random checkpoints are written once")
    p.add_argument("--loop", action="append", default=[], metavar="PROPOSER@K",
                   help="also time the device loop's whole step with this proposer drafting K tokens (repeatable)")
    p.add_argument("--profile", action="store_true", help="also record each step's per-kernel device times")
    p.add_argument("--commit", help="commit hash to record (default: git rev-parse of this checkout)")
    p.add_argument("--out", type=Path, default=Path("bench/results/steps"), help="folder for step_costs.json")
    args = p.parse_args(argv)
    if args.model and args.shape:
        p.error("--model and --shape exclude each other")
    if args.model and not (args.model / "config.json").is_file():
        p.error(f"--model {args.model}: no config.json there")
    args.shape = [] if args.model else args.shape or (["Qwen3-0.6B", "Qwen3-4B"] if gpu else ["tiny"])
    args.variant = args.variant or ["default"]
    args.tokens = [int(t) for t in args.tokens.split(",")]
    args.contexts = [int(n) for n in args.contexts.split(",")]
    args.loop = [loop_spec(p, spec) for spec in args.loop]
    if args.loop and 1 not in args.tokens:
        p.error("--loop: its ratio is over the 1-token step; keep 1 in --tokens")
    if not gpu:
        for shape in args.shape:
            if reason := cpu_refusal(shape):
                p.error(reason)
    return args


def step_ms(engine: tileinfer.Engine, tokens: int, context: int, repeats: int) -> float:
    """Median ms of one step of ``tokens`` tokens after ``context`` cached positions."""
    steps, kv = engine.decoder.steps, engine.kv
    ids = torch.tensor(random_prompt(tokens, engine.model_config.vocab_size, seed=1), device=engine.device)

    kv.reserve(context + tokens)
    try:
        with torch.inference_mode():
            return median_seconds(lambda: steps.forward(ids, context), engine.device, repeats=repeats, warmup=3) * 1e3
    finally:
        kv.truncate(context)


def kernel_profile(engine: tileinfer.Engine, tokens: int, context: int, calls: int = 10) -> dict[str, float]:
    """Device microseconds per step of each kernel (by name) of a step of ``tokens`` after ``context``."""
    from torch.profiler import ProfilerActivity, profile

    steps, kv = engine.decoder.steps, engine.kv
    ids = torch.tensor(random_prompt(tokens, engine.model_config.vocab_size, seed=1), device=engine.device)
    kv.reserve(context + tokens)
    try:
        with torch.inference_mode():
            for _ in range(3):
                steps.forward(ids, context)
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(calls):
                    steps.forward(ids, context)
                torch.cuda.synchronize()
    finally:
        kv.truncate(context)
    times: dict[str, float] = {}
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            times[event.name] = times.get(event.name, 0.0) + event.device_time / calls
    return dict(sorted(times.items(), key=lambda kv_: -kv_[1]))


def loop_spec(p: argparse.ArgumentParser, spec: str) -> tuple[str, int]:
    """``PROPOSER@K`` -> ``(proposer, k)``; a one-line parser error otherwise."""
    name, _, k = spec.partition("@")
    if not name or not k.isdigit() or not 1 <= int(k) <= MAX_LOOP_K:
        p.error(f"--loop {spec}: expected PROPOSER@K with K in 1..{MAX_LOOP_K}, e.g. ngram@15")
    return name, int(k)


def loop_step_ms(engine: tileinfer.Engine, k: int, context: int, repeats: int) -> float:
    """Median ms of the device loop's step drafting ``k`` tokens, after a prefill of ``context``
    random tokens (the proposer fed the prompt as the decoder feeds it). The sequence grows by each
    call's committed tokens; its pages are reserved up front."""
    from dflash_step import device_loop

    from tileinfer.decoding import prefill

    loop, proposer = device_loop(engine, k), engine.proposer
    ids = random_prompt(context, engine.model_config.vocab_size)
    engine.kv.reset()
    with torch.inference_mode():
        first = prefill(engine.model, engine.kv, engine.sampler, ids, proposer.hidden_layers,
                        chunk=engine.config.prefill_chunk, on_chunk=proposer.prompt_chunk)
        loop.begin(ids, first, (repeats + 8) * (k + 1))
        return median_seconds(lambda: loop.step(k), engine.device, repeats=repeats, warmup=3) * 1e3


def measure_loops(folder: Path, shape: str, args, env: dict, step1: dict[int, float]) -> list[dict]:
    """The ``--loop`` rows of one checkpoint; ``step1``: the 1-token step's ms per context."""
    rows = []
    capacity = max(args.contexts) + (args.repeats + 12) * (MAX_LOOP_K + 1)
    for name, k in args.loop:
        sources, overrides = engine_args("default", [f"proposer={name}", f"spec_k={k}"])
        runner = EngineRunner(folder, sources, overrides, capacity)
        try:
            for n in args.contexts:
                ms = loop_step_ms(runner.engine, k, n, args.repeats)
                rows.append({"shape": shape, "variant": "default", "peer": None, "workload": f"loop_{name}{k}_ctx{n}",
                             "value": ms, "unit": "ms", "proposer": name, "k": k, "context": n,
                             "ratio_to_step1": ms / step1[n], "roofline_fraction": None, "tflops": None,
                             "peak_fraction": None, **env})
                print(f"{shape:11} {name + '@' + str(k):10} loop N={n:6} {ms:8.3f} ms  x{ms / step1[n]:5.2f}", flush=True)
        finally:
            runner.close()
            free_memory()
    return rows


def measure_variant(folder: Path, shape: str, variant: str, args, env: dict) -> list[dict]:
    sources, overrides = engine_args(variant)
    runner = EngineRunner(folder, sources, overrides, max(args.contexts) + max(args.tokens))
    engine, rows = runner.engine, []
    mc = engine.model_config
    layout = runner.layout()
    try:
        for n in args.contexts:
            engine.generate(random_prompt(n, mc.vocab_size), max_new_tokens=1, ignore_eos=True)
            engine.kv.truncate(n)
            base = None
            for t in args.tokens:
                ms = step_ms(engine, t, n, args.repeats)
                base = ms if t == 1 else base
                roof = decode_step_bytes(mc, n, **layout) / (env["copy_bandwidth_tb_s"] * 1e12) * 1e3
                rows.append({"shape": shape, "variant": variant, "peer": None, "workload": f"step{t}_ctx{n}",
                             "value": ms, "unit": "ms", "tokens": t, "context": n,
                             "ratio_to_step1": ms / base if base else None, "roofline_ms": roof,
                             "roofline_fraction": roof / ms, "tflops": None, "peak_fraction": None, **env})
                print(f"{shape:11} {variant:10} T={t:2} N={n:6} {ms:8.3f} ms  x{rows[-1]['ratio_to_step1'] or 0:5.2f}"
                      f"  roofline {roof:.3f} ms ({roof / ms:.0%})", flush=True)
                if args.profile and engine.device.type == "cuda":
                    kernels = kernel_profile(engine, t, n)
                    rows[-1]["kernels_us"] = kernels
                    for name, us in list(kernels.items())[:8]:
                        print(f"{'':28}{us:9.1f} us  {name[:90]}")
    finally:
        runner.close()
    return rows


def main(argv: list[str] | None = None) -> list[dict]:
    args = parse(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    env = records.environment(limits_mod.measure(device), args.commit)
    rows = []
    folders = [(args.model.resolve().name, args.model)] if args.model else [
        (shape, write_random_checkpoint(shape, args.checkpoints / shape)) for shape in args.shape]
    for shape, folder in folders:
        for variant in args.variant:
            rows += measure_variant(folder, shape, variant, args, env)
            free_memory()
        if args.loop:
            step1 = {r["context"]: r["value"] for r in rows
                     if r["shape"] == shape and r["variant"] == args.variant[0] and r.get("tokens") == 1}
            rows += measure_loops(folder, shape, args, env, step1)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "step_costs.json").write_text(json.dumps(rows, indent=1) + "\n")
    return rows


if __name__ == "__main__":
    main()
