"""The benchmark matrix: shape x variant-or-peer x workload, records of kind ``matrix``.

Each row is warmed up by a run of its prompt (8 new tokens; the whole workload for the peers, whose
first run allocates), then measured until --seconds are spent (at least once), median. The limits
are measured first, in the same run: the device copy bandwidth and the matmul peak
(bench/timing.py). Decode rows are also given as a fraction of their roofline (weights + KV read per
step over that bandwidth), prefill rows as TFLOP/s and a fraction of that peak (bench/shapes.py).
A variant whose config does not load or cannot run here is recorded as skipped with the reason; a
row that fails (out of memory, a peer that does not compile) is recorded with the reason instead of
a number. Without a GPU the workloads shrink to the CPU sizes (prompts 32x shorter, 8 new tokens),
the shape is tiny, and a Qwen3 shape is refused.

The H200 matrix of one commit is measured in parts that each fit one 10-minute device call
(``--part N``; ``--list-parts`` prints them); each part measures its shape's default first, so that
every gain divides by a default of the same run. The tables of ``python -m bench report`` take each
table from one commit that has every row the parts give it.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from tileinfer.errors import ConfigError
from tileinfer.model_config import ModelConfig

from . import peers as peers_mod
from . import records as records_mod
from .shapes import CHECKPOINTS, SHAPES, cpu_refusal, decode_roofline_tok_s, default_shapes, prefill_flops
from .shapes import write_random_checkpoint, write_stand_in_tokenizer
from .timing import measure_limits
from .workloads import (ALL_NAMES, NAMES, VARIANTS, EngineRunner, Workload, engine_args, failure,
                        free_memory, groups, known_variant, measure, resolve, variant_items, workloads)


@dataclass(frozen=True)
class Part:
    shape: str
    seconds: float  # time budget per row
    names: tuple[str, ...]  # measured after the default
    workloads: tuple[str, ...] = NAMES


GRAPH_CHAIN = ("eager", "eager-per-op", "no-fused-kernels", "no-fused-kernels-no-pipelining", "no-pipelining",
               "no-fused-linears", "no-fused-attention-inputs", "no-pdl")
REST = ("reference", "eager-per-op-dense-attention", "no-cuda-graphs", "torch-matmul", "eager-torch-matmul",
        "int8-kv", "int8-int8-kv", "ngram", "persistent")
BF16_PEERS = ("hf-sdpa", "hf-static-compile", "engine-compiled")
# our INT8 weights beside the INT8 weight-only peers, at the INT8 targets
INT8 = ("int8", "int8-persistent", *peers_mod.INT8_PEERS)
INT8_WORKLOADS = ("prefill1024", "decode128_ctx1024")
PARTS = {  # minutes per part, setup and compilation included: 5-7
    "1": Part("Qwen3-0.6B", 0.5, GRAPH_CHAIN), "2": Part("Qwen3-0.6B", 0.5, REST),
    "3": Part("Qwen3-4B", 0.5, GRAPH_CHAIN), "4": Part("Qwen3-4B", 0.5, REST),
    "5": Part("Qwen3-0.6B", 1, BF16_PEERS), "6": Part("Qwen3-4B", 1, BF16_PEERS),
    "7": Part("Qwen3-0.6B", 1, INT8, INT8_WORKLOADS), "8": Part("Qwen3-4B", 1, INT8, INT8_WORKLOADS),
}


def expected(shape: str) -> set[tuple[str, str]]:
    """(name, workload) of every row the parts measure at ``shape``."""
    return {(n, w) for p in PARTS.values() if p.shape == shape for n in ("default", *p.names) for w in p.workloads}


def arguments(p, names: str = "default: every variant, and every peer with --peers") -> None:
    p.description, p.epilog = __doc__.split("\n\n")[0], __doc__.split("\n\n", 1)[1]
    p.add_argument("--part", choices=sorted(PARTS), help="one part of the H200 matrix (its shape, rows and seconds)")
    p.add_argument("--list-parts", action="store_true", help="print each part's shape, rows and workloads")
    p.add_argument("--filter", action="append", default=[], metavar="SUBSTR",
                   help="run only rows whose id SHAPE/NAME/WORKLOAD contains SUBSTR (repeatable: all must match)")
    p.add_argument("--shape", action="append", default=[], choices=sorted(SHAPES),
                   help="random-weight shape (repeatable; default Qwen3-0.6B and Qwen3-4B on a GPU, tiny on a CPU)")
    p.add_argument("--variant", action="append", default=[], metavar="NAME",
                   help=f"a variant ({', '.join(VARIANTS)}; VARIANT+KEY=VALUE+...: with config overrides, recorded "
                        f"under that name) or a peer ({', '.join(peers_mod.PEERS)}); repeatable; "
                        + names)
    p.add_argument("--workload", action="append", default=[], choices=ALL_NAMES,
                   help="repeatable; default: the four of the matrix (prefill8192 and prefill32768, time to first "
                        "token of long prompts, only when named)")
    p.add_argument("--seconds", type=float, default=1.0, help="time budget per row: repeat until S seconds are "
                   "spent, take the median (0: one sample after the warm-up; default %(default)s)")
    p.add_argument("--model", type=Path, help="a real checkpoint folder instead of random weights (named after it)")
    p.add_argument("--checkpoints", type=Path, default=CHECKPOINTS,
                   help="where random-weight checkpoints are written once and reused (default %(default)s)")
    p.add_argument("--peers", action=argparse.BooleanOptionalAction, default=None,
                   help="also measure the peers (default: yes on a GPU, no on a CPU)")
    p.add_argument("--short", action="store_true", help="the CPU workload sizes on a GPU too")
    p.add_argument("--new-tokens", type=decode_tokens, metavar="N", help="at most N new tokens per decode "
                   "(at least 2: a decode figure times the tokens after the first), for a quick smoke; default: "
                   "the workload's")
    records_mod.arguments(p)


def decode_tokens(text: str) -> int:
    if not text.isdigit() or int(text) < 2:
        raise argparse.ArgumentTypeError(f"{text}: expected an integer >= 2")
    return int(text)


def main(args) -> int:
    if args.list_parts:
        for name, part in PARTS.items():
            workloads_ = "" if part.workloads == NAMES else " | " + " ".join(part.workloads)
            print(f"{name} {part.shape} default {' '.join(part.names)}{workloads_}")
        return 0
    unknown = [v for v in args.variant if not known_variant(v) and v not in peers_mod.PEERS]
    if unknown:
        print(f"error: unknown variant {unknown[0]!r}; valid: {', '.join([*VARIANTS, *peers_mod.PEERS])}",
              file=sys.stderr)
        return 2
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    part = PARTS[args.part] if args.part else None
    if part:
        args.shape, args.seconds = [part.shape], part.seconds
        args.variant, args.workload = ["default", *part.names], list(part.workloads)
    short = args.short or device.type == "cpu"
    chosen = [workloads(short)[n] for n in (args.workload or NAMES)]
    if args.new_tokens:
        chosen = [dataclasses.replace(w, new_tokens=min(w.new_tokens, args.new_tokens)) for w in chosen]
    with_peers = args.peers if args.peers is not None else device.type == "cuda"
    names = args.variant or [*VARIANTS, *(peers_mod.PEERS if with_peers else ())]
    if args.model:
        folders = {args.model.name: args.model}
    else:
        shapes = args.shape or default_shapes(device)
        refusal = next((r for r in map(cpu_refusal, shapes) if r), None) if device.type == "cpu" else None
        if refusal:
            print(f"error: {refusal}", file=sys.stderr)
            return 2
        folders = {s: args.checkpoints / s for s in shapes}
    rows = [(s, n, w) for s in folders for n in names for w in chosen
            if all(f in f"{s}/{n}/{w.name}" for f in args.filter)]
    if not rows:
        print("nothing to run: no row matches the filters", file=sys.stderr)
        return 2
    limits = measure_limits(device)
    print(f"copy bandwidth {limits.copy_bandwidth / 1e12:.3g} TB/s, matmul peak {limits.matmul_peak / 1e12:.3g} "
          f"TFLOP/s" + (f"; CPU sizes: {', '.join(f'{w.name} {w.prompt_tokens}+{w.new_tokens}' for w in chosen)}"
                        if short else ""), flush=True)
    run = records_mod.Run(device, commit=args.commit, path=args.records)
    threads = torch.get_num_threads()
    for shape, folder in folders.items():
        tokenizer = None
        if not args.model:
            write_random_checkpoint(shape, folder)
            if any(w.schema for w in chosen):  # the grammar needs a vocabulary of the shape's size
                tokenizer = write_stand_in_tokenizer(folder, ModelConfig.from_folder(folder).vocab_size)
        mc = ModelConfig.from_folder(folder)
        # The tiny shape's ops are too small to split across CPU threads: more only add jitter.
        torch.set_num_threads(1 if shape == "tiny" and device.type == "cpu" else threads)
        for name in names:
            mine = [w for s, n, w in rows if s == shape and n == name]
            base = dict(shape=shape, mc=mc, name=name, part=args.part, limits=limits.figures(), tokenizer=tokenizer)
            for row in run_name(folder, mine, device, args.seconds, base):
                record = run.add("matrix", **row)
                value = "-" if record["value"] is None else f"{record['value']:.4g} {record['unit']}"
                print(f"{shape}/{name}/{record['workload']}: {value}{'  ' + record['note'] if record['note'] else ''}",
                      flush=True)
    torch.set_num_threads(threads)
    print(f"appended {len(run.records)} records to {run.path}")
    return 0


def run_name(folder: Path, chosen: list[Workload], device: torch.device, seconds: float, base: dict):
    """Every chosen workload of one variant or peer, yielded as they are measured (rows that cannot
    run get a note instead of a value)."""
    name, is_peer = base["name"], base["name"] in peers_mod.PEERS
    extra = [f"device={device.type}"]
    try:
        spec_k = resolve(name if not is_peer else "default", [*extra, f"model={folder}"]).spec_k
    except ConfigError as exc:
        yield from (row(workload=w, note=f"skipped: {exc}", **base) for w in chosen)
        return
    for capacity, group in groups(chosen, spec_k, not is_peer or name in peers_mod.PER_CONTEXT):
        try:
            runner = (peers_mod.runner(name, folder, device, kv_capacity=capacity, device_override=extra) if is_peer
                      else EngineRunner(folder, *engine_args(name, extra), kv_capacity=capacity))
        except Exception as exc:  # noqa: BLE001 - a row that cannot run is recorded, the run goes on
            note = f"skipped: {exc}" if isinstance(exc, ConfigError) else failure(exc)
            yield from (row(workload=w, note=note, kv_capacity=capacity, **base) for w in group)
            continue
        for w in group:
            try:
                measurement = measure(runner, w, seconds)
                facts = {**(runner.last_decode if w.kind == "decode" else {}), "notices": list(runner.notices)}
                done = row(workload=w, measurement=measurement, layout=runner.layout(), kv_capacity=capacity,
                           facts=facts, **base)
            except Exception as exc:  # noqa: BLE001
                note = failure(exc)
                del exc  # its traceback holds the failed step's tensors
                free_memory()
                done = row(workload=w, note=note, kv_capacity=capacity, **base)
            yield done
        runner.close()


def row(*, shape: str, workload: Workload, mc: ModelConfig, name: str, part: str | None, limits: dict,
        measurement=None, note: str | None = None, layout: dict | None = None,
        kv_capacity: int | None = None, facts: dict | None = None, tokenizer: str | None = None) -> dict:
    """One record's figures. ``layout`` (``quantize``, ``storage``, ``dtype_bytes``) sets the roofline's
    bytes; ``facts``: what the run reported (``decode_loop`` and ``tokens_per_step`` of a decode row,
    the engine's ``notices``); ``tokenizer``: the stand-in tokenizer of a random checkpoint, if any."""
    variant = None if name in peers_mod.PEERS else name
    value = measurement.value if measurement else None
    out = {"shape": shape, "variant": variant, "peer": None if variant else name, "workload": workload.name,
           "value": value, "unit": workload.unit, "samples": measurement.samples if measurement else [], "note": note,
           "roofline_tok_s": None, "roofline_fraction": None, "tflops": None, "peak_fraction": None,
           "prompt_tokens": workload.prompt_tokens, "new_tokens": workload.new_tokens, "kv_capacity": kv_capacity,
           "config": variant_items(variant) if variant else None, "part": part, **limits,
           **({"tokenizer": tokenizer} if tokenizer and workload.schema else {}), **(facts or {})}
    if value is None:
        return out
    if workload.kind == "decode":
        roof = decode_roofline_tok_s(mc, workload.prompt_tokens, workload.new_tokens,
                                     limits["copy_bandwidth_tb_s"] * 1e12, **(layout or {}))
        out.update(roofline_tok_s=roof, roofline_fraction=value / roof)
    else:
        new = workload.prompt_tokens - workload.cached
        tflops = prefill_flops(mc, new, workload.cached)["total"] / (value / 1e3) / 1e12
        out.update(tflops=tflops, peak_fraction=tflops / limits["matmul_peak_tflops"])
    return out
