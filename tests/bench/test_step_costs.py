"""bench/step_costs.py on the CPU: every step of the grid is recorded as the matrix's rows are (the
figures of a CPU say nothing; only that each row ran and holds what the GPU run reports)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from conftest import load_script


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU smoke of the script")
def test_every_step_of_the_grid_is_recorded(tmp_path):
    steps = load_script("bench/step_costs.py", "tileinfer_bench_step_costs")
    rows = steps.main(["--tokens", "1,3", "--contexts", "20,40", "--repeats", "1", "--out", str(tmp_path),
                       "--checkpoints", str(tmp_path / "ckpt")])
    assert [r["workload"] for r in rows] == ["step1_ctx20", "step3_ctx20", "step1_ctx40", "step3_ctx40"]
    assert json.loads((tmp_path / "step_costs.json").read_text()) == rows
    for r in rows:
        assert r["unit"] == "ms" and r["shape"] == "tiny" and r["variant"] == "default"
        assert math.isfinite(r["value"]) and r["value"] > 0
        assert r["roofline_ms"] > 0 and r["roofline_fraction"] == pytest.approx(r["roofline_ms"] / r["value"])
        base = next(b for b in rows if b["context"] == r["context"] and b["tokens"] == 1)
        assert r["ratio_to_step1"] == pytest.approx(r["value"] / base["value"])


def test_a_qwen3_shape_is_refused_on_a_cpu_in_one_line(capsys):
    if torch.cuda.is_available():
        pytest.skip("a GPU runs the Qwen3 shapes")
    steps = load_script("bench/step_costs.py", "tileinfer_bench_step_costs")
    with pytest.raises(SystemExit):
        steps.parse(["--shape", "Qwen3-4B"])
    assert "needs a CUDA GPU" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU smoke of the script")
def test_a_real_checkpoint_is_measured_under_its_folder_name(tmp_path, tiny_checkpoint):
    steps = load_script("bench/step_costs.py", "tileinfer_bench_step_costs")
    rows = steps.main(["--model", str(tiny_checkpoint), "--tokens", "1,2", "--contexts", "12", "--repeats", "1",
                       "--out", str(tmp_path)])
    assert [(r["shape"], r["workload"]) for r in rows] == [(tiny_checkpoint.name, "step1_ctx12"),
                                                           (tiny_checkpoint.name, "step2_ctx12")]


@pytest.mark.parametrize("argv,message", [
    (["--model", "{empty}"], "no config.json there"),
    (["--model", "{ckpt}", "--shape", "tiny"], "--model and --shape exclude each other"),
])
def test_bad_model_arguments_are_one_line_errors(tmp_path, tiny_checkpoint, capsys, argv, message):
    steps = load_script("bench/step_costs.py", "tileinfer_bench_step_costs")
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit):
        steps.parse([a.format(empty=tmp_path / "empty", ckpt=tiny_checkpoint) for a in argv])
    assert message in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU smoke of the script")
def test_the_device_loops_step_is_recorded_beside_the_plain_step(tmp_path):
    """The shipped model with its drafters: each --loop row is over the same run's 1-token step."""
    steps = load_script("bench/step_costs.py", "tileinfer_bench_step_costs")
    shipped = Path(__file__).resolve().parents[2] / "models" / "target"
    rows = steps.main(["--model", str(shipped), "--tokens", "1", "--contexts", "12", "--repeats", "1",
                       "--loop", "ngram@2", "--loop", "dflash@3", "--out", str(tmp_path)])
    assert [r["workload"] for r in rows] == ["step1_ctx12", "loop_ngram2_ctx12", "loop_dflash3_ctx12"]
    for r in rows[1:]:
        assert math.isfinite(r["value"]) and r["value"] > 0
        assert r["ratio_to_step1"] == pytest.approx(r["value"] / rows[0]["value"])
    assert [(r["proposer"], r["k"]) for r in rows[1:]] == [("ngram", 2), ("dflash", 3)]


@pytest.mark.parametrize("argv,message", [
    (["--loop", "ngram"], "expected PROPOSER@K with K in 1..15"),
    (["--loop", "ngram@16"], "expected PROPOSER@K with K in 1..15"),
    (["--loop", "@3"], "expected PROPOSER@K"),
    (["--loop", "ngram@3", "--tokens", "2,4"], "keep 1 in --tokens"),
])
def test_bad_loop_arguments_are_one_line_errors(capsys, argv, message):
    steps = load_script("bench/step_costs.py", "tileinfer_bench_step_costs")
    with pytest.raises(SystemExit):
        steps.parse(argv)
    assert message in capsys.readouterr().err
