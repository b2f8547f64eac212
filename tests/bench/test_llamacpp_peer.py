"""bench/llamacpp_peer.py records: llama-bench's JSON tests as the matrix's rows of peer llama.cpp."""

from __future__ import annotations

import json

import pytest

from conftest import load_script


def test_llama_bench_tests_become_matrix_rows(tmp_path, monkeypatch):
    peer = load_script("bench/llamacpp_peer.py", "tileinfer_bench_llamacpp_peer")
    limits_mod = load_script("bench/limits.py", "limits")
    fake = limits_mod.Limits(copy_bandwidth=4.0e12, matmul_peak=800e12, device="a test GPU")
    monkeypatch.setattr(limits_mod, "measure", lambda device: fake)
    tests = [{"n_prompt": 1024, "n_gen": 0, "n_depth": 0, "avg_ts": 32000.0, "build_commit": "abc"},
             {"n_prompt": 1024, "n_gen": 0, "n_depth": 1024, "avg_ts": 30000.0},  # not a matrix row
             {"n_prompt": 0, "n_gen": 128, "n_depth": 0, "avg_ts": 300.0, "samples_ts": [299.0, 300.0, 301.0]},
             {"n_prompt": 0, "n_gen": 128, "n_depth": 1024, "avg_ts": 280.0}]
    path = tmp_path / "Qwen3-4B.bench.json"
    path.write_text(json.dumps(tests))
    rows = peer.to_records([path], "abc1234")
    assert [(r["workload"], r["unit"]) for r in rows] == [
        ("prefill1024", "ms"), ("decode128_ctx0", "tok/s"), ("decode128_ctx1024", "tok/s")]
    assert all(r["peer"] == "llama.cpp" and r["variant"] is None and r["shape"] == "Qwen3-4B" for r in rows)
    assert rows[0]["value"] == pytest.approx(1024 / 32000 * 1e3)
    assert 0 < rows[0]["peak_fraction"] < 1 and rows[0]["tflops"] == pytest.approx(rows[0]["peak_fraction"] * 800)
    assert rows[1]["samples"] == [299.0, 300.0, 301.0]
    # the same bytes per step as our own rows: 4B BF16 is ~8 GB a step, ~500 tok/s at 4 TB/s
    assert rows[2]["roofline_fraction"] == pytest.approx(280 / rows[2]["roofline_tok_s"])
    assert 400 < rows[2]["roofline_tok_s"] < 600
    assert rows[2]["commit"] == "abc1234" and rows[2]["gpu"] == "a test GPU"
