"""The record store: every measurement is one JSON line in bench/results/<machine>/records.jsonl.

A record is a flat JSON object::

    {"kind": "matrix", "commit": "abc1234", "date": "2026-12-01T10:00:00+00:00",
     "versions": {"torch": "2.13.0+cu130", "triton": "3.6.0", "cuda": "13.0", "gpu": "NVIDIA H200"},
     "shape": "Qwen3-4B", "variant": "default", ..., "value": 382.8, "unit": "tok/s"}

- ``kind``: what was measured, one per table family of ``python -m bench report`` (``matrix``,
  ``step``, ``dflash_step``, ``speculative``, ``kernel``, ...);
- ``commit``: the commit measured (``--commit``, else ``git rev-parse --short HEAD``);
- ``date``: when the run began (ISO 8601, UTC); every record of one run has the same date, so a
  run's records are those of one commit and one date;
- ``versions``: torch, triton, CUDA (torch's build; None on a CPU build) and the GPU (None on a CPU);
- the figures: the fields of the kind.

The machine is the GPU's name with ``-`` for spaces, or ``cpu``. A run appends each record as it
is measured, so that a run cut short keeps what it measured.
"""

from __future__ import annotations

import datetime
import json
import subprocess
from collections.abc import Iterable
from pathlib import Path

import torch

RESULTS = Path(__file__).resolve().parent / "results"


def git_commit() -> str | None:
    """``git rev-parse --short HEAD`` of this checkout, or None outside git."""
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=RESULTS.parent, timeout=10).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def versions(device: torch.device | str) -> dict:
    """torch, triton (None where it does not import), CUDA and the GPU's name (None on a CPU)."""
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    gpu = torch.cuda.get_device_name(device) if torch.device(device).type == "cuda" else None
    return {"torch": torch.__version__, "triton": triton_version, "cuda": torch.version.cuda, "gpu": gpu}


def machine(gpu: str | None) -> str:
    """The store's folder name: the GPU's name with ``-`` for spaces, or ``cpu``."""
    return gpu.replace(" ", "-") if gpu else "cpu"


def store(device: torch.device | str) -> Path:
    """This machine's records.jsonl."""
    return RESULTS / machine(versions(device)["gpu"]) / "records.jsonl"


def load(path: Path) -> list[dict]:
    """The records of a records.jsonl, in file order ([] when there is no file)."""
    if not Path(path).is_file():
        return []
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def append(path: Path, records: Iterable[dict]) -> None:
    """Append ``records`` to ``path`` (created with its folder), one JSON line each."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        for record in records:
            f.write(json.dumps(record, allow_nan=False) + "\n")


class Run:
    """One run of a benchmark: its commit, date and versions, and where its records go.

    ``add(kind, **figures)`` appends a record at once and returns it."""

    def __init__(self, device: torch.device | str, *, commit: str | None = None, path: Path | None = None) -> None:
        self.stamp = {"commit": commit or git_commit(),
                      "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                      "versions": versions(device)}
        self.path = Path(path) if path else RESULTS / machine(self.stamp["versions"]["gpu"]) / "records.jsonl"
        self.records: list[dict] = []

    def add(self, kind: str, **figures) -> dict:
        record = {"kind": kind, **self.stamp, **figures}
        append(self.path, [record])
        self.records.append(record)
        return record


def arguments(p) -> None:
    """``--commit`` and ``--records``, which every benchmark takes."""
    p.add_argument("--commit", help="the commit to record (default: git rev-parse --short HEAD; give it where the "
                   "checkout is a copy without its history, as on the GPU machine)")
    p.add_argument("--records", type=Path, metavar="FILE", help="append the records to FILE (default: "
                   "bench/results/<machine>/records.jsonl, machine the GPU's name or cpu)")
