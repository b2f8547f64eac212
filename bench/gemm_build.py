"""The prefill GEMM (backends/triton/linear_gemm.py, linear_gemm_persistent.py) as Triton and ptxas
build it for an H100/H200 (sm_90), on any machine: no GPU, no run. ``python -m bench gemm-build
[--shape S] [--layer L] [--tokens T] [--int8 [--int8-layout fragments]] [KEY=VALUE ...]`` takes the tiles the rule gives that
layer at T tokens on a 132-SM Hopper with TMA (``gemm_config``; KEY=VALUE: a field of
``GemmConfig`` replacing the rule's), with the layer's epilogue as the engine calls it (qkv plain,
o_proj and down adding the residual, gate_up with SwiGLU, the lm_head's float32 logits), builds the
launch ``linear`` would make (its own specialization: bench/sm90_build.py) and prints and records
(kind ``gemm_build``, machine ``cpu``): registers a thread, spilled bytes, shared memory, the warps
launched (12 for a warp-specialized 4-warp kernel) and the partitions' register counts, programs per
SM, and from the SASS the main loops (the innermost loops holding the MMAs; a flattened tile loop
holds its epilogue too): per iteration (one BLOCK_K step of a warp) the instructions, the warpgroup
MMAs with their A operand (registers or shared memory), the copies (TMA, cp.async), the
shared-memory loads by width, the shared-memory stores (an int8 tile converted and stored back for
an MMA that reads it there) and the conversion and integer/float instructions of an int8 tile.

Every figure is the compiler's, not a measurement; the timing is ``python -m bench kernels linear``
on a GPU.
"""

from __future__ import annotations

import dataclasses

from . import records, sm90_build
from .kernels.linear import LAYERS, layer_shapes

SMS = 132  # an H100 SXM / H200
# SASS instructions reported per main-loop iteration, by what they do (prefixes of the full opcode)
GROUPS = {
    "mma": ("HGMMA",),
    "copies": ("UTMALDG", "LDGSTS", "LDG"),
    "shared_loads": ("LDS", "LDSM"),
    "shared_stores": ("STS",),
    "conversion": ("I2F", "F2F", "F2FP", "PRMT", "LOP3", "I2IP", "SHF"),
    "alu": ("VIADD", "IADD3", "FADD", "FMUL", "FFMA", "HADD2", "HFMA2", "IMAD"),
    "moves": ("MOV", "IMAD.MOV"),
    "sync": ("BAR", "SYNCS", "WARPGROUP", "DEPBAR", "MEMBAR", "FENCE"),
}


def layer_launch(shape: str, layer: str, tokens: int, int8: bool, overrides: dict, frag: bool = False):
    """``(config, launch)``: the rule's tiles (with ``overrides``) and the launch of ``linear`` for
    that layer on ``meta`` tensors (``frag``: int8 weights in the ``fragments`` layout)."""
    import torch

    from tileinfer.backends.triton.linear_gemm import gemm_launch
    from tileinfer.backends.triton.linear_gemm_persistent import persistent_launch
    from tileinfer.backends.triton.linear_tiles import gemm_config

    n_w, k = layer_shapes(shape)[layer]
    swiglu, residual, logits = layer == "gate_up", layer in ("o_proj", "down"), layer == "lm_head"
    out_dtype = torch.float32 if logits else torch.bfloat16
    cfg = gemm_config(tokens, n_w, k, SMS, int8=int8, swiglu=swiglu, tma=True, out_bytes=out_dtype.itemsize)
    cfg = dataclasses.replace(cfg, **overrides)
    n_out = n_w // 2 if swiglu else n_w
    meta = dict(device="meta")
    x = torch.empty(tokens, k, dtype=torch.bfloat16, **meta)
    w = torch.empty(n_w, k, dtype=torch.int8 if int8 else torch.bfloat16, **meta)
    scale = torch.empty(n_w, dtype=torch.float32, **meta) if int8 else None
    out = torch.empty(tokens, n_out, dtype=out_dtype, **meta)
    r = torch.empty(tokens, n_out, dtype=torch.bfloat16, **meta) if residual else None
    i_off = n_out if swiglu else 0
    if cfg.persistent:
        return cfg, persistent_launch(x, w, scale, out, r, cfg, n_out, i_off, swiglu, False, None, frag)
    return cfg, gemm_launch(x, w, scale, out, r, cfg, n_out, i_off, swiglu, False, frag)


def grouped(ops: dict[str, int]) -> dict[str, dict[str, int]]:
    """``ops`` (full opcode -> count) by ``GROUPS`` (an opcode in the first group it starts with;
    ``IMAD.MOV`` among the moves)."""
    out = {g: {} for g in GROUPS}
    for op, n in sorted(ops.items()):
        group = "moves" if op.startswith("IMAD.MOV") or op.split(".")[0] == "MOV" else next(
            (g for g, prefixes in GROUPS.items() if g != "moves" and any(op.startswith(p) for p in prefixes)), None)
        if group:
            out[group][op] = n
    return out


def inspect_build(build: sm90_build.Build) -> dict:
    """What a GEMM build takes and its main loops' instructions (see the module docstring)."""
    sass = build.sass
    main = []
    for lines in sm90_build.innermost(sass, "HGMMA"):
        ops = sm90_build.opcodes(sass, lines)
        main.append(dict(lines=[lines.start, lines.stop - 1], instructions=sum(ops.values()),
                         hgmma=sm90_build.hgmma(sass, lines), groups=grouped(ops)))
    producers = []
    for lines in sm90_build.innermost(sass, "UTMALDG"):
        if not any(lines.start >= m["lines"][0] and lines.stop - 1 <= m["lines"][1] for m in main):
            ops = sm90_build.opcodes(sass, lines)
            producers.append(dict(lines=[lines.start, lines.stop - 1], instructions=sum(ops.values()),
                                  copies=grouped(ops)["copies"]))
    whole = sm90_build.opcodes(sass)
    return dict(registers=build.registers, spill_stores=build.spill_stores, spill_loads=build.spill_loads,
                shared_bytes=build.shared_bytes, requested_warps=build.requested_warps, warps=build.warps,
                warp_specialized=build.warp_specialized, partition_registers=sm90_build.max_registers(sass),
                programs_per_sm=sm90_build.programs_per_sm(build.registers, build.warps, build.shared_bytes),
                hgmma=sm90_build.hgmma(sass), copies=grouped(whole)["copies"],
                shared_loads=grouped(whole)["shared_loads"], main_loops=main, producer_loops=producers)


def compile_gemm(shape: str = "Qwen3-4B", layer: str = "down", tokens: int = 1024, *, int8: bool = False,
                 int8_layout: str = "rows", **overrides) -> dict:
    """Build the layer's GEMM for sm_90 (``overrides``: ``GemmConfig`` fields; ``int8_layout``: the
    int8 weight's, rows or fragments) and read what it takes."""
    assert int8_layout == "rows" or int8, "int8_layout is a layout of int8 weights"
    cfg, launch = layer_launch(shape, layer, tokens, int8, overrides, int8_layout == "fragments")
    result = inspect_build(sm90_build.compile_launch(launch.kernel, launch.args, launch.kwargs))
    return dict(shape=shape, layer=layer, T=tokens, int8=int8, overrides=overrides, config=cfg.__dict__,
                kernel=launch.kernel.__name__, **({"int8_layout": int8_layout} if int8 else {}), **result)


def option(text: str) -> tuple[str, object]:
    from tileinfer.backends.triton.linear_tiles import GemmConfig

    fields = {f.name: f.type for f in dataclasses.fields(GemmConfig)}
    key, _, value = text.partition("=")
    if key not in fields or not value:
        raise ValueError(f"{text}: expected KEY=VALUE, KEY a GemmConfig field: {', '.join(fields)}")
    if fields[key] in (bool, "bool"):
        if value.lower() not in ("true", "false"):
            raise ValueError(f"{text}: {key} takes true or false")
        return key, value.lower() == "true"
    if fields[key] in (str, "str"):
        return key, value
    return key, int(value)


def describe_loop(loop: dict) -> str:
    g = loop["groups"]
    parts = [f"{loop['instructions']} instructions", ", ".join(f"{n} {op}" for op, n in loop["hgmma"].items())]
    for name in ("copies", "shared_loads", "shared_stores", "conversion", "alu", "moves"):
        if g[name]:
            parts.append(f"{name}: " + ", ".join(f"{op} {n}" for op, n in g[name].items()))
    parts.append(f"sync: {sum(g['sync'].values())}")
    return "; ".join(parts)


def arguments(p) -> None:
    p.description = __doc__.split("\n\n")[0]
    p.add_argument("--shape", default="Qwen3-4B", help="model shape of bench/shapes.py (default Qwen3-4B)")
    p.add_argument("--layer", choices=LAYERS, default="down", help="the linear (default down)")
    p.add_argument("--tokens", type=int, default=1024, help="T, > 16 (default 1024)")
    p.add_argument("--int8", action="store_true", help="int8 weights with float32 row scales (W8A16)")
    p.add_argument("--int8-layout", choices=("rows", "fragments"), default="rows",
                   help="the int8 weight's layout (default rows; fragments: backends/triton/linear_layout.py)")
    p.add_argument("options", nargs="*", type=option, metavar="KEY=VALUE", help="a GemmConfig field")
    records.arguments(p)


def main(args) -> int:
    if args.tokens <= 16:
        print("error: the GEMM runs at T > 16 (T <= 16 takes the GEMV)")
        return 2
    if args.int8_layout != "rows" and not args.int8:
        print("error: --int8-layout is for --int8 weights")
        return 2
    result = compile_gemm(args.shape, args.layer, args.tokens, int8=args.int8, int8_layout=args.int8_layout,
                          **dict(args.options))
    run = records.Run("cpu", commit=args.commit, path=args.records)
    run.add("gemm_build", **result)
    c = result["config"]
    tiles = f"{c['block_m']}x{c['block_n']}x{c['block_k']} w{c['num_warps']} s{c['num_stages']}" + "".join(
        f" {k}" for k in ("persistent", "tma", "flatten", "swap_ab") if c[k])
    fmt = f"int8 ({args.int8_layout})" if result["int8"] else "bf16"
    print(f"{result['shape']} {result['layer']} T={result['T']} {fmt} weights, "
          f"{result['kernel']} {tiles}: {result['registers']} registers, spills {result['spill_stores']} / "
          f"{result['spill_loads']} bytes, {result['shared_bytes']} bytes of shared memory, {result['warps']} warps "
          f"launched ({result['requested_warps']} asked; warp-specialized {result['warp_specialized']}"
          + (f", partitions' registers {result['partition_registers']}" if result["partition_registers"] else "")
          + f"), {result['programs_per_sm']} programs per SM")
    print("  whole kernel: " + ", ".join(f"{n} {op}" for op, n in {**result["hgmma"], **result["copies"],
                                                                    **result["shared_loads"]}.items()))
    for loop in result["main_loops"]:
        print(f"  main loop (SASS lines {loop['lines'][0]}-{loop['lines'][1]}), per iteration: {describe_loop(loop)}")
    for loop in result["producer_loops"]:
        print(f"  producer loop (SASS lines {loop['lines'][0]}-{loop['lines'][1]}): {loop['instructions']} "
              f"instructions, " + ", ".join(f"{n} {op}" for op, n in loop["copies"].items()))
    return 0
