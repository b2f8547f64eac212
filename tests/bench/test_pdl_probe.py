"""bench/pdl_probe.py on the CPU: every variant and token count gives a timed row (the figures of a
CPU say nothing; only that each variant's step ran)."""

from __future__ import annotations

import json
import math

import pytest
import torch

from conftest import load_script


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU smoke of the script")
def test_every_variant_gives_a_row(tmp_path):
    probe = load_script("bench/pdl_probe.py", "tileinfer_bench_pdl_probe")
    out = tmp_path / "probe.json"
    rows = probe.main(["--tokens", "1,3", "--context", "16", "--repeats", "1", "--out", str(out),
                       "--checkpoints", str(tmp_path / "ckpt")])
    assert [(r["variant"], r["tokens"]) for r in rows] == [(v, t) for v in probe.VARIANTS for t in (1, 3)]
    assert all(r["shape"] == "tiny" and math.isfinite(r["ms"]) and r["ms"] > 0 for r in rows)
    assert json.loads(out.read_text()) == rows
