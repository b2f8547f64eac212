"""The per-op kernel micro-benchmarks of bench/kernels (one per Triton op, named as the op:
tests/backends/test_layout.py checks that): each says in one line that it needs a GPU (exit status 2) where none is visible, and ``--help`` works."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from conftest import load_script

ROOT = Path(__file__).resolve().parents[2]
KERNELS = ROOT / "bench" / "kernels"
SCRIPTS = sorted(p.stem for p in KERNELS.glob("*.py") if 'if __name__ == "__main__":' in p.read_text())


@pytest.mark.skipif(torch.cuda.is_available(), reason="the no-GPU message")
@pytest.mark.parametrize("script", SCRIPTS)
def test_says_in_one_line_that_it_needs_a_gpu(script, capsys):
    assert load_script(f"bench/kernels/{script}.py", f"tileinfer_bench_kernels_{script}").main([]) == 2
    assert capsys.readouterr().err == f"error: {script}.py needs a CUDA GPU (none is visible)\n"


@pytest.mark.parametrize("script", SCRIPTS)
def test_help(script, capsys):
    with pytest.raises(SystemExit) as exit_:
        load_script(f"bench/kernels/{script}.py", f"tileinfer_bench_kernels_{script}").main(["--help"])
    assert exit_.value.code == 0
    assert "usage:" in capsys.readouterr().out
