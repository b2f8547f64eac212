"""bench/dflash_step.py on the CPU: each step of one DFlash step is recorded at each context, as
the GPU run reports them (the figures of a CPU say nothing), with a random z-lab-format drafter
the engine loads."""

from __future__ import annotations

import json
import math

import pytest
import torch

from conftest import load_script


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU smoke of the script")
def test_every_step_is_recorded(tmp_path):
    bench = load_script("bench/dflash_step.py", "tileinfer_bench_dflash_step")
    rows = bench.main(["--contexts", "20,40", "--block", "8", "--drafter-layers", "3", "--repeats", "1",
                       "--out", str(tmp_path), "--checkpoints", str(tmp_path / "ckpt")])
    names = ["step1", "verify8", "block", "context8", "dflash_step", "loop_step"]
    assert [r["workload"] for r in rows] == [f"{s}_ctx{n}" for n in (20, 40) for s in names]
    assert json.loads((tmp_path / "dflash_step.json").read_text()) == rows
    for r in rows:
        assert r["unit"] == "ms" and r["shape"] == "tiny" and r["block"] == 8 and r["drafter_layers"] == 3
        assert math.isfinite(r["value"]) and r["value"] > 0
        base = next(b for b in rows if b["context"] == r["context"] and b["workload"].startswith("step1_"))
        assert r["ratio_to_step1"] == pytest.approx(r["value"] / base["value"])
    config = json.loads((tmp_path / "ckpt" / "tiny-dflash-l3-b8" / "config.json").read_text())
    assert config["architectures"] == ["DFlashDraftModel"] and config["block_size"] == 8


def test_a_qwen3_shape_is_refused_on_a_cpu_in_one_line(capsys):
    if torch.cuda.is_available():
        pytest.skip("a GPU runs the Qwen3 shapes")
    bench = load_script("bench/dflash_step.py", "tileinfer_bench_dflash_step")
    with pytest.raises(SystemExit):
        bench.parse(["--shape", "Qwen3-4B"])
    assert "needs a CUDA GPU" in capsys.readouterr().err
