"""The prefill attention's candidates compile for an H100/H200 (sm_90) on any machine, each as what it
claims to be: a Triton build can drop a request silently (a ``tl.range(..., warp_specialize=True)``
loop Triton 3.6 cannot specialize is built as a plain loop: at 8 warps, or with a second key loop
after it), so the build's own figures are checked, through ``compile_prefill`` of
bench/kernels/paged_attention_build.py (Qwen3-4B's shape, bf16 pages of 64, a 4,096-token chunk,
the launch's own specialization): every candidate multiplies with warpgroup MMAs (HGMMA, no
mma.sync) and spills nothing; the rule's K/V tiles arrive by cp.async (LDGSTS); a TMA candidate's
by TMA (UTMALDG) and no cp.async; the warp-specialized candidate runs 12 warps in Triton's
partitions (causal and not). Runs in a subprocess: this test session imported the kernels under
TRITON_INTERPRET=1."""

from __future__ import annotations

from pathlib import Path

from ..kernel_checks import compiled_results

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = f'''
import concurrent.futures, json, sys
sys.path.insert(0, {str(ROOT)!r})
from bench.kernels.paged_attention_build import compile_prefill

JOBS = [("rule", True), ("rule+tma", True), ("128x64+tma", True), ("ws128x64", True), ("ws128x64", False)]
if __name__ == "__main__":
    with concurrent.futures.ProcessPoolExecutor(max_workers=2) as pool:
        print(json.dumps(list(pool.map(compile_prefill, *zip(*JOBS)))))
'''


def test_candidates_build_as_they_claim(tmp_path):
    results = {(r["candidate"], r["causal"]): r for r in compiled_results(SCRIPT, tmp_path / "compile_prefill.py")}
    for key, r in results.items():
        copies = r["loads"]
        assert r["hgmma"] and not r["hmma"], (key, r)
        assert r["spill_stores"] == 0, (key, r)
        tma = key[0] != "rule"
        assert bool(copies.get("UTMALDG.2D")) == tma, (key, copies)
        assert any(op.startswith("LDGSTS") for op in copies) != tma, (key, copies)
        ws = key[0].startswith("ws")
        assert r["warp_specialized"] == ws, (key, r)
        assert r["warps"] == (12 if ws else r["requested_warps"]), (key, r)
    assert results[("rule", True)]["programs_per_sm"] == 2
