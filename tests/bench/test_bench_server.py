"""``python -m bench server`` and the loop metrics of ``defaults`` on a tiny random checkpoint (CPU):
the server is really served and read over HTTP, both paths give the same replies, and the records
hold finite positive figures; ``--flood-mb``'s phases against the server in this process, their
records and table; the loop metrics on hand-made replies."""

from __future__ import annotations

import argparse
import math
import os

import pytest

import tileinfer
from bench import quality, records, server, server_flood
from bench.__main__ import main as bench
from conftest import REFERENCE_CPU
from tileinfer.models import prompts


def positive(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x) and x > 0


def test_server_bench_runs_and_records(tiny_checkpoint, tmp_path):
    pytest.importorskip("uvicorn")  # the server's stack: installed by the [test] extra, absent on the GPU machine
    out = tmp_path / "records.jsonl"
    overrides = [a for item in REFERENCE_CPU if not item.startswith("device=") for a in ("--override", item)]
    assert bench(["server", "--model", str(tiny_checkpoint), "--prompts", "2", "--long-tokens", "40",
                  "--new-tokens", "6", "--repeats", "1", *overrides, "--records", str(out)]) == 0
    rows = records.load(out)
    assert [(r["prompts"], r["path"]) for r in rows] == [
        ("short", "direct"), ("short", "server"), ("long", "direct"), ("long", "server")]
    for r in rows:
        assert r["kind"] == "server" and r["mismatches"] == 0 and r["model"] == tiny_checkpoint.name
        assert positive(r["ttft_ms"]) and positive(r["decode_tok_s"])
    assert [r["replies"] for r in rows] == [2, 2, 3, 3]  # two short prompts, the three held-out heads


def test_flood_phases_record_answers_latencies_and_memory(tiny_checkpoint, tmp_path, monkeypatch):
    pytest.importorskip("uvicorn")
    monkeypatch.setattr(server_flood, "SETTLE_S", 0.0)
    engine = tileinfer.Engine.from_config(overrides=REFERENCE_CPU, model=str(tiny_checkpoint), progress=False)
    out = tmp_path / "records.jsonl"
    args = argparse.Namespace(flood_mb=5, flood_requests=1, new_tokens=2, prompts=1, device="cpu", commit="abc1234",
                              records=out)
    with server.Served(engine) as url:
        server_flood.flood_run(url, os.getpid(), args)  # 5 MB: over the 4 MiB limit
    rows = records.load(out)
    assert [r["flood"] for r in rows] == list(server_flood.FLOODS)
    for r in rows:
        assert r["kind"] == "server_flood" and r["failures"] == 0 and r["model"] == tiny_checkpoint.name
        assert positive(r["latency_ms"]) and positive(r["health_ms"]) and len(r["latencies_ms"]) == 1
        assert positive(r["rss_before_mb"]) and r["rss_peak_mb"] >= r["rss_before_mb"] and positive(r["rss_after_mb"])
        assert (r["sends"] == 0) == (r["flood"] == "none") and sum(r["statuses"].values()) == r["sends"]
        assert set(r["statuses"]) <= {"413", "reset", "closed"}  # refused, never served
        assert (r["added_ms"] is None) == (r["flood"] == "none")
    assert "| chunked |" in server_flood.flood_render(rows)


def test_loop_metrics():
    assert quality.loops([1, 2, 3, 4] + [5, 6] * 6, 16)  # a cycle of 2 through the second half
    assert not quality.loops(list(range(16)), 16)
    assert not quality.loops([5, 6] * 4, 16)  # ended early (an EOS): not a loop
    assert quality.repeated_line("    if n == 0:\n        return n\n" * 3)
    assert not quality.repeated_line("a = 1\nb = 2\nc = 3\n")
    assert quality.distinct_2([1, 2, 1, 2]) == 2 / 3
    assert math.isclose(quality.strength({"repetition_penalty": 1.2, "frequency_penalty": 0.5}), 0.7)


def test_heldout_prompts_are_def_lines():
    lines = prompts.def_lines(5, exclude=quality.README_PROMPT)
    assert len(lines) == 5 and all(p.startswith("def ") and p.endswith(":") for p in lines)
    assert quality.README_PROMPT not in prompts.def_lines(1000, exclude=quality.README_PROMPT)
