"""The rows of a results.json: how one is made, what it must hold, and how the parts of one
commit's matrix are combined.

A record is one row of the matrix (one shape x variant-or-peer x workload) of one run of
bench/run.py. ``value`` is null when the row was not measured, and ``note`` says why (a config
that does not load, an incompatible combination, out of memory, a peer that failed). ``part`` is
null in a run's own results.json; ``combine`` sets it to the name of the part's folder, so that
each gain in results.md can divide by the default measured in the same part (bench/gpu_matrix.sh
measures the default in every part).
"""

from __future__ import annotations

import datetime
import json
import math
import subprocess
from pathlib import Path

import torch

from limits import Limits
from roofline import decode_roofline_tok_s, prefill_flops
from tileinfer.model_config import ModelConfig
from variants import VARIANTS
from workloads import Measurement, Workload

REQUIRED = ("shape", "variant", "workload", "value", "unit", "roofline_fraction", "tflops", "peak_fraction", "peer",
            "gpu", "torch", "triton", "commit", "date")


def triton_version() -> str | None:
    """Triton's version, or None where it is not installed."""
    try:
        import triton
    except ImportError:
        return None
    return triton.__version__


def git_commit() -> str | None:
    """``git rev-parse --short HEAD`` of this checkout, or None outside git."""
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=Path(__file__).parent, timeout=10).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def environment(limits: Limits, commit: str | None = None) -> dict:
    """Where and when: gpu, torch, triton, commit (``commit``, else :func:`git_commit`), date,
    and the limits measured in the run."""
    return {"gpu": limits.device, "torch": torch.__version__, "triton": triton_version(),
            "commit": commit or git_commit(),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "copy_bandwidth_tb_s": limits.copy_bandwidth / 1e12, "matmul_peak_tflops": limits.matmul_peak / 1e12}


def record(*, shape: str, workload: Workload, env: dict, mc: ModelConfig, variant: str | None = None,
           peer: str | None = None, measurement: Measurement | None = None, note: str | None = None,
           layout: dict | None = None, kv_capacity: int | None = None) -> dict:
    """One row. ``layout`` (``quantize``, ``storage``, ``dtype_bytes``) sets the roofline's bytes."""
    value = measurement.value if measurement else None
    row = {"shape": shape, "variant": variant, "peer": peer, "workload": workload.name, "value": value,
           "unit": workload.unit, "roofline_fraction": None, "roofline_tok_s": None, "tflops": None,
           "peak_fraction": None, "prompt_tokens": workload.prompt_tokens, "new_tokens": workload.new_tokens,
           "kv_capacity": kv_capacity, "samples": measurement.samples if measurement else [], "note": note,
           "config": VARIANTS.get(variant) if variant else None, "part": None, **env}
    if value is None:
        return row
    if workload.kind == "decode":
        roof = decode_roofline_tok_s(mc, workload.prompt_tokens, workload.new_tokens,
                                     env["copy_bandwidth_tb_s"] * 1e12, **(layout or {}))
        row.update(roofline_tok_s=roof, roofline_fraction=value / roof)
    else:
        flops = prefill_flops(mc, workload.prompt_tokens)["total"]
        row.update(tflops=flops / (value / 1e3) / 1e12)
        row.update(peak_fraction=row["tflops"] / env["matmul_peak_tflops"])
    return row


def key(row: dict) -> tuple:
    """What identifies a row of the matrix: shape, variant, peer, workload."""
    return row["shape"], row["variant"], row["peer"], row["workload"]


def name(row: dict) -> str:
    """The row's variant or peer."""
    return row["variant"] or row["peer"]


def check(row: dict) -> None:
    """What the smoke test asserts of a measured row (never a timing)."""
    missing = [k for k in REQUIRED if k not in row]
    assert not missing, f"record lacks {missing}"
    assert row["value"] is not None and math.isfinite(row["value"]) and row["value"] > 0, row
    figure = row["roofline_fraction"] if row["unit"] == "tok/s" else row["tflops"]
    assert figure is not None and math.isfinite(figure) and figure > 0, row


class CombineError(ValueError):
    """Parts that do not make one matrix: different commits or GPUs, or a row measured twice."""


def combine(parts: dict[str, list[dict]]) -> list[dict]:
    """The rows of several parts of one commit's matrix (part name -> its results.json rows), each
    row's ``part`` set to its part's name; CombineError unless they pass :func:`check_one_matrix`."""
    rows = [{**r, "part": part} for part, records in parts.items() for r in records]
    check_one_matrix(rows)
    return rows


def check_one_matrix(rows: list[dict]) -> None:
    """CombineError unless ``rows`` are one matrix: one known commit and one GPU, each part (a run
    of bench/run.py) of one date, and no row measured twice (only ``default`` may be in several
    parts, each part's baseline)."""
    if not rows:
        raise CombineError("no rows")
    for field in ("commit", "gpu"):
        values = {r[field] for r in rows}
        if len(values) > 1 or None in values:
            raise CombineError(f"the rows must come from one {field}, not {', '.join(sorted(map(str, values)))}")
    dates: dict = {}
    for r in rows:
        dates.setdefault(r.get("part"), set()).add(r["date"])
    for part, seen in dates.items():
        if len(seen) > 1:
            raise CombineError(f"{'part ' + part if part else 'the results'} holds rows of {len(seen)} runs "
                               f"({', '.join(sorted(seen))}); one run each")
    owner: dict[tuple, str | None] = {}
    for r in rows:
        if key(r) in owner and (r["variant"] != "default" or owner[key(r)] == r.get("part")):
            raise CombineError(f"{'/'.join(str(k) for k in key(r) if k)} is in part {owner[key(r)]} "
                               f"and part {r.get('part')}")
        owner[key(r)] = r.get("part")


def load_parts(folders: list[Path]) -> dict[str, list[dict]]:
    """Each folder's results.json, by the folder's name (the part's name)."""
    parts = {}
    for folder in folders:
        path = folder / "results.json"
        if not path.is_file():
            raise CombineError(f"{path} not found")
        if folder.name in parts:
            raise CombineError(f"two parts are named {folder.name}")
        parts[folder.name] = json.loads(path.read_text())
    return parts
