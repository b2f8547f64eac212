"""``python -m bench steps`` and ``dflash-step`` on the CPU: every step of the grid, the device loop's
step and each step of one DFlash step are recorded as the GPU run records them (the figures of a CPU
say nothing: only that each ran and holds what the GPU run reports)."""

from __future__ import annotations

import gc
import json
import math
from pathlib import Path

import pytest
import torch

from bench import records
from bench.__main__ import main as bench

CPU_ONLY = pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU smoke")
SHIPPED = Path(__file__).resolve().parents[2] / "models" / "target"


@pytest.fixture(autouse=True, scope="module")
def frozen_heap():
    """The objects alive before this module's runs are frozen (gc.freeze), so that the collection
    after each runner (bench.workloads.free_memory) scans what the runs made, not the test process's
    heap."""
    gc.freeze()
    yield
    gc.unfreeze()


@CPU_ONLY
def test_every_step_of_the_grid_is_recorded(tmp_path):
    out = tmp_path / "records.jsonl"
    assert bench(["steps", "--tokens", "1,3", "--contexts", "20,40", "--repeats", "1", "--records", str(out),
                  "--checkpoints", str(tmp_path / "ckpt")]) == 0
    rows = records.load(out)
    assert [(r["tokens"], r["context"]) for r in rows] == [(1, 20), (3, 20), (1, 40), (3, 40)]
    for r in rows:
        assert r["kind"] == "step" and r["unit"] == "ms" and r["shape"] == "tiny" and r["variant"] == "default"
        assert math.isfinite(r["value"]) and r["value"] > 0
        assert r["roofline_ms"] > 0 and r["roofline_fraction"] == pytest.approx(r["roofline_ms"] / r["value"])
        base = next(b for b in rows if b["context"] == r["context"] and b["tokens"] == 1)
        assert r["ratio_to_step1"] == pytest.approx(r["value"] / base["value"])


@CPU_ONLY
def test_the_device_loops_step_is_recorded_beside_the_plain_step_of_a_real_checkpoint(tmp_path):
    """The shipped model with its drafters, under its folder's name: each variant's loop rows are
    over that variant's 1-token step of the same run; each row carries the notices of its engine
    (options of n-gram drafting change nothing where n-gram does not draft)."""
    out = tmp_path / "records.jsonl"
    other = "default+options.ngram.n_max=5"
    assert bench(["steps", "--model", str(SHIPPED), "--tokens", "1", "--contexts", "12", "--repeats", "1",
                  "--variant", "default", "--variant", other, "--loop", "ngram@2",
                  "--loop", "dflash@3", "--records", str(out)]) == 0
    rows = records.load(out)
    assert [(r["shape"], r["variant"], r.get("proposer"), r.get("k"), r["tokens"]) for r in rows] == [
        ("target", "default", None, None, 1), ("target", other, None, None, 1),
        ("target", "default", "ngram", 2, 3), ("target", "default", "dflash", 3, 4),
        ("target", other, "ngram", 2, 3), ("target", other, "dflash", 3, 4)]
    unused = "options.ngram (n_max) has no effect: ngram is not selected here (proposer=dflash)"
    assert [r["notices"] for r in rows] == [[], [unused.replace("dflash", "none")], [], [], [], [unused]]
    step1 = {r["variant"]: r["value"] for r in rows[:2]}
    for r in rows[2:]:
        assert math.isfinite(r["value"]) and r["value"] > 0
        assert r["ratio_to_step1"] == pytest.approx(r["value"] / step1[r["variant"]])


@pytest.mark.parametrize("argv,message", [
    (["--model", "{empty}"], "no config.json there"),
    (["--model", "{ckpt}", "--shape", "tiny"], "--model and --shape exclude each other"),
    (["--loop", "ngram@3", "--tokens", "2,4"], "keep 1 in --tokens"),
    *([] if torch.cuda.is_available() else [(["--shape", "Qwen3-4B"], "needs a CUDA GPU")]),
])
def test_bad_arguments_are_one_line_errors(tmp_path, tiny_checkpoint, capsys, argv, message):
    (tmp_path / "empty").mkdir()
    assert bench(["steps", *(a.format(empty=tmp_path / "empty", ckpt=tiny_checkpoint) for a in argv)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and err.count("\n") == 1


@pytest.mark.parametrize("spec", ["ngram", "ngram@16", "@3"])
def test_a_bad_loop_is_a_usage_error(capsys, spec):
    with pytest.raises(SystemExit):
        bench(["steps", "--loop", spec])
    assert "expected PROPOSER@K with K in 1..15" in capsys.readouterr().err


@CPU_ONLY
def test_every_step_of_a_dflash_step_is_recorded(tmp_path):
    out = tmp_path / "records.jsonl"
    assert bench(["dflash-step", "--contexts", "20,40", "--block", "8", "--drafter-layers", "3", "--repeats", "1",
                  "--records", str(out), "--checkpoints", str(tmp_path / "ckpt")]) == 0
    rows = records.load(out)
    names = ["step1", "verify8", "block", "context8", "dflash_step", "loop_step"]
    assert [(r["step"], r["context"]) for r in rows] == [(s, n) for n in (20, 40) for s in names]
    for r in rows:
        assert r["kind"] == "dflash_step" and r["unit"] == "ms" and r["shape"] == "tiny"
        assert r["block"] == 8 and r["drafter_layers"] == 3 and math.isfinite(r["value"]) and r["value"] > 0
        base = next(b for b in rows if b["context"] == r["context"] and b["step"] == "step1")
        assert r["ratio_to_step1"] == pytest.approx(r["value"] / base["value"])
    config = json.loads((tmp_path / "ckpt" / "tiny-dflash-l3-b8" / "config.json").read_text())
    assert config["architectures"] == ["DFlashDraftModel"] and config["block_size"] == 8


def test_a_qwen3_shape_is_refused_for_a_dflash_step_on_a_cpu(capsys):
    if torch.cuda.is_available():
        pytest.skip("a GPU runs the Qwen3 shapes")
    assert bench(["dflash-step", "--shape", "Qwen3-4B"]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err


def test_timeline_summary_splits_the_step_by_kind():
    from bench.steps import timeline_summary
    from tileinfer.backends.triton.persistent_plan import ATTN_IN, DOWN, QKV

    # two programs; stages: qkv of layer 0 (items 0, 1), attention inputs (2), down (3, 4), qkv of layer 1 (5)
    items = torch.tensor([[QKV, 0, 0, -1], [QKV, 0, 1, -1], [ATTN_IN, 0, 0, -1], [DOWN, 0, 0, -1], [DOWN, 0, 1, -1],
                          [QKV, 1, 0, -1]])
    timeline = torch.tensor([[0, 100, 1100], [1, 100, 1600], [0, 1100, 2600], [1, 1600, 3600], [0, 2600, 4100],
                             [1, 3600, 5100]])
    s = timeline_summary(items, timeline)
    assert s["span_us"] == 5.0
    assert s["busy_fraction"] == (1000 + 1500 + 1500 + 2000 + 1500 + 1500) / (2 * 5000)
    k = s["kinds"]
    assert k["qkv"]["items"] == 3 and k["down"]["items"] == 2 and set(k) == {"qkv", "attn_inputs", "down"}
    # stage ends 1600, 2600, 4100, 5100 after the start at 100: the critical path adds up to the span
    assert k["qkv"]["critical_us"] == 1.5 + 1.0 and k["attn_inputs"]["critical_us"] == 1.0
    assert k["down"]["critical_us"] == 1.5
    assert sum(v["critical_us"] for v in k.values()) == s["span_us"]
    # down items: started 1600 and 2600 (the producer ended 2600): 2000 and 1500 ns from their start,
    # 1000 and 1500 ns after the producer's end
    assert k["down"]["item_us"] == 1.75 and k["down"]["work_us"] == 1.25
