"""What the per-op kernel micro-benchmarks of bench/kernels share (not a script): their arguments,
the GPU check, the Qwen3 shapes, the check of a kernel against its reference twin, the timing of
both with bench/timing.py (a CUDA graph of one call per input copy, rotating among enough copies
that the working set is not in the H200's 60 MB L2), the memory roofline (bytes moved over the
device copy bandwidth of bench/limits.py, measured in the same run) and the JSON record."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Callable, Iterable
from pathlib import Path

import torch

BENCH = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(BENCH))
from limits import copy_bandwidth  # noqa: E402
from shapes import SHAPES  # noqa: E402
from timing import graph_seconds  # noqa: E402

MODELS = ("Qwen3-0.6B", "Qwen3-4B")
ROTATION_BYTES = 256 * 2**20  # > 4x the H200's 60 MB L2
MAX_COPIES = 64  # tiny steps stay in L2 anyway: their figure is the launch floor


def parser(doc: str, tokens: str = "1,16,1024", tokens_help: str | None = None) -> argparse.ArgumentParser:
    """A parser described by ``doc``'s first line, with --models, --tokens, --repeats and --out."""
    p = argparse.ArgumentParser(description=doc.splitlines()[0])
    p.add_argument("--models", default=",".join(MODELS), help=f"comma-separated shapes of bench/shapes.py "
                   f"(default {','.join(MODELS)})")
    p.add_argument("--tokens", default=tokens, help=f"comma-separated step sizes T (default {tokens_help or tokens})")
    p.add_argument("--repeats", type=int, default=50, help="timed graph replays per case (median; default 50)")
    p.add_argument("--out", type=Path, default=None, help="folder for the JSON record (default: print only)")
    return p


def parse_args(p: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    args = p.parse_args(argv)
    args.models = [m for m in args.models.split(",") if m]
    for m in args.models:
        if m not in SHAPES:
            p.error(f"unknown model {m!r}; valid: {', '.join(SHAPES)}")
    args.tokens = [int(t) for t in args.tokens.split(",") if t]
    return args


def gpu_visible(script: str) -> bool:
    """True with a CUDA GPU; else one line on stderr saying that ``script`` needs one."""
    if torch.cuda.is_available():
        return True
    print(f"error: {script} needs a CUDA GPU (none is visible)", file=sys.stderr)
    return False


def copies_for(make_inputs: Callable[[int], object], bytes_per_copy: int) -> list:
    """Enough input sets (seeds 0, 1, ...) that their bytes exceed the L2 several times (at most
    ``MAX_COPIES``)."""
    n = max(2, min(MAX_COPIES, -(-ROTATION_BYTES // max(1, bytes_per_copy))))
    return [make_inputs(seed) for seed in range(n)]


def _flat(result) -> list[torch.Tensor]:
    return list(result) if isinstance(result, (tuple, list)) else [result]


def max_error(kernel: Callable, twin: Callable, make_inputs: Callable[[int], object]) -> float:
    """Largest absolute difference between the kernel's outputs and the twin's on the same inputs
    (each on its own copy: kernels may write into their inputs)."""
    got, expected = _flat(kernel(make_inputs(0))), _flat(twin(make_inputs(0)))
    return max((a.float() - b.float()).abs().max().item() for a, b in zip(got, expected))


def measure(case: dict, make_inputs: Callable[[int], object], kernel: Callable, twin: Callable, moved: int,
            bandwidth: float, repeats: int) -> dict:
    """One record: the error against the twin, then the device time of the kernel and of the twin
    (graph replays over rotated input copies) in us, the kernel's GB/s and its fraction of the copy
    bandwidth (``moved`` bytes read + written per call)."""
    err = max_error(kernel, twin, make_inputs)
    copies = copies_for(make_inputs, moved)
    seconds = {}
    for name, fn in (("kernel", kernel), ("twin", twin)):
        seconds[name] = graph_seconds(lambda fn=fn: [fn(c) for c in copies], repeats=repeats, calls=len(copies))
    del copies
    return dict(case, kernel_us=seconds["kernel"] * 1e6, twin_us=seconds["twin"] * 1e6, bytes=moved,
                kernel_gb_s=moved / seconds["kernel"] / 1e9, copy_fraction=moved / seconds["kernel"] / bandwidth,
                twin_copy_fraction=moved / seconds["twin"] / bandwidth, max_abs_err=err)


def main(op: str, doc: str, cases: Callable[[str, dict, int], Iterable[tuple]], argv: list[str] | None) -> int:
    """The ``main`` of a script measuring ``cases`` (:func:`run`) with the arguments of :func:`parser`;
    exit status 2 and one line without a GPU."""
    args = parse_args(parser(doc), argv)
    if not gpu_visible(f"{op}.py"):
        return 2
    return run(op, args, cases)


def run(op: str, args: argparse.Namespace, cases: Callable[[str, dict, int], Iterable[tuple]]) -> int:
    """For each model and T, ``cases(model, shape, T)`` yields ``(case, make_inputs, kernel, twin,
    moved)``; each is measured, printed as a row, and the records are written to ``args.out/<op>.json``."""
    import triton

    bandwidth = copy_bandwidth(torch.device("cuda"))
    print(f"{torch.cuda.get_device_name()}: copy bandwidth {bandwidth / 1e12:.2f} TB/s (read + write), "
          f"torch {torch.__version__}, triton {triton.__version__}", flush=True)
    print(f"{'model':<11} {'case':<22} {'T':>5} {'triton us':>10} {'twin us':>9} {'GB/s':>7} {'of copy':>8} "
          f"{'twin of copy':>12} {'max err':>9}")
    records = []
    for model in args.models:
        for t in args.tokens:
            for case, make_inputs, kernel, twin, moved in cases(model, SHAPES[model], t):
                case = dict(model=model, T=t, **case)
                rec = measure(case, make_inputs, kernel, twin, moved, bandwidth, args.repeats)
                records.append(rec)
                print(f"{model:<11} {case['case']:<22} {t:>5} {rec['kernel_us']:10.1f} {rec['twin_us']:9.1f} "
                      f"{rec['kernel_gb_s']:7.0f} {rec['copy_fraction']:8.1%} {rec['twin_copy_fraction']:12.1%} "
                      f"{rec['max_abs_err']:9.2e}", flush=True)
                torch.cuda.empty_cache()
    write_record(args.out, op, dict(copy_bandwidth_tb_s=bandwidth / 1e12, results=records))
    return 0


def write_record(out: Path | None, op: str, record: dict) -> None:
    """``record`` with the GPU, the versions and the commit, as ``out/<op>.json`` (nothing without ``out``)."""
    if out is None:
        return
    import triton

    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                cwd=BENCH).stdout.strip() or None
    except OSError:
        commit = None
    record = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                  commit=commit, **record)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{op}.json"
    path.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {path}")
