"""The persistent step's kernel compiles for an H100/H200 (sm_90) on any machine, with Triton's own
compiler, and loads its weights and KV pages in 16-byte vectors: no global load or store narrower
than 32 bits (a bfloat16 or int8 element at a time: what a load through an address read from the
pointer table compiles to unless the address is marked 16-byte aligned). Qwen3-4B shapes and the
default options, through ``bench.persistent_build.compile_step`` (the specialization a launch
gives it: pointers and strides multiples of 16); BF16 weights with BF16 pages, INT8 weights with
INT8 pages, and the build whose items are calls capped at 128 registers (4 programs a
multiprocessor). Runs in a subprocess: this test session imported the kernels under TRITON_INTERPRET=1."""

from __future__ import annotations

from pathlib import Path

from ..kernel_checks import compiled_results

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = f'''
import json, sys
sys.path.insert(0, {str(ROOT)!r})
from bench.persistent_build import compile_step
print(json.dumps([compile_step("Qwen3-4B"), compile_step("Qwen3-4B", int8=True, kv_int8=True),
                  compile_step("Qwen3-4B", item_calls=True, max_registers=128)]))
'''


def test_weights_and_pages_load_in_16_byte_vectors(tmp_path):
    from bench.persistent_build import narrow

    for result in compiled_results(SCRIPT, tmp_path / "compile_persistent.py"):
        memory = result["global_memory"]
        assert not narrow(memory), result
        weights = {op: n for op, n in memory.items() if op.startswith("LDG.E.EF")}  # evict-first: the weights
        assert weights and all(op.endswith(".128") for op in weights), result
        assert result["spill_stores"] <= 256 and result["programs_per_sm"] >= 2, result
