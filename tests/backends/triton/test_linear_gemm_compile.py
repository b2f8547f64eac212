"""The persistent GEMM (linear_gemm_persistent.py) compiles for an H100/H200 (sm_90) on any machine
(Triton's compiler and its ptxas, no GPU), in the forms the sweep times (bench/kernels/linear.py,
linear_int8.py): BF16 and W8A16 (transposed or not), plain, SwiGLU, residual, float32 logits, with
TMA descriptors or pointers, a flattened tile loop, a split tail. Every variant: no register
spills, the tensor cores' wgmma; TMA variants load through ``cp.async.bulk.tensor`` and pointer
variants through ``cp.async`` (the pipeliner's shared-memory staging, int8 tiles included); the
W8A16 conversion on bit patterns issues no int -> float conversion instruction; split variants
count their units with a gpu-scope acquire-release atomic after a CTA barrier and read the other
programs' partials past L1 (``ld.global.cg``), the others have no atomic. Runs in a subprocess:
this session imported the kernels under TRITON_INTERPRET=1."""

from __future__ import annotations

from ..kernel_checks import compiled_results

SCRIPT = r'''
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
                  SPLITS=4 if split else 1)
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


VARIANTS = [  # (name, BLOCK_M, BLOCK_N, BLOCK_K, warps, stages, options)
    ("bf16", 128, 128, 64, 8, 3, {}), ("bf16 residual", 128, 128, 64, 8, 3, dict(residual=True)),
    ("bf16 swiglu", 128, 128, 64, 8, 3, dict(swiglu=True)), ("bf16 logits", 128, 128, 64, 8, 3, dict(f32_out=True)),
    ("bf16 pointers", 128, 128, 64, 8, 3, dict(tma=False)), ("bf16 flatten", 128, 128, 64, 8, 4, dict(flatten=True)),
    ("bf16 flatten swiglu", 128, 128, 64, 8, 3, dict(flatten=True, swiglu=True)),
    ("bf16 split residual", 128, 128, 64, 8, 3, dict(split=True, residual=True)),
    ("bf16 split swiglu", 128, 128, 64, 8, 3, dict(split=True, swiglu=True)),
    ("bf16 128x256", 128, 256, 64, 8, 3, {}), ("bf16 4 warps", 128, 128, 64, 4, 4, {}),
    ("int8 swap", 128, 128, 64, 8, 3, dict(int8=True, swap=True)),
    ("int8 swap swiglu", 128, 128, 64, 8, 3, dict(int8=True, swap=True, swiglu=True)),
    ("int8 swap split residual", 128, 128, 64, 8, 3, dict(int8=True, swap=True, split=True, residual=True)),
    ("int8 swap pointers", 128, 128, 64, 8, 3, dict(int8=True, swap=True, tma=False)),
    ("int8 swap flatten", 128, 128, 64, 8, 3, dict(int8=True, swap=True, flatten=True)),
    ("int8 swap 128x64x128", 128, 64, 128, 4, 3, dict(int8=True, swap=True)),
    ("int8", 128, 128, 64, 8, 3, dict(int8=True)), ("int8 swiglu", 128, 128, 64, 8, 3, dict(int8=True, swiglu=True)),
]
print(json.dumps([compile_variant(name, *tiles, **options) for name, *tiles, options in VARIANTS]))
'''


def test_persistent_gemm_compiles_for_sm90(tmp_path):
    results = compiled_results(SCRIPT, tmp_path / "compile_persistent.py")
    assert len(results) == 19
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
