"""bench/records.py and bench/report.py on made-up rows: the tables, gains within one part, the
merge of the parts of one commit and its refusals, the Markdown rendered from a results.json."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import records  # noqa: E402
import report  # noqa: E402
from variants import VARIANTS  # noqa: E402


def row(variant: str | None, workload: str, value: float, *, part: str | None = None, peer: str | None = None,
        commit: str = "abc1234") -> dict:
    unit = "ms" if workload.startswith("prefill") else "tok/s"
    return {"shape": "S", "variant": variant, "peer": peer, "workload": workload, "value": value, "unit": unit,
            "roofline_fraction": value / 500 if unit == "tok/s" else None, "roofline_tok_s": 500.0,
            "tflops": None if unit == "tok/s" else 1.0, "peak_fraction": None if unit == "tok/s" else 0.5,
            "prompt_tokens": 1024, "new_tokens": 128 if unit == "tok/s" else 1, "note": None, "part": part,
            "config": VARIANTS.get(variant) if variant else None,
            "gpu": "G", "torch": "t", "triton": "tr", "commit": commit, "date": "2026-12-01T10:00:00+00:00",
            "copy_bandwidth_tb_s": 4.2, "matmul_peak_tflops": 780.0}


def test_cuda_graph_table_gives_each_rows_gain():
    rows = [row("eager", report.GRAPH_WORKLOAD, 100.0), row("no-pipelining", report.GRAPH_WORKLOAD, 300.0),
            row("default", report.GRAPH_WORKLOAD, 450.0), row("eager-per-op", report.GRAPH_WORKLOAD, 50.0)]
    table = report.tables(rows).split("### CUDA graphs")[1]
    assert "| fused | CUDA graphs | no-pipelining | 300 tok/s (60.0%) | x3.00 |" in table
    assert "| fused | CUDA graphs + pipelined | default | 450 tok/s (90.0%) | x1.50 |" in table
    assert "| one kernel per op | eager | eager-per-op | 50.0 tok/s (10.0%) |  |" in table
    assert "no-fused-kernels" not in table  # rows not measured are left out


def test_gains_divide_by_the_default_of_the_same_part_and_only_that():
    rows = records.combine({
        "part1": [row("default", "prefill1024", 10.0), row("torch-matmul", "prefill1024", 9.0),
                  row("no-pipelining", report.GRAPH_WORKLOAD, 300.0), row("default", report.GRAPH_WORKLOAD, 450.0),
                  row("reference", "prefill1024", 40.0)],
        "part2": [row("default", "prefill1024", 20.0), row(None, "prefill1024", 30.0, peer="hf-sdpa"),
                  row("eager", report.GRAPH_WORKLOAD, 100.0)],
        "part3": [row("int8", "prefill1024", 80.0)]})
    assert {r["part"] for r in rows} == {"part1", "part2", "part3"}
    text = report.tables(rows)
    summary, ablation = text.split("### Summary")[1].split("### Ablation")
    assert "| default | 10.0 ms, 1.00 TFLOP/s (50.0%) |" in summary  # the part that measured most variants
    assert "| torch-matmul | options.triton.matmul=torch options.triton.fuse_epilogue=false | 9.00 ms x0.90 |" in ablation
    assert "| reference | reference | 40.0 ms x4.00 |" in ablation
    assert "| int8 | quantize=int8 | 80.0 ms |" in ablation  # its part measured no default
    graphs, peers = text.split("### CUDA graphs")[1].split("### Peers")
    assert "| fused | CUDA graphs | no-pipelining | 300 tok/s (60.0%) |  |" in graphs  # eager is in another part
    assert "| default (part2) | 20.0 ms |" in peers and "| hf-sdpa | 30.0 ms x1.50 |" in peers
    assert "†" not in text


def test_combine_refuses_parts_of_different_commits_and_rows_measured_twice():
    with pytest.raises(records.CombineError, match="one commit"):
        records.combine({"a": [row("default", "prefill1024", 1.0)],
                         "b": [row("default", "prefill1024", 1.0, commit="def5678")]})
    with pytest.raises(records.CombineError, match="one commit"):
        records.combine({"a": [row("default", "prefill1024", 1.0, commit=None)]})
    with pytest.raises(records.CombineError, match="S/eager/prefill1024 is in part a and part b"):
        records.combine({"a": [row("eager", "prefill1024", 1.0)], "b": [row("eager", "prefill1024", 2.0)]})
    with pytest.raises(records.CombineError, match="the results holds rows of 2 runs"):
        records.check_one_matrix([row("default", "prefill1024", 1.0), {**row("eager", "prefill1024", 1.0), "date": "d"}])


def test_merge_writes_one_matrix_from_scratch_and_render_redraws_it(tmp_path, capsys):
    for part, rows in {"part1": [row("default", "prefill1024", 10.0), row("eager", "prefill1024", 20.0)],
                       "part2": [row("default", "prefill1024", 12.0), row(None, "prefill1024", 30.0, peer="hf-sdpa")]
                       }.items():
        (tmp_path / part).mkdir()
        (tmp_path / part / "results.json").write_text(json.dumps(rows))
    out = tmp_path / "out"
    out.mkdir()
    (out / "results.json").write_text(json.dumps([row("reference", "prefill1024", 1.0, commit="old")]))
    assert report.main(["--merge", str(tmp_path / "part1"), str(tmp_path / "part2"), "--out", str(out)]) == 0
    merged = json.loads((out / "results.json").read_text())
    assert [(r["variant"] or r["peer"], r["part"]) for r in merged] == [
        ("default", "part1"), ("eager", "part1"), ("default", "part2"), ("hf-sdpa", "part2")]
    assert "rows of the full matrix were not measured" in capsys.readouterr().err
    (out / "results.md").unlink()
    assert report.main(["--render", str(out)]) == 0
    md = (out / "results.md").read_text()
    assert md.startswith("# tileinfer benchmark: G\n\ncommit abc1234")
    assert "- part1: 2026-12-01T10:00:00+00:00, copy bandwidth 4.2 TB/s" in md and "- part2: " in md
    assert "| eager | eager | 20.0 ms x2.00 |" in md and "| hf-sdpa | 30.0 ms x2.50 |" in md
    assert report.main(["--merge", str(tmp_path / "nowhere"), "--out", str(out)]) == 2
    assert "results.json not found" in capsys.readouterr().err


def test_the_chart_is_skipped_with_a_notice_without_matplotlib(tmp_path, monkeypatch, capsys):
    import chart

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    assert chart.plot([row("default", "prefill1024", 10.0)], tmp_path / "results.png") is False
    out = capsys.readouterr().out
    assert out.startswith("notice: matplotlib is not installed") and out.count("\n") == 1
    assert not (tmp_path / "results.png").exists()
