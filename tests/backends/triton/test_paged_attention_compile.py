"""The prefill attention's tile shapes compile for an H100/H200 (sm_90) on any machine as the kernel
means them to, read from the build's own figures through ``compile_prefill`` of
bench/kernels/paged_attention_build.py (Qwen3-4B's shape, bf16 pages of 64, a 4,096-token chunk,
the launch's own specialization): every shape multiplies with warpgroup MMAs (HGMMA, no mma.sync),
spills nothing, streams its K/V tiles by cp.async (LDGSTS) and runs the warps it launches; at a
4,096-token chunk (16,384 query rows) the rule's tiles are 128x64's, one program a multiprocessor. Runs in a subprocess: this test session
imported the kernels under TRITON_INTERPRET=1."""

from __future__ import annotations

from pathlib import Path

from ..kernel_checks import compiled_results

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = f'''
import concurrent.futures, json, sys
sys.path.insert(0, {str(ROOT)!r})
from bench.kernels.paged_attention_build import compile_prefill

JOBS = [("rule", True), ("rule", False), ("128x64", True), ("128x128", True)]
if __name__ == "__main__":
    with concurrent.futures.ProcessPoolExecutor(max_workers=2) as pool:
        print(json.dumps(list(pool.map(compile_prefill, *zip(*JOBS)))))
'''


def test_shapes_build_as_the_kernel_means_them(tmp_path):
    results = {(r["candidate"], r["causal"]): r for r in compiled_results(SCRIPT, tmp_path / "compile_prefill.py")}
    assert len(results) == 4
    for key, r in results.items():
        assert r["hgmma"] and not r["hmma"], (key, r)
        assert r["spill_stores"] == 0, (key, r)
        assert any(op.startswith("LDGSTS") for op in r["loads"]), (key, r["loads"])
        assert r["warps"] == r["requested_warps"], (key, r)
    assert results[("rule", True)]["tiles"] == results[("128x64", True)]["tiles"]
    assert results[("rule", True)]["programs_per_sm"] == 1
