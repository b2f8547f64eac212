"""The persistent step's kernel compiles for an H100/H200 (sm_90) on any machine, with Triton's own
compiler, and loads its weights and KV pages in 16-byte vectors: no global load narrower than 32
bits (a bfloat16 or int8 element at a time, what it compiled to while the pointer table's
addresses carried no alignment). Qwen3-4B shapes (hidden 2,560, 32 q heads, 8 kv heads,
head_dim 128, intermediate 9,728, pages of 64), the default tiles, with the specialization a
launch gives it (pointers and strides multiples of 16); BF16 weights with BF16 pages, INT8
weights with INT8 pages. Runs in a subprocess: this test session imported the kernels under
TRITON_INTERPRET=1."""

from __future__ import annotations

import re

from ..kernel_checks import compiled_results

SCRIPT = r'''
import collections, inspect, json, re
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from tileinfer.backends.triton import persistent as P
from tileinfer.backends.triton.persistent_plan import StepShape

SHAPE = StepShape(hidden=2560, heads=32, kv_heads=8, head_dim=128, intermediate=9728, vocab=151936, layers=36,
                  page_size=64)


def compile_step(int8: bool):
    kernel = P._persistent_step_kernel
    names = list(inspect.signature(kernel.fn).parameters)
    s = SHAPE
    consts = dict(HIDDEN=s.hidden, H=s.heads, HKV=s.kv_heads, D=s.head_dim, INTER=s.intermediate, VOCAB=s.vocab,
                  PAGE_SIZE=s.page_size, NUM_SPLITS=s.num_splits, CHUNK=s.chunk, ATTN_BLOCK=s.attn_block,
                  BLOCK_K=s.block_k, BN_QKV=s.block_n[0], BN_O=s.block_n[1], BN_GU=s.block_n[2],
                  BN_DOWN=s.block_n[3], BN_LM=s.block_n[4], INT8=int8, LM_INT8=False, KV_INT8=int8, SMOOTH=int8,
                  DOT_F32=False, UPCAST=False, DOT_PRECISION="ieee", TIMELINE=False, STAGES=1, X_AHEAD=False)
    types = {"items_ptr": "*i32", "counters_ptr": "*i32", "layer_ptrs": "*i64", "timeline_ptr": "*i64",
             "pos_ptr": "*i64", "eps": "fp32", "qk_scale": "fp32", "logits_ptr": "*fp32", "part_ptr": "*fp32",
             "stat_ptr": "*fp32", "bt_ptr": "*i32", "cos_ptr": "*fp32", "sin_ptr": "*fp32", "lm_s_ptr": "*fp32",
             "w_example_ptr": "*i8" if int8 else "*bf16"}
    sig = {n: "constexpr" if n in consts else types.get(n, "*bf16" if n.endswith("_ptr") else "i32") for n in names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names)
             if sig[n].startswith("*") or n.startswith("stride")}
    src = ASTSource(kernel, sig, constexprs={(names.index(k),): v for k, v in consts.items()}, attrs=attrs)
    ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                         options=dict(num_warps=4, num_stages=1, enable_fp_fusion=False)).asm["ptx"]
    loads = collections.Counter(m.group(0) for m in re.finditer(r"\bld\.global[.\w:]*", ptx))
    return dict(int8=int8, loads=dict(loads))


print(json.dumps([compile_step(False), compile_step(True)]))
'''


def test_weights_and_pages_load_in_16_byte_vectors(tmp_path):
    for result in compiled_results(SCRIPT, tmp_path / "compile_persistent.py"):
        loads = result["loads"]
        narrow = {op: n for op, n in loads.items() if re.search(r"\.[bsu](8|16)$", op)}
        assert not narrow, result
        weights = sum(n for op, n in loads.items() if "evict_first" in op)
        vectors = sum(n for op, n in loads.items() if "evict_first" in op and ".v4." in op)
        assert weights > 0 and vectors == weights, result  # every weight load is a 16-byte vector
