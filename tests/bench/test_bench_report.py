"""bench/records.py and bench/report.py on made-up records: the store, each table from the newest
commit that has every row of it, gains within one run, the Markdown written exactly, --add."""

from __future__ import annotations

import json
import sys

import pytest

from bench import matrix_tables, records, report
from bench.__main__ import main as bench
from bench.workloads import VARIANTS

VERSIONS = {"torch": "2.13.0+cu130", "triton": "3.6.0", "cuda": "13.0", "gpu": "G"}


def row(variant: str | None, workload: str, value: float | None, *, peer: str | None = None, commit: str = "abc1234",
        date: str = "2026-12-01T10:00:00+00:00", shape: str = "S", note: str | None = None) -> dict:
    unit = "ms" if workload.startswith("prefill") else "tok/s"
    return {"kind": "matrix", "commit": commit, "date": date, "versions": VERSIONS, "shape": shape,
            "variant": variant, "peer": peer, "workload": workload, "value": value, "unit": unit, "samples": [],
            "note": note, "roofline_tok_s": 500.0,
            "roofline_fraction": value / 500 if value and unit == "tok/s" else None,
            "tflops": 1.0 if value and unit == "ms" else None, "peak_fraction": 0.5 if value and unit == "ms" else None,
            "prompt_tokens": 1024, "new_tokens": 128 if unit == "tok/s" else 1, "kv_capacity": None,
            "config": VARIANTS.get(variant) if variant else None, "part": None,
            "copy_bandwidth_tb_s": 4.2, "matmul_peak_tflops": 780.0}


def test_a_run_appends_each_record_with_its_commit_date_and_versions(tmp_path):
    run = records.Run("cpu", commit="abc1234", path=tmp_path / "m" / "records.jsonl")
    first = run.add("step", value=1.5)
    run.add("step", value=2.5)
    loaded = records.load(tmp_path / "m" / "records.jsonl")
    assert loaded == run.records and [r["value"] for r in loaded] == [1.5, 2.5]
    assert first["kind"] == "step" and first["commit"] == "abc1234" and loaded[0]["date"] == loaded[1]["date"]
    assert set(first["versions"]) == {"torch", "triton", "cuda", "gpu"} and first["versions"]["gpu"] is None
    assert records.machine("NVIDIA H200") == "NVIDIA-H200" and records.machine(None) == "cpu"
    with pytest.raises(ValueError):  # a record is strict JSON
        run.add("step", value=float("nan"))


def test_gains_divide_by_the_default_of_the_same_run_and_only_that():
    late = "2026-12-01T11:00:00+00:00"
    rows = [row("default", "prefill1024", 10.0), row("torch-matmul", "prefill1024", 9.0),
            row("no-pipelining", "decode128_ctx1024", 300.0), row("default", "decode128_ctx1024", 450.0),
            row("reference", "prefill1024", 40.0),
            row("default", "prefill1024", 20.0, date=late), row(None, "prefill1024", 30.0, peer="hf-sdpa", date=late),
            row("eager", "decode128_ctx1024", 100.0, date=late), row("int8", "prefill1024", 80.0, date="d3")]
    summary = matrix_tables.summary_table(rows)
    assert "| default | 10.0 ms, 1.00 TFLOP/s (50.0%) | 450 tok/s (90.0%) |" in summary  # the run of most variants
    ablation = matrix_tables.ablation_table(rows)
    torch_matmul = "| torch-matmul | options.triton.matmul=torch options.triton.fuse_epilogue=false | 9.00 ms x0.90 |"
    assert torch_matmul in ablation
    assert "| reference | reference | 40.0 ms x4.00 |  |" in ablation
    assert "| int8 | quantize=int8 | 80.0 ms |  |" in ablation  # its run measured no default
    assert "| eager | eager |  | 100 tok/s |" in ablation  # its run's default has no decode row
    graphs = matrix_tables.graphs_table(rows)
    assert "| fused | CUDA graphs | no-pipelining | 300 tok/s (60.0%) |  |" in graphs  # eager is in another run
    assert "| fused | CUDA graphs + pipelined | default | 450 tok/s (90.0%) | x1.50 |" in graphs
    peers = matrix_tables.peers_table(rows)
    assert f"| default ({late}) | 20.0 ms |  |" in peers and "| hf-sdpa | 30.0 ms x1.50 |  |" in peers
    assert "Not measured (no record of this commit): hf-static-compile, engine-compiled," in peers
    headline = matrix_tables.headline_table(rows)
    assert "| torch-matmul | 9.00 ms, 1.00 TFLOP/s (50.0%) x0.90 |  |" in headline
    assert "| hf-sdpa | 30.0 ms, 1.00 TFLOP/s (50.0%) x1.50 |  |" in headline  # over its own run's default


def test_each_table_comes_from_the_newest_commit_that_has_every_row():
    graph = next(t for t in matrix_tables.tables() if "CUDA graphs" in t.title)  # the chain of decode128_ctx1024
    chain = [v for _, c in matrix_tables.GRAPH_TABLE for v in c]
    full = [row(v, "decode128_ctx1024", 100.0 + i, commit="old", date="2026-11-01T00:00:00+00:00", shape="Qwen3-4B")
            for i, v in enumerate(chain)]
    newer = [row(v, "decode128_ctx1024", 200.0, commit="new", date="2026-12-01T00:00:00+00:00", shape="Qwen3-4B")
             for v in chain[1:]]
    chosen, lacks = report.choose(full + newer, graph, "Qwen3-4B")
    assert {r["commit"] for r in chosen} == {"old"} and lacks == ""
    newest = newer + [row("eager", "decode128_ctx1024", 1.0, commit="new", date="2026-12-02T00:00:00+00:00",
                          shape="Qwen3-4B")]
    chosen, _ = report.choose(full + newest, graph, "Qwen3-4B")
    assert {r["commit"] for r in chosen} == {"new"}  # complete over two runs of one commit
    chosen, lacks = report.choose(newer, graph, "Qwen3-4B")
    assert chosen is None and lacks == "the newest, new, lacks 1 (eager/decode128_ctx1024)"


def test_the_report_is_written_from_the_stores_alone(tmp_path, capsys):
    store = tmp_path / "G" / "records.jsonl"
    records.append(store, [row("eager", "decode128_ctx1024", 100.0), row("no-pipelining", "decode128_ctx1024", 300.0),
                           row("default", "decode128_ctx1024", 450.0)])
    out = tmp_path / "performance.md"
    assert bench(["report", "--stores", str(store), "--out", str(out), "--no-charts"]) == 0
    text = out.read_text()
    assert text.startswith("# Performance tables\n\nGenerated by `python -m bench report`")
    graphs = text.split("### S: CUDA graphs (decode128_ctx1024)\n\n")[1].split("\n\n### ")[0].rstrip("\n")
    assert graphs == (
        "Commit abc1234, run of 2026-12-01T10:00:00+00:00; torch 2.13.0+cu130, triton 3.6.0, CUDA 13.0, G.\n\n"
        "| kernels | decode steps | variant | tok/s | gain |\n|---|---|---|---|---|\n"
        "| fused | eager | eager | 100 tok/s (20.0%) |  |\n"
        "| fused | CUDA graphs | no-pipelining | 300 tok/s (60.0%) | x3.00 |\n"
        "| fused | CUDA graphs + pipelined | default | 450 tok/s (90.0%) | x1.50 |\n\n"
        "gain: over the row above, blank across runs.")
    assert bench(["report", "--stores", str(store), "--out", str(tmp_path / "again.md"), "--no-charts"]) == 0
    assert (tmp_path / "again.md").read_text() == text
    assert bench(["report", "--stores", str(tmp_path / "none.jsonl"), "--out", str(out)]) == 2
    assert "error: no records at" in capsys.readouterr().err


def test_a_tables_notices_follow_it_once_each_with_their_variants():
    """What a figure stands for where the engine fell back: the notices of a table's records under
    it, each once, naming the variants whose runs gave it."""
    fell_back = "forward=persistent: KV pages stored as fp8 are not covered yet; those steps run the per-op step"
    rows = [row("default", "decode128_ctx1024", 450.0), row("eager", "decode128_ctx1024", 100.0),
            row("no-pipelining", "decode128_ctx1024", 300.0)]
    for r in rows[1:]:
        r["notices"] = [fell_back]
    rows[2]["notices"].append("options.ngram (n_max) has no effect")
    text = report.render("G", rows, matrix_tables.tables())
    graphs = text.split("### S: CUDA graphs (decode128_ctx1024)\n\n")[1].split("\n\n### ")[0]
    assert graphs.endswith("gain: over the row above, blank across runs.\n\n"
                           f"Notice while measuring eager, no-pipelining: {fell_back}\n\n"
                           "Notice while measuring no-pipelining: options.ngram (n_max) has no effect")
    assert report.notices([row("default", "decode128_ctx1024", 450.0)]) == ""


def test_add_appends_only_the_records_not_already_there(tmp_path, monkeypatch):
    monkeypatch.setattr(records, "RESULTS", tmp_path / "results")
    came_back = tmp_path / "records.jsonl"
    records.append(came_back, [row("default", "prefill1024", 10.0), row("eager", "prefill1024", 12.0)])
    assert report.add([came_back]) == 2 and report.add([came_back]) == 0
    assert [json.loads(line)["variant"] for line in (tmp_path / "results" / "G" / "records.jsonl").open()] == [
        "default", "eager"]


def test_the_chart_is_skipped_with_a_notice_without_matplotlib(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    store = tmp_path / "G" / "records.jsonl"
    records.append(store, [row("default", "decode128_ctx1024", 450.0)])
    assert report.charts([store]) == []
    out = capsys.readouterr().out
    assert out.startswith("notice: matplotlib is not installed") and out.count("\n") == 1
    assert not list(tmp_path.rglob("*.png"))


def test_the_committed_tables_are_the_report_of_the_committed_records():
    """docs/performance.md is regenerated with the records it comes from (python -m bench report)."""
    stores = sorted(records.RESULTS.glob("*/records.jsonl"))
    assert [s.parent.name for s in stores] == ["NVIDIA-H100-80GB-HBM3", "NVIDIA-H200", "cpu"]
    assert report.OUT.read_text() == report.report(stores)
