"""The per-op kernel micro-benchmarks of bench/kernels (one per Triton op, named as the op:
tests/backends/test_layout.py checks that): each says in one line that it needs a GPU (exit status 2) where none is visible, and ``--help`` works."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
KERNELS = ROOT / "bench" / "kernels"
SCRIPTS = sorted(p.stem for p in KERNELS.glob("*.py") if 'if __name__ == "__main__":' in p.read_text())


def load(name: str):
    """The script as a module of its own name-spaced name (the op names are generic)."""
    module_name = f"tileinfer_bench_kernels_{name}"
    if module_name not in sys.modules:
        spec = importlib.util.spec_from_file_location(module_name, KERNELS / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        spec.loader.exec_module(module)
    return sys.modules[module_name]


@pytest.mark.skipif(torch.cuda.is_available(), reason="the no-GPU message")
@pytest.mark.parametrize("script", SCRIPTS)
def test_says_in_one_line_that_it_needs_a_gpu(script, capsys):
    assert load(script).main([]) == 2
    assert capsys.readouterr().err == f"error: {script}.py needs a CUDA GPU (none is visible)\n"


@pytest.mark.parametrize("script", SCRIPTS)
def test_help(script, capsys):
    with pytest.raises(SystemExit) as exit_:
        load(script).main(["--help"])
    assert exit_.value.code == 0
    assert "usage:" in capsys.readouterr().out
