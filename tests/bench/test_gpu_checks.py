"""bench/gpu_checks.sh without a GPU: a bad check name is refused in one line, and every script and
option a check runs exists (a renamed script or flag would otherwise surface only on the GPU)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "gpu_checks.sh"


def test_a_bad_check_is_refused():
    proc = subprocess.run(["bash", str(SCRIPT), "everything"], capture_output=True, text=True, cwd=ROOT,
                          env={"OUT": "/tmp", "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "steps, gemv, gemm, spec or ttft" in proc.stderr


def test_every_script_and_option_exists():
    text = SCRIPT.read_text()
    calls = re.findall(r"python3 (bench/\S+\.py)((?:[^\n]|\\\n)*)", text)
    assert len(calls) == 13
    helps: dict[str, str] = {}
    for path, rest in calls:
        assert (ROOT / path).is_file(), path
        if path not in helps:
            helps[path] = subprocess.run([sys.executable, str(ROOT / path), "--help"], capture_output=True, text=True,
                                         cwd=ROOT).stdout
        for option in re.findall(r"(--[a-z][a-z0-9-]*)", rest):
            assert option in helps[path], (path, option)
