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
from .workloads import (ALL_NAMES, NAMES, QUANTIZED, VARIANTS, EngineRunner, Workload, engine_args, failure,
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
                facts = {**(runner.last_decode if w.kind == "decode" else {}), "notices": runner.notices}
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


# -- the tables of python -m bench report, one shape each ---------------------------------------------

GRAPH_WORKLOAD = "decode128_ctx1024"
GRAPH_STEPS = ("eager", "CUDA graphs", "CUDA graphs + pipelined")
GRAPH_TABLE = (("fused", ("eager", "no-pipelining", "default")),
               ("one kernel per op", ("eager-per-op", "no-fused-kernels-no-pipelining", "no-fused-kernels")))
GAIN_NOTE = "x: over the default measured in the same run; blank where that run measured none."


def name(r: dict) -> str:
    """The record's variant or peer."""
    return r["variant"] or r["peer"]


def run_of(r: dict) -> tuple:
    return r["date"], r.get("part")


def _num(v: float) -> str:
    return f"{v:.0f}" if v >= 100 else f"{v:.1f}" if v >= 10 else f"{v:.2f}" if v >= 0.01 else f"{v:.3g}"


def _cell(r: dict | None, *, fraction: bool = True, note_chars: int = 100) -> str:
    if r is None:
        return ""
    if r["value"] is None:
        return f"– ({(r['note'] or 'not run')[:note_chars]})"
    text = f"{_num(r['value'])} {r['unit']}"
    if fraction and r.get("roofline_fraction") is not None:
        text += f" ({r['roofline_fraction']:.1%})"
    if fraction and r.get("tflops") is not None:
        text += f", {_num(r['tflops'])} TFLOP/s ({r['peak_fraction']:.1%})"
    return text


def _ratio(ours: dict | None, theirs: dict | None) -> str:
    """How many times faster ``ours`` is (ms: theirs / ours; tok/s: ours / theirs), if both are
    measured in the same run; else empty."""
    if not ours or not theirs or ours["value"] is None or theirs["value"] is None or run_of(ours) != run_of(theirs):
        return ""
    r = theirs["value"] / ours["value"] if ours["unit"] == "ms" else ours["value"] / theirs["value"]
    return f" x{r:.2f}"


class Rows:
    """One commit's matrix records of one shape: the newest record of each name and workload, and
    each run's default (what that run's gains divide by)."""

    def __init__(self, records: list[dict]) -> None:
        ordered = sorted(records, key=lambda r: r["date"])
        self.index = {(name(r), r["workload"]): r for r in ordered}
        self.defaults = {(run_of(r), r["workload"]): r for r in ordered if r["variant"] == "default"}
        self.workloads = sorted({r["workload"] for r in records},
                                key=lambda w: ALL_NAMES.index(w) if w in ALL_NAMES else len(ALL_NAMES))
        counts: dict = {}
        for r in records:
            if r["variant"] not in (None, "default"):
                counts[run_of(r)] = counts.get(run_of(r), 0) + 1
        main = max(counts, key=lambda k: (counts[k], k)) if counts else None
        for w in self.workloads:  # the summary's default: the one of the run that measured most variants
            if (main, w) in self.defaults:
                self.index["default", w] = self.defaults[main, w]

    def gain(self, r: dict | None) -> str:
        return _ratio(self.defaults.get((run_of(r), r["workload"])), r) if r else ""

    def sizes(self) -> str:
        sizes = {r["workload"]: f"{r['prompt_tokens']}+{r['new_tokens']}" for r in self.index.values()}
        return "prompt + new tokens: " + ", ".join(f"{w} {sizes[w]}" for w in self.workloads)


def summary_table(records: list[dict]) -> str:
    from .report import markdown

    rows = Rows(records)
    body = [[v, *(_cell(rows.index.get((v, w))) for w in rows.workloads)] for v in ("default", *QUANTIZED)
            if any((v, w) in rows.index for w in rows.workloads)]
    return rows.sizes() + "\n\n" + markdown(["variant", *rows.workloads], body)


def ablation_table(records: list[dict]) -> str:
    from .report import markdown

    rows = Rows(records)
    measured = {name(r) for r in records if r["variant"]}

    def cell(v: str, w: str) -> str:
        r = rows.index.get((v, w))
        return _cell(r, fraction=False) + ("" if v == "default" else rows.gain(r))

    body = [[v, " ".join(VARIANTS[v]) or "configs/default.yaml", *(cell(v, w) for w in rows.workloads)]
            for v in VARIANTS if v in measured]
    return markdown(["variant", "config", *rows.workloads], body) + "\n\n" + GAIN_NOTE


def graphs_table(records: list[dict]) -> str:
    from .report import markdown

    rows, body = Rows(records), []
    for kernels, chain in GRAPH_TABLE:
        previous = None
        for step, variant in zip(GRAPH_STEPS, chain):
            r = rows.index.get((variant, GRAPH_WORKLOAD))
            if r is not None and r["value"] is not None:
                body.append([kernels, step, variant, _cell(r), _ratio(r, previous).strip()])
                previous = r
    return markdown(["kernels", "decode steps", "variant", "tok/s", "gain"], body) + \
        "\n\ngain: over the row above, blank across runs."


def peers_table(records: list[dict]) -> str:
    from .report import markdown

    rows = Rows(records)
    names = [*peers_mod.PEERS, *sorted({r["peer"] for r in records if r["peer"] and r["peer"] not in peers_mod.PEERS})]
    body = []
    for run in sorted({run_of(r) for r in records if r["peer"]}, key=str):
        mine = {(r["peer"], r["workload"]): r for r in records if r["peer"] and run_of(r) == run}
        body.append([f"default ({run[0]})", *(_cell(rows.defaults.get((run, w)), fraction=False)
                                              for w in rows.workloads)])
        body += [[p, *(_cell(mine.get((p, w)), fraction=False, note_chars=200) + rows.gain(mine.get((p, w)))
                       for w in rows.workloads)] for p in names if any(k[0] == p for k in mine)]
    if not body:
        return ""
    absent = [p for p in peers_mod.PEERS if not any(r["peer"] == p for r in records)]
    return (markdown(["peer", *rows.workloads], body) + "\n\n" + GAIN_NOTE
            + (f"\n\nNot measured (no record of this commit): {', '.join(absent)}." if absent else ""))


HEADLINE = ("default", "torch-matmul", "hf-sdpa", "hf-static-compile", "engine-compiled")
HEADLINE_WORKLOADS = ("prefill1024", "decode128_ctx1024")


def headline_table(records: list[dict]) -> str:
    """Our default beside cuBLAS linears and the BF16 peers at a 1,024-token prefill and the decode
    after it, each row's gain over the default of its own run."""
    from .report import markdown

    rows = Rows(records)
    body = [[n, *(_cell(rows.index.get((n, w))) + ("" if n == "default" else rows.gain(rows.index.get((n, w))))
                  for w in HEADLINE_WORKLOADS)]
            for n in HEADLINE if any((n, w) in rows.index for w in HEADLINE_WORKLOADS)]
    return markdown(["", *HEADLINE_WORKLOADS], body) + "\n\n" + GAIN_NOTE


def table(title: str, names: tuple[str, ...], render, workloads: tuple[str, ...] = ALL_NAMES,
          any_peer: bool = False):
    """A report table of the matrix records of one shape whose name is in ``names`` (``any_peer``:
    and every peer, e.g. llama.cpp's), complete when it has every row of ``names`` the parts measure."""
    from .report import Table

    def wanted(n: str, w: str, peer: bool = False) -> bool:
        return (n in names or any_peer and peer) and w in workloads

    def missing(records: list[dict], shape: str) -> list[str]:
        have = {(name(r), r["workload"]) for r in records}
        return [f"{n}/{w}" for n, w in sorted(expected(shape)) if wanted(n, w) and (n, w) not in have]

    return Table("matrix", f"{{group}}: {title}", render, group=lambda r: r["shape"],
                 select=lambda r: wanted(name(r), r["workload"], r["peer"] is not None), missing=missing)


def tables() -> list:
    return [table("headline (x: our default over the row)", HEADLINE, headline_table, HEADLINE_WORKLOADS),
            table("summary (decode: % of the roofline; prefill: TFLOP/s, % of the matmul peak)",
                  ("default", *QUANTIZED), summary_table),
            table("ablation (the gain of the feature switched off: default over the variant)", tuple(VARIANTS),
                  ablation_table),
            table(f"CUDA graphs ({GRAPH_WORKLOAD})", tuple(v for _, chain in GRAPH_TABLE for v in chain),
                  graphs_table, (GRAPH_WORKLOAD,)),
            table("peers (x: our default's speed over theirs)", ("default", *peers_mod.PEERS), peers_table,
                  any_peer=True)]
