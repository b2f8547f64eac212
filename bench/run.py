"""Run the benchmark matrix (shape x variant-or-peer x workload) and write its tables.

    python bench/run.py [--filter SUBSTR]... [--shape NAME]... [--variant NAME]... [--workload NAME]...
                        [--seconds S] [--model DIR] [--out DIR] [--peers | --no-peers]

Each row is warmed up by a run of its prompt (8 new tokens; the whole workload for the peers, whose
first run allocates), then measured until S seconds are spent (at least once), median. The limits
are measured first, in the same run: the device copy bandwidth and the matmul peak (BF16 on a GPU, float32 on a CPU)
(bench/limits.py). Decode rows are also given as a fraction of their roofline (weights + KV read per
step over that bandwidth), prefill rows as TFLOP/s and a fraction of that peak (bench/roofline.py).
A variant whose config does not load or cannot run here is skipped with the reason; a row that
fails (out of memory, a peer that does not compile) is recorded with the reason instead of a
number. Writes results.json (this run's rows only: a file already there is replaced), results.md
and, with matplotlib, results.png under --out, rewriting them after every row so that a run cut
short keeps what it measured, and prints the tables of this run. Without a GPU the workloads shrink
to the CPU sizes (prompts 32x shorter, 8 new tokens), the shape is tiny, and a Qwen3 shape is
refused. The committed H200 matrix is made by bench/gpu_matrix.sh (parts of this script's runs,
merged by bench/report.py --merge).

Examples:
    python bench/run.py --seconds 0 --no-peers --shape Qwen3-4B      # the variants at one shape
    python bench/run.py --variant hf-sdpa --variant default --filter ctx1024 --out /tmp/peer
    python bench/run.py --model /path/to/Qwen3-0.6B --variant default --variant int8
    python bench/run.py --shape tiny --variant reference --variant ngram --seconds 0.5 --out /tmp/b
"""

from __future__ import annotations

import argparse
import re
import sys
import traceback
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import torch  # noqa: E402
from tqdm.auto import tqdm  # noqa: E402

import limits as limits_mod  # noqa: E402
import peers as peers_mod  # noqa: E402
import records  # noqa: E402
import report  # noqa: E402
from shapes import SHAPES, cpu_refusal, write_random_checkpoint  # noqa: E402
from tileinfer.errors import ConfigError  # noqa: E402
from tileinfer.model_config import ModelConfig  # noqa: E402
from variants import VARIANTS, engine_args, resolve  # noqa: E402
from workloads import ALL_NAMES, NAMES, EngineRunner, Workload, free_memory, groups, measure, workloads  # noqa: E402

HERE = Path(__file__).parent
GPU_SHAPES = ["Qwen3-0.6B", "Qwen3-4B"]
SCRATCH = Path("/tmp/tileinfer-bench")


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 2)[2],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--filter", action="append", default=[], metavar="SUBSTR",
                   help="run only rows whose id SHAPE/NAME/WORKLOAD contains SUBSTR (repeatable: all must match), "
                        "e.g. --filter 4B/default")
    p.add_argument("--shape", action="append", default=[], choices=sorted(SHAPES),
                   help=f"random-weight shape (repeatable; default {' and '.join(GPU_SHAPES)} on a GPU, tiny on a CPU)")
    p.add_argument("--variant", action="append", default=[], metavar="NAME",
                   help=f"a variant ({', '.join(VARIANTS)}) or a peer ({', '.join(peers_mod.PEERS)}); repeatable; "
                        "default: every variant, and every peer with --peers")
    p.add_argument("--workload", action="append", default=[], choices=ALL_NAMES,
                   help="repeatable; default: the four of the matrix (prefill8192 and prefill32768, time to "
                        "first token of long prompts, only when named)")
    p.add_argument("--seconds", type=float, default=1.0,
                   help="time budget per row: repeat the measurement until S seconds are spent, take the median "
                        "(0: one sample after the warm-up; default %(default)s)")
    p.add_argument("--model", type=Path, help="a real checkpoint folder instead of random weights (shape from its "
                   "config.json, named after the folder)")
    p.add_argument("--checkpoints", type=Path, default=Path("/tmp/tileinfer-checkpoints"),
                   help="where random-weight checkpoints are written once and reused (default %(default)s)")
    p.add_argument("--out", type=Path, help=f"results folder; its results.* are replaced by this run's (default "
                   f"{SCRATCH}/<GPU name, '-' for spaces>, {SCRATCH}/cpu without a GPU)")
    p.add_argument("--peers", action=argparse.BooleanOptionalAction, default=None,
                   help="also measure the peers (default: yes on a GPU, no on a CPU)")
    p.add_argument("--short", action="store_true", help="the CPU workload sizes on a GPU too")
    p.add_argument("--commit", help="commit to record (default: git rev-parse --short HEAD, or null)")
    args = p.parse_args(argv)
    unknown = [v for v in args.variant if v not in VARIANTS and v not in peers_mod.PEERS]
    if unknown:
        p.error(f"unknown variant {unknown[0]!r}; valid: {', '.join([*VARIANTS, *peers_mod.PEERS])}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    short = args.short or device.type == "cpu"
    by_name = workloads(short)
    chosen = [by_name[n] for n in (args.workload or NAMES)]
    peers = args.peers if args.peers is not None else device.type == "cuda"
    names = args.variant or [*VARIANTS, *(peers_mod.PEERS if peers else ())]
    if args.model:
        folders = {args.model.name: args.model}
    else:
        shapes = args.shape or (GPU_SHAPES if device.type == "cuda" else ["tiny"])
        refusals = [cpu_refusal(s) for s in shapes] if device.type == "cpu" else []
        if any(refusals):
            print(f"error: {next(r for r in refusals if r)}", file=sys.stderr)
            return 2
        folders = {s: args.checkpoints / s for s in shapes}
    rows = [(s, n, w) for s in folders for n in names for w in chosen
            if all(f in f"{s}/{n}/{w.name}" for f in args.filter)]
    if not rows:
        print("nothing to run: no row matches the filters", file=sys.stderr)
        return 2
    if short:
        print("notice: CPU workload sizes: " + ", ".join(f"{w.name} = {w.prompt_tokens}+{w.new_tokens} tokens"
                                                        for w in chosen))
    lim = limits_mod.measure(device)
    print(f"{lim.device}: copy bandwidth {lim.copy_bandwidth / 1e12:.3g} TB/s, "
          f"matmul peak {lim.matmul_peak / 1e12:.3g} TFLOP/s", flush=True)
    env = records.environment(lim, args.commit)
    out = args.out or SCRATCH / ("cpu" if device.type == "cpu" else lim.device.replace(" ", "-"))
    rows_done: list[dict] = []
    bar = tqdm(total=len(rows), unit="row", file=sys.stderr, dynamic_ncols=True)
    threads = torch.get_num_threads()
    for shape, folder in folders.items():
        if not args.model:
            bar.set_postfix_str(f"writing {shape} checkpoint")
            write_random_checkpoint(shape, folder)
        mc = ModelConfig.from_folder(folder)
        # The tiny shape's ops are too small to split across CPU threads: more only add jitter.
        torch.set_num_threads(1 if shape == "tiny" and device.type == "cpu" else threads)
        for name in names:
            mine = [w for s, n, w in rows if s == shape and n == name]
            for done in run_name(shape, folder, mc, name, mine, device, args.seconds, env, bar):
                rows_done += done
                report.write(rows_done, out, chart_too=False)  # a run cut short keeps what it measured
    torch.set_num_threads(threads)
    bar.close()
    written = report.write(rows_done, out)
    print("\n" + report.tables(rows_done))
    print("wrote " + ", ".join(str(p) for p in written))
    return 0


def run_name(shape: str, folder: Path, mc: ModelConfig, name: str, chosen: list[Workload], device: torch.device,
             seconds: float, env: dict, bar: tqdm) -> Iterator[list[dict]]:
    """Every chosen workload of one variant or peer, yielded as they are done (a list of records
    each time); rows that cannot run get a note instead."""
    is_peer = name in peers_mod.PEERS
    base = dict(shape=shape, env=env, mc=mc, variant=None if is_peer else name, peer=name if is_peer else None)
    extra = [f"device={device.type}"]
    try:
        spec_k = resolve(name if not is_peer else "default", [*extra, f"model={folder}"]).spec_k
    except ConfigError as exc:
        tqdm.write(f"skip {shape}/{name}: {exc}")
        bar.update(len(chosen))
        yield [records.record(workload=w, note=f"skipped: {exc}", **base) for w in chosen]
        return
    per_context = not is_peer or name in peers_mod.PER_CONTEXT
    for capacity, group in groups(chosen, spec_k, per_context):
        bar.set_postfix_str(f"{shape}/{name}: loading")
        try:
            if is_peer:
                runner = peers_mod.runner(name, folder, device, kv_capacity=capacity, device_override=extra)
            else:
                runner = EngineRunner(folder, *engine_args(name, extra), kv_capacity=capacity)
        except Exception as exc:  # noqa: BLE001 - a row that cannot run is recorded, the run goes on
            note = f"skipped: {exc}" if isinstance(exc, ConfigError) else failure(exc)
            tqdm.write(f"skip {shape}/{name} ({', '.join(w.name for w in group)}): {note}")
            yield [records.record(workload=w, note=note, kv_capacity=capacity, **base) for w in group]
            bar.update(len(group))
            continue
        for w in group:
            bar.set_postfix_str(f"{shape}/{name}/{w.name}")
            try:
                m = measure(runner, w, seconds)
                done = records.record(workload=w, measurement=m, layout=runner.layout(), kv_capacity=capacity, **base)
            except Exception as exc:  # noqa: BLE001
                note = failure(exc)
                del exc  # its traceback holds the failed step's tensors
                free_memory()
                tqdm.write(f"failed {shape}/{name}/{w.name}: {note}")
                done = records.record(workload=w, note=note, kv_capacity=capacity, **base)
            bar.update(1)
            yield [done]
        runner.close()


def failure(exc: BaseException) -> str:
    """One line: the exception's type and first line (for out of memory, the size asked for), and
    the deepest line of tileinfer or bench/ it was raised through (else the deepest line)."""
    frames = traceback.extract_tb(exc.__traceback__) if exc.__traceback__ else []
    ours = [f for f in frames if Path(f.filename).is_relative_to(HERE.parent) or "/tileinfer/" in f.filename]
    where = (ours or frames or [None])[-1]
    place = f" (at {Path(where.filename).name}:{where.lineno})" if where else ""
    first = (str(exc).strip().splitlines() or [""])[0][:300]
    if isinstance(exc, torch.OutOfMemoryError):
        size = re.search(r"Tried to allocate ([\d.]+ [KMGT]?i?B)", str(exc))
        return "out of memory" + (f", tried to allocate {size.group(1)}" if size else "") + place
    return f"{type(exc).__name__}: {first}{place}"

if __name__ == "__main__":
    sys.exit(main())
