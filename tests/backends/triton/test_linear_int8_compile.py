"""The W8A16 kernels compile for an H100/H200 (sm_90) on any machine (Triton's compiler and its
ptxas, no GPU), at the rule's tiles for the Qwen3-4B layers, with pointers and strides 16-byte
aligned as Triton specializes them at launch: the weight tiles are read with 16-byte vector loads;
the conversion on bit patterns issues no int -> float conversion instruction (Triton's plain cast
does); the T = 1 GEMV needs no more registers than the BF16 GEMV's tile, and no kernel spills; with PDL
the first weight load comes before the grid dependency wait and the wait before any store. Runs in
a subprocess: this session imported the kernels under TRITON_INTERPRET=1."""

from __future__ import annotations

from ..kernel_checks import compiled_results

SCRIPT = r'''
import inspect, json, os, re, subprocess, sys, tempfile
import triton
from triton.backends.compiler import GPUTarget
from triton.backends.nvidia.compiler import get_ptxas
from triton.compiler import ASTSource

from tileinfer.backends.triton import linear_gemv as B
from tileinfer.backends.triton import linear_int8_gemm as M
from tileinfer.backends.triton import linear_int8_gemv as G


def compile_ptx(kernel, consts, types, warps, stages):
    names = list(inspect.signature(kernel.fn).parameters)
    sig = {n: "constexpr" if n in consts else types.get(n, "*bf16" if n.endswith("_ptr") else "i32") for n in names}
    aligned = [n for n in names if n not in consts and (n.endswith("_ptr") or n.startswith("stride_") or n in "KN")]
    src = ASTSource(kernel, sig, constexprs={(names.index(k),): v for k, v in consts.items()},
                    attrs={(names.index(n),): [["tt.divisibility", 16]] for n in aligned})
    opts = dict(num_warps=warps, num_stages=stages, enable_fp_fusion=True)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=opts).asm["ptx"]


def registers(ptx):
    with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
        f.write(ptx)
    out = subprocess.run([get_ptxas(90).path, "-arch=sm_90a", "-v", f.name, "-o", os.devnull],
                         capture_output=True, text=True)
    info = out.stderr + out.stdout
    return int(re.search(r"Used (\d+) registers", info).group(1)), int(re.search(r"(\d+) bytes spill stores", info).group(1))


def describe(name, ptx, **extra):
    body = ptx[ptx.index(".entry"):]
    wait = body.find("griddepcontrol.wait")
    store = re.search(r"\bst\.global", body)
    regs, spills = registers(ptx)
    return dict(name=name, regs=regs, spills=spills, v4_loads=len(re.findall(r"ld\.global[^\n]*\.v4\.b32", body)),
                cp_async=body.count("cp.async.cg.shared.global"),
                i2f=sorted(set(re.findall(r"cvt\.rn\.(?:f32|f16|bf16)\.s(?:8|16|32)", body))),
                waits=body.count("griddepcontrol.wait"),
                loads_before_wait=len(re.findall(r"\bld\.global", body[:wait])) if wait >= 0 else 0,
                wait_before_store=store is None or 0 <= wait < store.start(), **extra)


out = []
int8 = {"w_ptr": "*i8", "s_ptr": "*fp32", "eps": "fp32", "lock_ptr": "*i32"}
for T in (1, 16):
    for n, k in ((151936, 2560), (2560, 9728), (19456, 2560)):
        cfg = G.gemv_int8_config(n, k, T)
        for bits, pdl, swiglu, norm in ((True, True, False, False), (False, False, False, False),
                                        (True, True, True, True), (True, False, False, False)):
            consts = dict(BLOCK_T=G.GEMV_BLOCK_T if T > 1 else 1, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
                          USE_DOT=T > 1, SWIGLU=swiglu, DOT_F32=False, EVEN_K=True, PDL=pdl, NORM=norm,
                          NORM_K=k if norm else 0, NORM_HALF=1024 if norm else 1, RESIDUAL=False, BITS=bits,
                          FUSED_REDUCE=False, LATE_LAUNCH=cfg.late_launch)
            ptx = compile_ptx(G._gemv_int8_kernel, consts, int8, cfg.num_warps, cfg.num_stages)
            out.append(describe("gemv", ptx, T=T, shape=[n, k], bits=bits, pdl=pdl, plain=not (swiglu or norm)))
bcfg = B.gemv_config(151936, 2560, 1)
consts = dict(BLOCK_T=1, BLOCK_N=bcfg.block_n, BLOCK_K=bcfg.block_k, USE_DOT=False, SWIGLU=False, DOT_F32=False,
              EVEN_K=True, PDL=True, NORM=False, NORM_K=0, NORM_HALF=1, RESIDUAL=False, FUSED_REDUCE=False,
              LATE_LAUNCH=bcfg.late_launch)
out.append(describe("bf16_gemv", compile_ptx(B._gemv_kernel, consts, {"eps": "fp32", "lock_ptr": "*i32"},
                                             bcfg.num_warps, bcfg.num_stages)))
for swiglu in (False, True):
    for swap in (False, True):
        cfg = M.gemm_int8_config(1024, 19456, 2560)
        consts = dict(BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m,
                      SWIGLU=swiglu, DOT_F32=False, EVEN_K=True, RESIDUAL=not swiglu, BITS=True, SWAP_AB=swap)
        ptx = compile_ptx(M._gemm_int8_kernel, consts, int8, cfg.num_warps, cfg.num_stages)
        out.append(describe("gemm", ptx, bits=True, pdl=False, swap=swap))
print(json.dumps(out))
'''


def test_int8_kernels_compile_for_sm90(tmp_path):
    results = compiled_results(SCRIPT, tmp_path / "compile_int8.py")
    bf16 = next(r for r in results if r["name"] == "bf16_gemv")
    assert len(results) == 29
    for r in results:
        assert r["spills"] == 0, r
        if r["name"] == "bf16_gemv":
            continue
        assert r["v4_loads"] + r["cp_async"] > 0, r  # 16-byte weight loads (the pipelined GEMM: cp.async)
        assert (r["i2f"] == []) == r["bits"] or r["name"] == "gemv" and r["T"] > 1 and not r["bits"], r
        if r["name"] == "gemv" and r["T"] == 1 and r["plain"]:
            # the lm_head's 8-row tile holds 64 float32 partial sums a thread, twice the BF16 tile's;
            # <= 128 registers keeps >= 8 programs of 2 warps resident per SM
            assert r["regs"] <= max(bf16["regs"], 128), (r, bf16["regs"])
        if r["pdl"]:
            assert r["waits"] >= 1 and r["loads_before_wait"] > 0 and r["wait_before_store"], r
        else:
            assert r["waits"] == 0, r
