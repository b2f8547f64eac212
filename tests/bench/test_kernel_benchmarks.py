"""``python -m bench kernels``: one micro-benchmark per Triton op (the small ops in ``OPS``, paged
attention and the linear in modules of their own; tests/backends/test_layout.py checks that every op
has one); each says in one line that it needs a GPU (exit status 2) where none is visible, and
``--help`` works; the small ops' cases check and time what their docstrings say."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from bench import kernels, shapes
from bench.__main__ import main as bench


@pytest.mark.skipif(torch.cuda.is_available(), reason="the no-GPU message")
@pytest.mark.parametrize("name", kernels.BENCHMARKS)
def test_says_in_one_line_that_it_needs_a_gpu(name, capsys):
    assert bench(["kernels", name]) == 2
    assert capsys.readouterr().err == f"error: python -m bench kernels {name} needs a CUDA GPU (none is visible)\n"


@pytest.mark.parametrize("name", kernels.BENCHMARKS)
def test_help(name, capsys):
    with pytest.raises(SystemExit) as exit_:
        bench(["kernels", name, "--help"])
    assert exit_.value.code == 0
    assert f"usage: python -m bench kernels {name}" in capsys.readouterr().out


def test_every_small_op_of_the_triton_backend_is_a_case():
    from pathlib import Path

    triton = Path(kernels.__file__).resolve().parents[2] / "backends" / "triton"
    assert all((triton / f"{op}.py").is_file() for op in kernels.OPS)
    assert set(kernels.OPS) == {"add", "rms_norm", "rope", "silu_mul", "kv_write", "attention_inputs", "int8_dequant"}


def test_the_dequantized_format_sweeps_the_bf16_gemm_tiles():
    """``int8d`` (int8 dequantized, then the BF16 GEMM) sweeps the BF16 GEMM's tiles, not the W8A16 ones."""
    from bench.kernels import linear

    bf16 = list(linear.sweep_configs(19456, 2560, 1024, 132, "bf16"))
    assert list(linear.sweep_configs(19456, 2560, 1024, 132, "int8d")) == bf16
    assert bf16 != list(linear.sweep_configs(19456, 2560, 1024, 132, "int8"))


@pytest.mark.parametrize("argv, message", [
    (["ops", "--models", "Qwen3-5B"], "unknown model 'Qwen3-5B'; valid: "),
    (["ops", "--op", "gelu"], "unknown op 'gelu'; valid: add, rms_norm"),
    (["linear", "--formats", "fp8"], "unknown weight format 'fp8'; valid: bf16, int8"),
    (["paged_attention", "--kv", "fp8"], "unknown page format 'fp8'; valid: bf16, int8"),
])
def test_an_unknown_name_is_a_usage_error(capsys, argv, message):
    with pytest.raises(SystemExit):
        bench(["kernels", *argv])
    assert message in capsys.readouterr().err


@pytest.mark.gpu
@pytest.mark.parametrize("op", kernels.OPS)
def test_each_case_runs_beside_its_twin(op):
    """On the GPU: every case of an op, at a decode and a prefill step, runs beside its twin (the
    kernels' accuracy is tests/backends/triton's) and is timed to a positive figure."""
    import math

    for t in (1, 64):
        for case, shape, make, kernel, twin, moved in kernels.OPS[op](shapes.SHAPES["Qwen3-0.6B"], t):
            m = kernels.measure(make, kernel, twin, moved, bandwidth=4e12, repeats=3)
            assert math.isfinite(m["max_abs_err"]) and m["kernel_us"] > 0 and m["twin_us"] > 0, (op, case, t)


def test_paged_attention_build_needs_no_gpu(tmp_path):
    """``--build``: a prefill shape compiled for sm_90 on this machine, one record with its tiles;
    the candidates are prefill_tiles' shapes. In a subprocess: this session imported the kernels
    under TRITON_INTERPRET=1."""
    import json
    import os
    import subprocess
    import sys

    from bench.kernels.paged_attention_build import CANDIDATES
    from tileinfer.backends.triton.paged_attention import PREFILL_SHAPES

    assert CANDIDATES == ("rule", *PREFILL_SHAPES)
    records_file = tmp_path / "records.jsonl"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-m", "bench", "kernels", "paged_attention", "--build", "--prefill-tiles",
                           "128x64", "--records", str(records_file)], capture_output=True, text=True,
                          env=env, cwd=Path(__file__).resolve().parents[2], timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    found = [json.loads(line) for line in records_file.read_text().splitlines()]
    assert [(r["kind"], r["candidate"]) for r in found] == [("attention_build", "128x64")]
    assert found[0]["tiles"]["block_m"] == 128 and found[0]["registers"] > 0 and found[0]["hgmma"]


@pytest.mark.gpu
def test_paged_attention_prefill_prompts(tmp_path):
    """``--prefill-prompts``: a prompt of two chunks (the second partial) with the rule and the
    128-row shape of the rule's key tile, timed, each against the rule's bits (the same: the same key
    tiles in the same order)."""
    import json

    records_file = tmp_path / "records.jsonl"
    assert bench(["kernels", "paged_attention", "--prefill-prompts", "4200", "--prefill-tiles", "rule,128x64",
                  "--repeats", "2", "--records", str(records_file)]) == 0
    found = {r["tiles"]: r for r in map(json.loads, records_file.read_text().splitlines())}
    assert set(found) == {"rule", "128x64"} and found["rule"]["bit_identical_to_rule"]
    assert all(r["phase"] == "prefill_prompt" and len(r["chunk_us"]) == 2 and r["kernel_us"] > 0
               for r in found.values())
    assert found["128x64"]["bit_identical_to_rule"]
