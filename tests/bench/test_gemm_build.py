"""``python -m bench gemm-build`` and bench/sm90_build.py on the CPU: the prefill GEMM compiled for
sm_90 as ``linear`` launches it (no GPU), its record, and what the SASS shows.

- Persistent TMA candidates of the sweep (bench/kernels/linear.py's PERSISTENT_TILES) at Qwen3-4B's
  down (residual) and qkv (plain) layers, both formats: one main loop of MMAs (int8 transposed:
  their A operand read from registers; BF16: both from shared memory) fed by TMA copies, no
  spills, shared memory within an H100's, not warp-specialized (the warps launched are those
  asked for).
- The tool's record (kind ``gemm_build``) holds the figures it prints.

The builds run in a subprocess: this session imported the kernels under TRITON_INTERPRET=1."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = r'''
import json, sys
sys.path.insert(0, ROOT)
from bench.gemm_build import compile_gemm
from bench.kernels.linear import PERSISTENT_TILES

out = []
for fmt, tile in (("bf16", (128, 256, 64, 8, 3, "tma")), ("int8", (128, 128, 128, 8, 3, "tma swap"))):
    assert tile in PERSISTENT_TILES[fmt], tile
    bm, bn, bk, warps, stages, options = tile
    for layer in ("down", "qkv"):
        cfg = dict(block_m=bm, block_n=bn, block_k=bk, num_warps=warps, num_stages=stages, persistent=True,
                   tma=True, flatten=False, swap_ab="swap" in options)
        out.append(compile_gemm("Qwen3-4B", layer, 1024, int8=fmt == "int8", **cfg))
print(json.dumps(out))
'''.replace("ROOT", repr(str(ROOT)))


def no_interpreter() -> dict:
    return {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}


@pytest.fixture(scope="module")
def builds(tmp_path_factory) -> list[dict]:
    path = tmp_path_factory.mktemp("gemm_build") / "builds.py"
    path.write_text(SCRIPT)
    proc = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, env=no_interpreter(),
                          timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_persistent_tma_candidates_build_one_mma_loop_fed_by_tma(builds):
    from tileinfer.backends.triton.linear_tiles import SMEM_BYTES

    assert len(builds) == 4
    for b in builds:
        assert not b["warp_specialized"] and b["warps"] == b["requested_warps"] == 8, b
        assert b["spill_stores"] == 0 and b["shared_bytes"] <= SMEM_BYTES, b
        (loop,) = b["main_loops"]
        operand = "registers" if b["config"]["swap_ab"] else "shared"
        assert loop["hgmma"] and all(k.endswith(f"A={operand}") for k in loop["hgmma"]), loop
        assert any(op.startswith("UTMALDG") for op in loop["groups"]["copies"]), loop


def test_command_records_the_build(tmp_path):
    out = tmp_path / "records.jsonl"
    proc = subprocess.run([sys.executable, "-m", "bench", "gemm-build", "--layer", "o_proj", "--tokens", "512",
                           "--int8", "--records", str(out), "--commit", "test", "persistent=true", "tma=true"],
                          capture_output=True, text=True, env=no_interpreter(), cwd=ROOT, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (record,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert record["kind"] == "gemm_build" and record["versions"]["gpu"] is None and record["commit"] == "test"
    assert record["config"]["persistent"] and record["config"]["swap_ab"] and record["int8"]
    assert record["kernel"] == "_gemm_persistent_kernel" and record["overrides"] == {"persistent": True, "tma": True}
    (loop,) = record["main_loops"]
    assert list(loop["hgmma"]) == ["HGMMA.64x128x16.F32.BF16 A=registers"] and loop["groups"]["conversion"], loop
    assert f"{record['registers']} registers" in proc.stdout and "main loop" in proc.stdout


def test_options_are_typed_gemm_config_fields():
    from bench.gemm_build import option

    assert option("flatten=true") == ("flatten", True)
    assert option("block_n=256") == ("block_n", 256)
    for bad in ("nonsense=1", "block_n", "tma=yes"):
        with pytest.raises(ValueError):
            option(bad)


@pytest.mark.parametrize("layout,lds", [("rows", "LDS.U16"), ("fragments", "LDS.128")])
def test_the_fragments_layout_reads_a_thread_s_weights_16_bytes_at_a_time(tmp_path, layout, lds):
    """The rule's W8A16 tile at qkv (BLOCK_K 128: two K steps of 64 an iteration): on rows each thread
    reads its fragment 2 bytes at a time (16 LDS.U16 a K step of 64), on ``fragments`` 16 at a time
    (2 LDS.128), with fewer instructions a step."""
    out = tmp_path / "records.jsonl"
    proc = subprocess.run([sys.executable, "-m", "bench", "gemm-build", "--layer", "qkv", "--int8", "--int8-layout",
                           layout, "--records", str(out)], capture_output=True, text=True, env=no_interpreter(),
                          cwd=ROOT, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (record,) = [json.loads(line) for line in out.read_text().splitlines()]
    (loop,) = record["main_loops"]
    assert record["int8_layout"] == layout and f"int8 ({layout})" in proc.stdout
    loads = loop["groups"]["shared_loads"]
    steps = record["config"]["block_k"] // 64
    assert steps == 2, record["config"]
    assert loads[lds] == steps * (16 if layout == "rows" else 2) and ("LDS.U16" in loads) == (layout == "rows"), loads
    # Triton 3.6, sm_90a: 364 (fragments) and 400 (rows) an iteration of two K steps
    assert loop["instructions"] < 190 * steps if layout == "fragments" else loop["instructions"] > 190 * steps, loop
