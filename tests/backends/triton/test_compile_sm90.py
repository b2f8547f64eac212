"""The GEMV kernels compile for an H100/H200 (sm_90) on any machine, with Triton's own compiler
(ptxas included in its wheel), no GPU needed. The interpreter that the other CPU tests use runs
Python semantics, so code that only the compiler rejects (a constexpr branch with an early
return; shapes that disagree in a branch the interpreter never takes) would otherwise first fail on
the GPU. The PTX must hold the grid dependency instructions exactly when PDL is on. Runs in a
subprocess: this test session imported the kernels under TRITON_INTERPRET=1."""

from __future__ import annotations

import json
import os
import subprocess
import sys

SCRIPT = r'''
import inspect, itertools, json
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from tileinfer.backends.triton import linear as L

def compile_sm90(kernel, constexprs, ptr_type, num_warps, num_stages):
    names = list(inspect.signature(kernel.fn).parameters)
    signature = {n: "constexpr" if n in constexprs else (ptr_type if n.endswith("_ptr") else "i32") for n in names}
    src = ASTSource(kernel, signature, constexprs={(names.index(k),): v for k, v in constexprs.items()})
    options = dict(num_warps=num_warps, num_stages=num_stages)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options).asm["ptx"]

results = []
for use_dot, swiglu, pdl, even_k in itertools.product([False, True], repeat=4):
    cfg = L.gemv_config(2560, 4096, 16 if use_dot else 1)
    consts = dict(BLOCK_T=L.GEMV_BLOCK_T if use_dot else 1, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
                  USE_DOT=use_dot, SWIGLU=swiglu, DOT_F32=False, EVEN_K=even_k, PDL=pdl)
    ptx = compile_sm90(L._gemv_kernel, consts, "*bf16", cfg.num_warps, cfg.num_stages)
    results.append(dict(kernel="gemv", consts=consts, wait="griddepcontrol.wait" in ptx,
                        launch="griddepcontrol.launch_dependents" in ptx))
for swiglu, pdl in itertools.product([False, True], repeat=2):
    consts = dict(SPLIT_K=4, BLOCK=L.REDUCE_BLOCK, SWIGLU=swiglu, PDL=pdl)
    ptx = compile_sm90(L._splitk_reduce_kernel, consts, "*fp32", 4, 1)
    results.append(dict(kernel="reduce", consts=consts, wait="griddepcontrol.wait" in ptx,
                        launch="griddepcontrol.launch_dependents" in ptx))
print(json.dumps(results))
'''


def test_gemv_kernels_compile_for_sm90():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(results) == 20
    for r in results:
        pdl = r["consts"]["PDL"]
        assert r["wait"] == pdl and r["launch"] == pdl, r
