"""What one step costs: ms per decode or verify step of T tokens after N cached positions, the
device-resident speculative loop's whole step, and one DFlash step taken apart.

``steps``: for each shape and variant the engine is built once (its KV pool sized for the longest
context), a random prompt of N tokens is prefilled, and the step runner the engine decodes with
(CUDA graphs in the default config) is called with T tokens at position N, over and over, each call
timed with CUDA events after a warm-up (median of --repeats). Every call writes the same positions,
so every call is the same step. A record (kind ``step``) holds the ms, ``ratio_to_step1`` (over the
1-token step at the same context: what a proposer's speedup divides by) and ``roofline_ms`` (weights
once plus the cached K and V at the copy bandwidth of the same run); ``--profile`` adds each
kernel's device time per step (``kernels_us``). ``--loop ngram@15`` also times the device loop's
whole step with that proposer drafting K tokens (draft, verify of K + 1 tokens, acceptance: one
graph replay), for each variant (``--variant persistent``: the loop over the persistent step),
``ratio_to_step1`` over the same variant's 1-token step.

``dflash-step``: at a target's shape with a random z-lab-format drafter of its width (kind
``dflash_step``): ``step1`` (a plain decode step), ``verify{B}`` (the target's verify of B tokens),
``block`` (the drafter's block step), ``context{B}`` (the drafter's context step of B rows),
``dflash_step`` (block, verify and context back to back) and ``loop_step`` (the device loop's whole
step), each with its ratio to ``step1``.

Without a GPU the shape is tiny and the contexts short, which checks the code, not the figures.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

import tileinfer

from . import records
from .shapes import CHECKPOINTS, cpu_refusal, decode_step_bytes, default_shapes, write_random_checkpoint
from .shapes import write_random_drafter
from .timing import measure_limits, median_seconds
from .workloads import engine_args
from .workloads import EngineRunner, free_memory, random_prompt

MAX_LOOP_K = 15  # the device loop drafts at most 15 tokens a step
GPU = torch.cuda.is_available()
DEVICE = torch.device("cuda" if GPU else "cpu")


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
    return dict(sorted(times.items(), key=lambda item: -item[1]))


def timeline_summary(items: torch.Tensor, timeline: torch.Tensor) -> dict:
    """Where the persistent step's time goes, from its timeline (``options.persistent.timeline``:
    each item's program, start, end in ns). A stage is a run of items of one kind and layer; each
    stage's producer is the stage before it. Per kind: ``critical_us``, the step's time between the
    end of the producer stages and the end of this kind's stages, summed over layers (the kinds'
    figures add up to the step); ``item_us``, the mean item from its start to its end (its wait
    included); ``work_us``, from the later of its start and its producer's end to its end."""
    from tileinfer.backends.triton.persistent_plan import KIND_NAMES

    kind, layer = items[:, 0].tolist(), items[:, 1].tolist()
    program, start, end = (timeline[:, j].tolist() for j in range(3))
    t0 = min(start)
    kinds: dict[str, dict[str, float]] = {}
    stage_end, i = t0, 0
    while i < len(kind):
        j = i
        while j < len(kind) and (kind[j], layer[j]) == (kind[i], layer[i]):
            j += 1
        end_of_stage = max(end[i:j])
        k = kinds.setdefault(KIND_NAMES[kind[i]], {"items": 0, "critical_us": 0.0, "item_us": 0.0, "work_us": 0.0})
        k["items"] += j - i
        k["critical_us"] += (end_of_stage - stage_end) / 1e3
        k["item_us"] += sum(end[x] - start[x] for x in range(i, j)) / 1e3
        k["work_us"] += sum(end[x] - max(start[x], stage_end) for x in range(i, j)) / 1e3
        stage_end, i = end_of_stage, j
    for k in kinds.values():
        k["item_us"] /= k["items"]
        k["work_us"] /= k["items"]
    span = max(end) - t0
    busy = sum(e - s for s, e in zip(start, end)) / ((max(program) + 1) * span)
    return {"span_us": span / 1e3, "busy_fraction": busy, "kinds": kinds}


def print_timeline(summary: dict) -> None:
    print(f"  timeline: {summary['span_us']:.1f} us, programs busy (in an item, waits included) "
          f"{summary['busy_fraction']:.0%}")
    for name, k in summary["kinds"].items():
        print(f"    {name:<12} {k['items']:6d} items  critical {k['critical_us']:8.1f} us  item {k['item_us']:6.2f} us"
              f"  after its producer {k['work_us']:6.2f} us")


def device_loop(engine, k: int):
    """The engine's device-resident loop, or one built as the engine builds it (over the same
    forward pass), drafting ``k`` tokens a step."""
    from tileinfer.device_speculation import SpeculativeLoop
    from tileinfer.steps import cuda_graph_capture

    loop = engine.decoder.loop
    if loop is not None and k in loop.k_values:
        return loop
    capture = cuda_graph_capture if engine.device.type == "cuda" and engine.config.cuda_graphs else None
    return SpeculativeLoop(engine.decoder.steps.forward_pass, engine.kv, engine.proposer, [k], capture=capture)


def loop_step_ms(engine: tileinfer.Engine, k: int, context: int, repeats: int) -> float:
    """Median ms of the device loop's step drafting ``k`` tokens after a prefill of ``context``
    random tokens; the sequence grows by each call's committed tokens, its pages reserved up front."""
    from tileinfer.decoding import prefill

    loop, proposer = device_loop(engine, k), engine.proposer
    ids = random_prompt(context, engine.model_config.vocab_size)
    engine.kv.reset()
    with torch.inference_mode():
        first = prefill(engine.decoder.steps, engine.sampler, ids, proposer.hidden_layers,
                        chunk=engine.config.prefill_chunk, on_chunk=proposer.prompt_chunk)
        loop.begin(ids, first, (repeats + 8) * (k + 1))
        return median_seconds(lambda: loop.step(k), engine.device, repeats=repeats, warmup=3) * 1e3


def loop_spec(spec: str) -> tuple[str, int]:
    """``PROPOSER@K`` -> ``(proposer, k)``."""
    name, _, k = spec.partition("@")
    if not name or not k.isdigit() or not 1 <= int(k) <= MAX_LOOP_K:
        raise argparse.ArgumentTypeError(f"{spec}: expected PROPOSER@K with K in 1..{MAX_LOOP_K}, e.g. ngram@15")
    return name, int(k)


def integers(text: str) -> list[int]:
    return [int(t) for t in text.split(",") if t]


def arguments(p) -> None:
    p.description, p.epilog = __doc__.split("\n\n")[0], __doc__.split("\n\n", 1)[1]
    p.add_argument("--shape", action="append", help="model shape (bench/shapes.py); default Qwen3-0.6B and "
                   "Qwen3-4B on a GPU, tiny on a CPU")
    p.add_argument("--model", type=Path, metavar="DIR", help="a real checkpoint folder instead of the random shapes "
                   "(e.g. models/target: the shipped family's speculative table divides by its ratios)")
    p.add_argument("--variant", action="append", help="variant of bench/workloads.py (default: default), with config "
                   "overrides appended as VARIANT+KEY=VALUE+... (recorded under that name)")
    p.add_argument("--tokens", type=integers, default=[1, 2, 4, 8, 16], help="tokens per step (default 1,2,4,8,16)")
    p.add_argument("--contexts", type=integers, default=[1024, 8192] if GPU else [32, 256],
                   help="cached positions before the step (default 1024,8192; 32,256 on a CPU)")
    p.add_argument("--repeats", type=int, default=50 if GPU else 3, help="timed calls per step (median)")
    p.add_argument("--checkpoints", type=Path, default=CHECKPOINTS, help="where random checkpoints are written once")
    p.add_argument("--loop", action="append", default=[], type=loop_spec, metavar="PROPOSER@K",
                   help="also time the device loop's whole step with this proposer drafting K tokens (repeatable)")
    p.add_argument("--profile", action="store_true", help="also record each step's per-kernel device times")
    records.arguments(p)


def check(args) -> str | None:
    """Why the arguments cannot run (one line), or None."""
    if args.model and args.shape:
        return "--model and --shape exclude each other"
    if args.model and not (args.model / "config.json").is_file():
        return f"--model {args.model}: no config.json there"
    if args.loop and 1 not in args.tokens:
        return "--loop: its ratio is over the 1-token step; keep 1 in --tokens"
    return next((r for r in map(cpu_refusal, args.shape or []) if r), None) if not GPU else None


def main(args) -> int:
    if reason := check(args):
        print(f"error: {reason}", file=sys.stderr)
        return 2
    limits = measure_limits(DEVICE).figures()
    run = records.Run(DEVICE, commit=args.commit, path=args.records)
    shapes = args.shape or default_shapes(DEVICE)
    folders = [(args.model.resolve().name, args.model)] if args.model else [
        (shape, write_random_checkpoint(shape, args.checkpoints / shape)) for shape in shapes]
    variants = args.variant or ["default"]
    for shape, folder in folders:
        step1 = {}  # (variant, context) -> its 1-token step, what the variant's loop ratios divide by
        for variant in variants:
            runner = EngineRunner(folder, *engine_args(variant), max(args.contexts) + max(args.tokens))
            engine, mc, layout = runner.engine, runner.engine.model_config, runner.layout()
            try:
                for n in args.contexts:
                    engine.generate(random_prompt(n, mc.vocab_size), max_new_tokens=1, ignore_eos=True)
                    engine.kv.truncate(n)
                    base = None
                    for t in args.tokens:
                        ms = step_ms(engine, t, n, args.repeats)
                        if t == 1:
                            base = ms
                            step1[variant, n] = ms
                        roof = decode_step_bytes(mc, n, **layout) / (limits["copy_bandwidth_tb_s"] * 1e12) * 1e3
                        profile = {"kernels_us": kernel_profile(engine, t, n)} if args.profile and GPU else {}
                        forward = engine.decoder.steps.forward_pass
                        if getattr(forward, "timeline", None) is not None:
                            profile["timeline"] = timeline_summary(forward.timeline_items, forward.timeline)
                        run.add("step", shape=shape, variant=variant, tokens=t, context=n, value=ms, unit="ms",
                                ratio_to_step1=ms / base if base else None, roofline_ms=roof,
                                roofline_fraction=roof / ms, notices=list(runner.notices), **profile, **limits)
                        print(f"{shape:11} {variant:10} T={t:2} N={n:6} {ms:8.3f} ms  roofline {roof:.3f} ms",
                              flush=True)
                        if "timeline" in profile:
                            print_timeline(profile["timeline"])
            finally:
                runner.close()
        for variant in variants:
            for name, k in args.loop:
                capacity = max(args.contexts) + (args.repeats + 12) * (MAX_LOOP_K + 1)
                runner = EngineRunner(folder, *engine_args(variant, [f"proposer={name}", f"spec_k={k}"]), capacity)
                try:
                    for n in args.contexts:
                        ms, plain = loop_step_ms(runner.engine, k, n, args.repeats), step1[variant, n]
                        run.add("step", shape=shape, variant=variant, proposer=name, k=k, tokens=k + 1, context=n,
                                value=ms, unit="ms", ratio_to_step1=ms / plain, notices=list(runner.notices),
                                **limits)
                        print(f"{shape:11} {variant:10} {name}@{k:<7} loop N={n:6} {ms:8.3f} ms  x{ms / plain:5.2f}",
                              flush=True)
                finally:
                    runner.close()
                    free_memory()
    print(f"appended {len(run.records)} records to {run.path}")
    return 0


def dflash_arguments(p) -> None:
    p.description = __doc__.split("\n\n")[2]
    p.add_argument("--shape", default="Qwen3-4B" if GPU else "tiny", help="target shape (default Qwen3-4B on a GPU, "
                   "tiny on a CPU)")
    p.add_argument("--variant", default="default", help="variant of bench/workloads.py (default: default)")
    p.add_argument("--contexts", type=integers, default=[1024, 8192] if GPU else [32, 100],
                   help="cached positions before the step (default 1024,8192; 32,100 on a CPU)")
    p.add_argument("--block", type=int, default=16, choices=range(2, 17), metavar="B",
                   help="the drafter's block size, 2 to 16 (default 16: 15 drafts)")
    p.add_argument("--drafter-layers", type=int, default=5, help="the drafter's layers (default 5, z-lab's)")
    p.add_argument("--repeats", type=int, default=50 if GPU else 3, help="timed calls per step (median)")
    p.add_argument("--checkpoints", type=Path, default=CHECKPOINTS, help="where random checkpoints are written once")
    records.arguments(p)


def dflash_costs(engine, loop, n: int, block: int, repeats: int) -> dict[str, float]:
    """Median ms of each step of one DFlash step after ``n`` cached positions."""
    steps, kv, p = engine.decoder.steps, engine.kv, engine.proposer
    vocab = engine.model_config.vocab_size
    prompt = random_prompt(n, vocab)
    verify = torch.tensor(random_prompt(block, vocab, seed=1), device=engine.device)
    one, last = verify[:1].clone(), int(verify[0])
    out: dict[str, float] = {}

    def timed(name: str, fn) -> None:
        with torch.inference_mode():
            out[name] = median_seconds(fn, engine.device, repeats=repeats, warmup=3) * 1e3

    engine.generate(prompt, max_new_tokens=1, ignore_eos=True)  # the prefill: both caches hold n positions
    for cache in (kv, p.kv):
        cache.truncate(n)
        cache.reserve(n + block)
    with torch.inference_mode():
        _, hidden = steps.forward(verify, n)
        hidden = {i: h[:block].clone() for i, h in hidden.items()}
    timed("step1", lambda: steps.forward(one, n))
    timed(f"verify{block}", lambda: steps.forward(verify, n))
    timed("block", lambda: p.steps.block(last, n))
    timed(f"context{block}", lambda: p.steps.context(hidden, n - block))

    def dflash_step() -> None:  # as the sequential loop runs them, without its host reads
        p.steps.block(last, n)
        steps.forward(verify, n)
        p.steps.context(hidden, n - block)

    timed("dflash_step", dflash_step)
    kv.truncate(n)  # the sequence: the prompt and a first token; pages for every call's positions
    p.kv.truncate(n)
    loop.begin(prompt, one, (repeats + 4) * block)
    timed("loop_step", lambda: loop.step(block - 1))
    return out


def dflash_main(args) -> int:
    if not GPU and (reason := cpu_refusal(args.shape)):
        print(f"error: {reason}", file=sys.stderr)
        return 2
    run = records.Run(DEVICE, commit=args.commit, path=args.records)
    target = write_random_checkpoint(args.shape, args.checkpoints / args.shape)
    drafter = write_random_drafter(args.shape, args.drafter_layers, args.block,
                                   args.checkpoints / f"{args.shape}-dflash-l{args.drafter_layers}-b{args.block}")
    sources, overrides = engine_args(args.variant, ["proposer=dflash", f"spec_k={args.block - 1}",
                                                    f"options.dflash.model={drafter}"])
    runner = EngineRunner(target, sources, overrides, max(args.contexts) + (args.repeats + 12) * args.block)
    try:
        with torch.inference_mode():
            loop = device_loop(runner.engine, args.block - 1)  # its graphs are captured before any prefill
        for n in args.contexts:
            costs = dflash_costs(runner.engine, loop, n, args.block, args.repeats)
            for name, ms in costs.items():
                run.add("dflash_step", shape=args.shape, variant=args.variant, step=name, context=n, value=ms,
                        unit="ms", block=args.block, drafter_layers=args.drafter_layers,
                        ratio_to_step1=ms / costs["step1"])
                print(f"{args.shape:10} N={n:6} {name:12} {ms:8.3f} ms  x{ms / costs['step1']:5.2f}", flush=True)
    finally:
        runner.close()
    print(f"appended {len(run.records)} records to {run.path}")
    return 0


# -- the tables of python -m bench report ---------------------------------------------------------

def steps_table(rows: list[dict]) -> str:
    from .report import markdown

    contexts = sorted({r["context"] for r in rows})
    labels = sorted({(r.get("proposer") or "", r["variant"], r.get("k") or 0, r["tokens"]) for r in rows})
    index = {(r.get("proposer") or "", r["variant"], r.get("k") or 0, r["tokens"], r["context"]): r for r in rows}

    def cell(r: dict | None) -> str:
        if r is None:
            return ""
        ratio = f" (x{r['ratio_to_step1']:.2f})" if r.get("ratio_to_step1") is not None else ""
        return f"{r['value']:.3f}{ratio}"

    body = [[variant, f"loop {proposer}@{k}" if proposer else f"T={t}",
             *(cell(index.get((proposer, variant, k, t, n))) for n in contexts)] for proposer, variant, k, t in labels]
    return markdown(["variant", "step", *(f"ms after {n} (x step1)" for n in contexts)], body)


def dflash_table(rows: list[dict]) -> str:
    from .report import markdown

    contexts = sorted({r["context"] for r in rows})
    index = {(r["step"], r["context"]): r for r in rows}
    names = list(dict.fromkeys(r["step"] for r in rows))
    body = [[s, *(f"{index[s, n]['value']:.3f} (x{index[s, n]['ratio_to_step1']:.2f})" if (s, n) in index else ""
                  for n in contexts)] for s in names]
    first = rows[0]
    return (f"Block {first['block']}, drafter of {first['drafter_layers']} layers, variant {first['variant']}.\n\n"
            + markdown(["step", *(f"ms after {n} (x step1)" for n in contexts)], body))


def tables() -> list:
    from .report import Table

    return [Table("step", "{group}: ms per step", steps_table, group=lambda r: r["shape"]),
            Table("dflash_step", "{group}: one DFlash step", dflash_table, group=lambda r: r["shape"])]
