"""The kernels of the decode path compile for an H100/H200 (sm_90) on any machine, with Triton's
own compiler (ptxas included in its wheel), no GPU needed. The interpreter that the other CPU tests
use runs Python semantics, so code that only the compiler rejects (a constexpr branch with an early
return; shapes that disagree in a branch the interpreter never takes) would otherwise first fail on
the GPU. Each variant of a kernel that takes a ``PDL`` constexpr is compiled with it on, with the
Qwen3-4B shapes (hidden 2,560, 32 q heads, 8 kv heads, head_dim 128, intermediate 9,728, pages of
64): its PTX must hold the grid dependency instructions (``griddepcontrol.launch_dependents`` and
``.wait``), the wait before the first global store; the kernels that read only activations issue
no global load before it, and those with a weight (GEMV, norms) load it before the wait. Every
kernel function is also compiled with PDL off, once (its ``PDL`` branches hold nothing but those
instructions, so one variant shows that none is left). The compilations are spread over two
worker processes. Runs in a subprocess: this test session imported the kernels under
TRITON_INTERPRET=1."""

from __future__ import annotations

from ..kernel_checks import compiled_results

SCRIPT = r'''
import concurrent.futures, importlib, inspect, itertools, json, re

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, INTER, PAGE = 2560, 32, 8, 128, 9728, 64


def jobs():
    """(name, module, kernel, constexprs, argument types, num_warps, num_stages, options)."""
    from tileinfer.backends.triton import linear_gemv as L
    from tileinfer.backends.triton import paged_attention as P
    from tileinfer.backends.triton.linear_tiles import gemv_config
    from tileinfer.backends.triton.add import ADD_BLOCK
    from tileinfer.backends.triton.rms_norm import norm_launch_config
    from tileinfer.backends.triton.rope import MAX_BLOCK_H as ROPE_BLOCK_H
    from tileinfer.backends.triton.kv_write import MAX_BLOCK_H as KV_BLOCK_H
    from tileinfer.backends.triton.silu_mul import BLOCK_I, NUM_WARPS as SILU_MUL_WARPS

    base = "tileinfer.backends.triton."
    bf16 = "*bf16"
    nofma = dict(enable_fp_fusion=False)
    out = []
    _, row_half, row_warps = norm_launch_config(HIDDEN, 1)
    # (SWIGLU, RESIDUAL, EVEN_K): gate_up (SwiGLU); o_proj / down (residual epilogue); the plain form
    # (qkv, lm_head) with a partial last K chunk: each branch of the plain form with a whole one is in these
    gemv_forms = [(True, False, True), (False, True, True), (False, False, False)]
    pdl = True  # every variant with PDL; PDL off is added below, once a kernel function
    for use_dot, (swiglu, residual, even_k) in itertools.product([False, True], gemv_forms):
        cfg = gemv_config(2560, 4096, 16 if use_dot else 1)
        fused = residual and use_dot  # o_proj / down at T >= 2: split K, the partials added by the last split
        consts = dict(BLOCK_T=L.GEMV_BLOCK_T if use_dot else 1, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
                      USE_DOT=use_dot, SWIGLU=swiglu, DOT_F32=False, EVEN_K=even_k, PDL=pdl, RESIDUAL=residual,
                      FUSED_REDUCE=fused, LATE_LAUNCH=cfg.late_launch, INT8=False, BITS=True, FRAG=False)
        types = {"lock_ptr": "*i32", **({"y_ptr": "*fp32"} if fused else {})}
        out.append(("gemv", base + "linear_gemv", "_gemv_kernel", consts, types, cfg.num_warps, cfg.num_stages, {}))
    for swiglu in (False, True):
        consts = dict(SPLIT_K=4, BLOCK=L.REDUCE_BLOCK, SWIGLU=swiglu, PDL=pdl, RESIDUAL=not swiglu)
        out.append(("reduce", base + "linear_gemv", "_splitk_reduce_kernel", consts, {"p_ptr": "*fp32"}, 4, 1, {}))

    block_h, block_half, warps = norm_launch_config(HEAD_DIM, HEADS)
    # attention inputs: one launch needs the q and the kv heads' norm tiles to agree (they do here)
    assert norm_launch_config(HEAD_DIM, KV_HEADS) == (block_h, block_half, warps)
    eps = {"eps": "fp32"}
    out.append(("rms_norm_heads", base + "rms_norm", "_rms_norm_kernel",
                 dict(HEADS=HEADS, N=HEAD_DIM, BLOCK_H=block_h, BLOCK_HALF=block_half, PDL=pdl),
                 eps, warps, 3, nofma))
    out.append(("add", base + "add", "_add_kernel", dict(BLOCK=ADD_BLOCK, PDL=pdl), {}, 4, 3, nofma))
    out.append(("rms_norm_rows", base + "rms_norm", "_row_rms_norm_kernel",
                 dict(N=HIDDEN, BLOCK_HALF=row_half, PDL=pdl), eps, row_warps, 3, {}))
    tables = {"cos_ptr": "*fp32", "sin_ptr": "*fp32", "pos_ptr": "*i64", "bt_ptr": "*i32", **eps}
    out.append(("attention_inputs", base + "attention_inputs", "_attention_inputs_kernel",
                 dict(H=HEADS, HKV=KV_HEADS, D=HEAD_DIM, PAGE_SIZE=PAGE, BLOCK_H=block_h,
                      BLOCK_HALF=block_half, KV_INT8=False, SMOOTH=False, PDL=pdl),
                 tables, warps, 3, nofma))
    int8 = {"kp_ptr": "*i8", "vp_ptr": "*i8", "ks_ptr": "*fp32", "vs_ptr": "*fp32", "smooth_ptr": "*fp32"}
    out.append(("attention_inputs_int8", base + "attention_inputs", "_attention_inputs_kernel",
                 dict(H=HEADS, HKV=KV_HEADS, D=HEAD_DIM, PAGE_SIZE=PAGE, BLOCK_H=block_h,
                      BLOCK_HALF=block_half, KV_INT8=True, SMOOTH=True, PDL=pdl),
                 {**tables, **int8}, warps, 3, nofma))
    out.append(("write_kv_int8", base + "kv_write", "_write_kv_int8_kernel",
                 dict(HKV=KV_HEADS, D=HEAD_DIM, PAGE_SIZE=PAGE, BLOCK_H=min(KV_BLOCK_H, KV_HEADS),
                      BLOCK_D=HEAD_DIM, SMOOTH=True, PDL=pdl),
                 {**tables, **int8}, 4, 3, nofma))
    out.append(("rope", base + "rope", "_rope_kernel",
                 dict(HEADS=HEADS, D=HEAD_DIM, BLOCK_H=min(ROPE_BLOCK_H, HEADS), BLOCK_HALF=HEAD_DIM // 2,
                      PDL=pdl),
                 tables, 4, 3, nofma))
    out.append(("write_kv", base + "kv_write", "_write_kv_kernel",
                 dict(HKV=KV_HEADS, D=HEAD_DIM, PAGE_SIZE=PAGE, BLOCK_H=min(KV_BLOCK_H, KV_HEADS),
                      BLOCK_D=HEAD_DIM, HAS_V=True, PDL=pdl),
                 tables, 4, 3, {}))
    out.append(("silu_mul", base + "silu_mul", "_silu_mul_kernel", dict(BLOCK_I=BLOCK_I, PDL=pdl),
                 {}, SILU_MUL_WARPS, 3, {}))
    attn = {"bt_ptr": "*i32", "pos_ptr": "*i64", "part_ptr": "*fp32", "max_ptr": "*fp32",
            "sum_ptr": "*fp32", "qk_scale": "fp32"}
    dcfg = P._decode_config(4, HEAD_DIM)
    # group 4 (Qwen3-4B) with 16 splits; group 1 with a single split (the kernel writes out itself) of
    # a non-causal step; int8 pages with their scales and the key smoothing: each branch compiled
    attn8 = {**attn, "k_ptr": "*i8", "v_ptr": "*i8", "ks_ptr": "*fp32", "vs_ptr": "*fp32", "smooth_ptr": "*fp32"}
    for name, group, single, causal, int8 in (("decode_g4", 4, False, True, False),
                                              ("decode_noncausal_g1", 1, True, False, False),
                                              ("decode_int8_g4", 4, False, True, True)):
        cfg = P._decode_config(4 * group, HEAD_DIM, int8)
        out.append((name, base + "paged_attention_decode", "_paged_decode_kernel",
                     dict(NUM_HEADS=KV_HEADS * group, SINGLE_SPLIT=single, CAUSAL=causal, KV_INT8=int8,
                          SMOOTH=int8, GROUP=group, HEAD_DIM=HEAD_DIM, PAGE_SIZE=PAGE, BLOCK_M=16,
                          BLOCK_N=cfg["BLOCK_N"], UPCAST=False, DOT_PRECISION="tf32", PDL=pdl),
                     attn8 if int8 else attn, cfg["num_warps"], cfg["num_stages"], {}))
    out.append(("combine", base + "paged_attention_decode", "_paged_decode_combine_kernel",
                 dict(NUM_HEADS=HEADS, HEAD_DIM=HEAD_DIM, BLOCK_S=P.DECODE_MAX_SPLITS, PDL=pdl),
                 attn, 4, 3, {}))
    for name, causal, int8 in (("prefill_g4", True, False), ("prefill_int8_noncausal_g4", False, True)):
        pcfg = P._prefill_config(4 * 1024, HEAD_DIM, int8)
        out.append((name, base + "paged_attention_prefill", "_paged_prefill_kernel",
                     dict(CAUSAL=causal, KV_INT8=int8, SMOOTH=int8, GROUP=4, HEAD_DIM=HEAD_DIM, PAGE_SIZE=PAGE,
                          BLOCK_M=pcfg.block_m, BLOCK_N=pcfg.block_n, UPCAST=False, DOT_PRECISION="tf32",
                          PDL=pdl),
                     attn8 if int8 else attn, pcfg.num_warps, pcfg.num_stages, {}))
    # PDL off: the first variant of each kernel function, the attention kernels at small tiles (what
    # PDL leaves out does not depend on them; they compile in a third of the time)
    small = {"_paged_decode_kernel": dict(HEAD_DIM=64, BLOCK_N=16),
             "_paged_prefill_kernel": dict(HEAD_DIM=64, BLOCK_M=16, BLOCK_N=16)}
    kernels = set()
    for name, module, kernel, consts, *rest in list(out):
        if (module, kernel) not in kernels:
            kernels.add((module, kernel))
            out.append((name, module, kernel, {**consts, **small.get(kernel, {}), "PDL": False}, *rest))
    return out


def compile_one(job):
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    name, module, kernel_name, consts, types, num_warps, num_stages, options = job
    kernel = getattr(importlib.import_module(module), kernel_name)
    names = list(inspect.signature(kernel.fn).parameters)
    missing = [c for c in consts if c not in names]
    assert not missing, (name, missing)
    constexpr_params = [n for i, n in enumerate(names) if i in kernel.constexprs]
    unset = [c for c in constexpr_params if c not in consts]
    assert not unset, (name, "constexprs not set", unset)

    def type_of(n):
        if n in consts:
            return "constexpr"
        if n in types:
            return types[n]
        return types.get("*", "*bf16") if n.endswith("_ptr") else "i32"

    signature = {n: type_of(n) for n in names}
    src = ASTSource(kernel, signature, constexprs={(names.index(k),): v for k, v in consts.items()})
    opts = dict(num_warps=num_warps, num_stages=num_stages, **options)
    ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=opts).asm["ptx"]
    body = ptx[ptx.index(".entry"):]
    first_wait = body.find("griddepcontrol.wait")
    first_store = re.search(r"\bst\.global", body)
    before_wait = body[:first_wait] if first_wait >= 0 else ""
    return dict(name=name, kernel=f"{module}.{kernel_name}", pdl=consts["PDL"],
                consts={k: str(v) for k, v in consts.items()},
                waits=body.count("griddepcontrol.wait"),
                launches=body.count("griddepcontrol.launch_dependents"),
                stores=first_store is not None,
                loads_before_wait=len(re.findall(r"\bld\.global", before_wait)),
                wait_before_store=first_store is None or 0 <= first_wait < first_store.start(),
                launch_after_wait=0 <= first_wait < body.find("griddepcontrol.launch_dependents"))


if __name__ == "__main__":
    todo = jobs()
    with concurrent.futures.ProcessPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(compile_one, todo))
    print(json.dumps(results))
'''

# kernels that load a weight (immutable) before the grid dependency wait; the others wait first
WEIGHT_BEFORE_WAIT = {"gemv", "rms_norm_heads", "rms_norm_rows", "attention_inputs", "attention_inputs_int8"}
# kernels that let the next kernel launch only after their own wait (the others at their start,
# but the GEMVs compiled with LATE_LAUNCH: after their K loop)
LAUNCH_AFTER_WAIT = {"attention_inputs", "attention_inputs_int8"}
# kernel name -> variants compiled with PDL on
EXPECTED = {
    "gemv": 6, "reduce": 2, "rms_norm_heads": 1, "add": 1, "rms_norm_rows": 1, "attention_inputs": 1,
    "rope": 1, "write_kv": 1, "silu_mul": 1, "decode_g4": 1, "decode_noncausal_g1": 1, "decode_int8_g4": 1,
    "combine": 1, "prefill_g4": 1, "prefill_int8_noncausal_g4": 1, "attention_inputs_int8": 1, "write_kv_int8": 1,
}
# kernel functions, each compiled once with PDL off: the GEMV and its split-K reduce, the two norms, add,
# the attention inputs, rope, the two KV writes, silu_mul, the paged decode and its combine, the prefill
KERNEL_FUNCTIONS = 13


def test_kernels_compile_for_sm90_with_and_without_pdl(tmp_path):
    results = compiled_results(SCRIPT, tmp_path / "compile_sm90.py")
    counts: dict[str, int] = {}
    for r in results:
        if r["pdl"]:
            counts[r["name"]] = counts.get(r["name"], 0) + 1
    assert counts == EXPECTED
    for r in results:
        assert r["stores"], r
        if r["pdl"]:
            assert r["waits"] >= 1 and r["launches"] >= 1 and r["wait_before_store"], r
            assert (r["loads_before_wait"] > 0) == (r["name"] in WEIGHT_BEFORE_WAIT), r
            late = r["consts"].get("LATE_LAUNCH") == "True"
            assert r["launch_after_wait"] == (r["name"] in LAUNCH_AFTER_WAIT or late), r
        else:
            assert r["waits"] == 0 and r["launches"] == 0, r
    kernels = {r["kernel"] for r in results}
    off = [r["kernel"] for r in results if not r["pdl"]]
    assert len(kernels) == KERNEL_FUNCTIONS and sorted(off) == sorted(kernels)  # each kernel function both ways
