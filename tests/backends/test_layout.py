"""One name per op through the trees: every Triton op module (backends/triton/<op>.py, its parts
named <op>_<part>.py) has its reference twin backends/reference/<op>.py and its test
tests/backends/triton/test_<op>.py and its micro-benchmark in ``python -m bench kernels`` (a case of
bench/kernels' OPS, or bench/kernels/<op>.py), or, for an op that is a whole decode step, a variant
that ``python -m bench steps`` times beside the per-op step; no source file of backends/ is over 400
lines."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TRITON = ROOT / "backends" / "triton"
SHARED = {"__init__", "device_functions", "interpreter", "pdl"}  # not ops: used by every op
WHOLE_STEPS = {"persistent"}  # ops that are a whole decode step: a variant of bench/workloads.py of that name


def triton_ops() -> list[str]:
    names = {p.stem for p in TRITON.glob("*.py")} - SHARED
    return sorted(n for n in names if not any(n.startswith(f"{other}_") for other in names))


@pytest.mark.parametrize("op", triton_ops())
def test_op_has_a_twin_a_test_and_a_benchmark(op):
    assert (ROOT / "backends" / "reference" / f"{op}.py").is_file(), f"no reference twin of {op}"
    assert (Path(__file__).parent / "triton" / f"test_{op}.py").is_file(), f"no test of {op}"
    from bench.kernels import OPS
    from bench.workloads import VARIANTS

    if op in WHOLE_STEPS:
        assert op in VARIANTS, f"no bench variant of the step {op}"
    else:
        assert op in OPS or (ROOT / "bench" / "kernels" / f"{op}.py").is_file(), f"no micro-benchmark of {op}"


def test_no_source_file_over_400_lines():
    long = {str(p.relative_to(ROOT)): n for p in (ROOT / "backends").rglob("*.py")
            if (n := len(p.read_text().splitlines())) > 400}
    assert not long, long
