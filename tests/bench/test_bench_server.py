"""bench/server.py and bench/generation_defaults.py on a tiny random checkpoint (CPU): the server
is really served and read over HTTP, both paths give the same replies, and the records hold
finite positive figures; the loop metrics on hand-made replies."""

from __future__ import annotations

import json
import math

import pytest

from conftest import REFERENCE_CPU, load_script

pytest.importorskip("uvicorn")  # the server's stack: installed by the [test] extra, absent on the GPU machine
server_bench = load_script("bench/server.py", "tileinfer_bench_server")
defaults = load_script("bench/generation_defaults.py", "tileinfer_bench_generation_defaults")


def positive(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x) and x > 0


def test_server_bench_runs_and_records(tiny_checkpoint, tmp_path):
    out = tmp_path / "server.json"
    overrides = [a for item in REFERENCE_CPU if not item.startswith("device=") for a in ("--override", item)]
    code = server_bench.main(["--model", str(tiny_checkpoint), "--prompts", "2", "--long-tokens", "40",
                              "--new-tokens", "6", "--repeats", "1", *overrides, "--out", str(out)])
    assert code == 0
    record = json.loads(out.read_text())
    assert record["mismatches"] == [] and record["device"] == "cpu"
    assert set(record["summary"]) == {"short", "long"}
    for kind in record["summary"].values():
        for path in ("direct", "server"):
            assert positive(kind[path]["ttft_ms"]) and positive(kind[path]["decode_tok_s"])
    assert len(record["rows"]) == 2 + 3  # two short prompts, the three held-out heads
    assert all(row["direct"]["tokens"] == row["server"]["tokens"] for row in record["rows"])


def test_loop_metrics():
    assert defaults.loops([1, 2, 3, 4] + [5, 6] * 6, 16)  # a cycle of 2 through the second half
    assert not defaults.loops(list(range(16)), 16)
    assert not defaults.loops([5, 6] * 4, 16)  # ended early (an EOS): not a loop
    assert defaults.repeated_line("    if n == 0:\n        return n\n" * 3)
    assert not defaults.repeated_line("a = 1\nb = 2\nc = 3\n")
    assert defaults.distinct_2([1, 2, 1, 2]) == 2 / 3
    assert defaults.strength({"repetition_penalty": 1.2, "frequency_penalty": 0.5}) == 0.7 or \
        math.isclose(defaults.strength({"repetition_penalty": 1.2, "frequency_penalty": 0.5}), 0.7)


def test_heldout_prompts_are_def_lines():
    prompts = defaults.heldout_prompts(5)
    assert len(prompts) == 5 and all(p.startswith("def ") and p.endswith(":") for p in prompts)
    assert defaults.README_PROMPT not in prompts
