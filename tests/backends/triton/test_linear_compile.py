"""The linear's kernels compile for an H100/H200 (sm_90) on any machine (Triton's compiler and its
ptxas, no GPU), with pointers and strides 16-byte aligned as Triton specializes them at launch.

- The GEMV and the GEMM with int8 weights, at the rule's tiles for the Qwen3-4B layers: the weight
  tiles are read with 16-byte vector loads; the conversion on bit patterns issues no int -> float
  conversion instruction (Triton's plain cast does); the T = 1 GEMV needs no more registers than
  the model-dtype GEMV's tile, and no kernel spills; with PDL the first weight load comes before the
  grid dependency wait and the wait before any store.
- The persistent GEMM (linear_gemm_persistent.py) in the forms the sweep times
  (bench/kernels/linear.py): model dtype and int8 (transposed or not), plain, SwiGLU, residual,
  float32 logits, with TMA descriptors or pointers, a flattened tile loop, a split tail. Every
  variant: no register spills, the tensor cores' wgmma; TMA variants load through
  ``cp.async.bulk.tensor`` and pointer variants through ``cp.async`` (the pipeliner's shared-memory
  staging, int8 tiles included); the int8 conversion on bit patterns issues no int -> float
  conversion instruction; split variants count their units with a gpu-scope acquire-release atomic
  after a CTA barrier and read the other programs' partials past L1 (``ld.global.cg``), the others
  have no atomic.

Both compile in one subprocess: this session imported the kernels under TRITON_INTERPRET=1."""

from __future__ import annotations

from pathlib import Path

import pytest

from ..kernel_checks import compiled_results

GEMV_GEMM_SCRIPT = r'''
import inspect, json, os, re, subprocess, sys, tempfile
import triton
from triton.backends.compiler import GPUTarget
from triton.backends.nvidia.compiler import get_ptxas
from triton.compiler import ASTSource

from tileinfer.backends.triton import linear_gemm as M
from tileinfer.backends.triton import linear_gemv as G
from tileinfer.backends.triton.linear_tiles import gemm_config, gemv_config


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
int8 = {"w_ptr": "*i8", "s_ptr": "*fp32", "lock_ptr": "*i32"}
for T in (1, 16):
    for n, k in ((151936, 2560), (2560, 9728), (19456, 2560)):
        cfg = gemv_config(n, k, T, int8=True)
        # the bit conversion with PDL (plain and SwiGLU); Triton's cast without PDL (no wait)
        for bits, pdl, swiglu in ((True, True, False), (False, False, False), (True, True, True)):
            consts = dict(BLOCK_T=G.GEMV_BLOCK_T if T > 1 else 1, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
                          USE_DOT=T > 1, SWIGLU=swiglu, DOT_F32=False, EVEN_K=True, PDL=pdl, RESIDUAL=False,
                          FUSED_REDUCE=False, LATE_LAUNCH=cfg.late_launch, INT8=True, BITS=bits,
                          FRAG=False)
            ptx = compile_ptx(G._gemv_kernel, consts, int8, cfg.num_warps, cfg.num_stages)
            out.append(describe("gemv", ptx, T=T, shape=[n, k], bits=bits, pdl=pdl, plain=not swiglu))
bcfg = gemv_config(151936, 2560, 1)
consts = dict(BLOCK_T=1, BLOCK_N=bcfg.block_n, BLOCK_K=bcfg.block_k, USE_DOT=False, SWIGLU=False, DOT_F32=False,
              EVEN_K=True, PDL=True, RESIDUAL=False, FUSED_REDUCE=False, LATE_LAUNCH=bcfg.late_launch, INT8=False,
              BITS=True, FRAG=False)
out.append(describe("bf16_gemv", compile_ptx(G._gemv_kernel, consts, {"lock_ptr": "*i32"}, bcfg.num_warps,
                                             bcfg.num_stages)))
for swiglu, swap in ((False, False), (True, True)):  # each epilogue, each operand order
    cfg = gemm_config(1024, 19456, 2560, int8=True)
    consts = dict(BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m,
                  SWIGLU=swiglu, DOT_F32=False, EVEN_K=True, RESIDUAL=not swiglu, INT8=True, BITS=True, SWAP_AB=swap,
                  FRAG=False, SCALED=True)
    ptx = compile_ptx(M._gemm_kernel, consts, int8, cfg.num_warps, cfg.num_stages)
    out.append(describe("gemm", ptx, bits=True, pdl=False, swap=swap))
print(json.dumps(out))
'''

PERSISTENT_SCRIPT = r'''
import inspect, json, os, re, subprocess, tempfile
import triton
from triton.backends.compiler import GPUTarget
from triton.backends.nvidia.compiler import get_ptxas
from triton.compiler import ASTSource

from tileinfer.backends.triton import linear_gemm_persistent as P


def ptxas_info(ptx):
    ptxas = get_ptxas(90)
    with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
        f.write(ptx)
    out = subprocess.run([getattr(ptxas, "path", ptxas), "-arch=sm_90a", "-v", f.name, "-o", os.devnull],
                         capture_output=True, text=True)
    info = out.stderr + out.stdout
    regs = int(re.search(r"Used (\d+) registers", info).group(1))
    return regs, int(re.search(r"(\d+) bytes spill stores", info).group(1))


def compile_variant(name, bm, bn, bk, warps, stages, int8=False, swap=False, tma=True, swiglu=False, residual=False,
                    split=False, flatten=False, f32_out=False):
    kernel = P._gemm_persistent_kernel
    names = list(inspect.signature(kernel.fn).parameters)
    w_ty = "i8" if int8 else "bf16"
    types = {"s_ptr": "*fp32", "p_ptr": "*fp32", "c_ptr": "*i32", "w_ptr": f"*{w_ty}",
             "y_ptr": "*fp32" if f32_out else "*bf16", "r_ptr": "*fp32" if f32_out else "*bf16"}
    if tma:
        types |= {"x_ptr": f"tensordesc<bf16[{bm}, {bk}]>", "w_ptr": f"tensordesc<{w_ty}[{bn}, {bk}]>"}
    consts = dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=8, SWIGLU=swiglu, DOT_F32=False, EVEN_K=True,
                  RESIDUAL=residual, INT8=int8, BITS=True, SWAP_AB=swap, TMA=tma, FLATTEN=flatten, SPLIT=split,
                  SPLITS=4 if split else 1, FRAG=False, SCALED=int8)
    sig = {n: "constexpr" if n in consts else types.get(n, "*bf16" if n.endswith("_ptr") else "i32") for n in names}
    aligned = [n for n in names if sig[n].startswith("*") or n.startswith("stride_") or n in ("N", "K")]
    src = ASTSource(kernel, sig, constexprs={(names.index(k),): v for k, v in consts.items()},
                    attrs={(names.index(n),): [["tt.divisibility", 16]] for n in aligned})
    opts = dict(num_warps=warps, num_stages=stages, enable_fp_fusion=True)
    ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=opts).asm["ptx"]
    body = ptx[ptx.index(".entry"):]
    regs, spills = ptxas_info(ptx)
    atomics = re.findall(r"atom\.global[^\s]*", body)
    return dict(name=name, int8=int8, tma=tma, split=split, regs=regs, spills=spills,
                tma_loads=body.count("cp.async.bulk.tensor"), cp_async=body.count("cp.async.cg.shared.global"),
                wgmma=body.count("wgmma.mma_async"), atomics=atomics, cg_loads=len(re.findall(r"ld\.global\.cg", body)),
                barrier_before_atomic=bool(atomics) and "bar.sync" in body[:body.index("atom.global")][-2000:],
                i2f=sorted(set(re.findall(r"cvt\.rn\.(?:f32|f16|bf16)\.s(?:8|16|32)", body))))


# (name, BLOCK_M, BLOCK_N, BLOCK_K, warps, stages, options). The residual and SwiGLU forms compile within the
# split and flattened ones (same tiles), the transposed int8 one within its flattened form.
VARIANTS = [
    ("bf16", 128, 128, 64, 8, 3, {}), ("bf16 logits", 128, 128, 64, 8, 3, dict(f32_out=True)),
    ("bf16 pointers", 128, 128, 64, 8, 3, dict(tma=False)), ("bf16 flatten", 128, 128, 64, 8, 4, dict(flatten=True)),
    ("bf16 flatten swiglu", 128, 128, 64, 8, 3, dict(flatten=True, swiglu=True)),
    ("bf16 split residual", 128, 128, 64, 8, 3, dict(split=True, residual=True)),
    ("bf16 split swiglu", 128, 128, 64, 8, 3, dict(split=True, swiglu=True)),
    ("bf16 128x256", 128, 256, 64, 8, 3, {}), ("bf16 4 warps", 128, 128, 64, 4, 4, {}),
    ("int8 swap swiglu", 128, 128, 64, 8, 3, dict(int8=True, swap=True, swiglu=True)),
    ("int8 swap split residual", 128, 128, 64, 8, 3, dict(int8=True, swap=True, split=True, residual=True)),
    ("int8 swap pointers", 128, 128, 64, 8, 3, dict(int8=True, swap=True, tma=False)),
    ("int8 swap flatten", 128, 128, 64, 8, 3, dict(int8=True, swap=True, flatten=True)),
    ("int8 swap 128x64x128", 128, 64, 128, 4, 3, dict(int8=True, swap=True)),
    ("int8", 128, 128, 64, 8, 3, dict(int8=True)), ("int8 swiglu", 128, 128, 64, 8, 3, dict(int8=True, swiglu=True)),
]
print(json.dumps([compile_variant(name, *tiles, **options) for name, *tiles, options in VARIANTS]))
'''

# Both scripts in one subprocess (one start of Python, torch and Triton): each one's JSON list.
BOTH_SCRIPT = r'''
import contextlib, io, json, runpy

results = []
for path in PATHS:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        runpy.run_path(path, run_name="__main__")
    results.append(json.loads(out.getvalue().strip().splitlines()[-1]))
print(json.dumps(results))
'''


@pytest.fixture(scope="module")
def compiled(tmp_path_factory) -> dict[str, list[dict]]:
    folder = tmp_path_factory.mktemp("compile_linear")
    scripts = {"gemv_gemm": GEMV_GEMM_SCRIPT, "persistent": PERSISTENT_SCRIPT}
    paths = []
    for name, script in scripts.items():
        paths.append(str(folder / f"compile_{name}.py"))
        Path(paths[-1]).write_text(script)
    driver = BOTH_SCRIPT.replace("PATHS", repr(paths), 1)
    return dict(zip(scripts, compiled_results(driver, folder / "compile_both.py")))


def test_gemv_and_gemm_compile_for_sm90(compiled):
    results = compiled["gemv_gemm"]
    bf16 = next(r for r in results if r["name"] == "bf16_gemv")
    assert len(results) == 21
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


def test_persistent_gemm_compiles_for_sm90(compiled):
    results = compiled["persistent"]
    assert len(results) == 16
    for r in results:
        assert r["spills"] == 0, r
        assert r["wgmma"] > 0, r  # Hopper's asynchronous tensor-core MMA, not mma.sync
        if r["tma"]:
            assert r["tma_loads"] > 0 and r["cp_async"] == 0, r
        else:
            assert r["cp_async"] > 0 and r["tma_loads"] == 0, r  # x and (int8) weight tiles staged by cp.async
        if r["int8"]:
            assert r["i2f"] == [], r
        if r["split"]:
            assert any(".acq_rel" in a and ".gpu" in a for a in r["atomics"]), r
            assert r["barrier_before_atomic"] and r["cg_loads"] > 0, r
        else:
            assert r["atomics"] == [], r
