"""The persistent step's kernel as Triton and ptxas build it for an H100/H200 (sm_90), on any machine:
no GPU, no run. ``python -m bench persistent-build [--shape S] [--int8] [--kv-int8] [KEY=VALUE ...]``
(KEY: an option of ``options.persistent``: num_warps, block_k, block_n, chunk, num_splits,
max_registers, stages, item_calls, split_k, int8_convert; programs_per_sm, the grid an ``auto`` qkv
tile is sized for, over 132 multiprocessors)
compiles the kernel with the specialization a launch gives it (pointers and strides multiples of
16) and prints and records
(kind ``persistent_build``, machine ``cpu``) what sets its speed before it runs: registers a
thread, spilled bytes, shared memory, the programs of its grid that fit on a multiprocessor
(``persistent_plan.resident_programs``' rule: 65,536 registers in units of 8 a thread, 2,048
threads, 228 KiB of shared memory with 1 KiB more a program) and its global loads and stores by
width (from the SASS, ``nvdisasm``; cp.async copies ``LDGSTS`` and TMA copies ``UTMALDG`` too): a
load narrower than 32 bits on the weights or pages is a bug (the kernel loads them in 16-byte
vectors). The build and its reading: bench/sm90_build.py.

Every figure is the compiler's, not a measurement; the timing is ``python -m bench steps`` on a GPU.
"""

from __future__ import annotations

import inspect
import re
import sys
from pathlib import Path

from tileinfer.model_config import ModelConfig

from . import records, sm90_build
from .shapes import SHAPES, model_config

INTS = ("num_warps", "block_k", "chunk", "num_splits", "max_registers", "stages", "split_k", "programs_per_sm")
BOOLS = ("item_calls",)
STRINGS = ("block_n", "int8_convert")


def compile_step(shape: str = "Qwen3-4B", *, int8: bool = False, kv_int8: bool = False, **options) -> dict:
    """Build the kernel for sm_90 (``options``: ``options.persistent``'s) and read what it takes."""
    from tileinfer.backends.triton import persistent as P
    from tileinfer.backends.triton.interpreter import DEFAULT_NUM_SMS
    from tileinfer.backends.triton.persistent_plan import BLOCK_N, StepShape, block_n_sizes, qkv_block_n

    mc = ModelConfig.from_folder(Path(shape)) if (Path(shape) / "config.json").is_file() else model_config(shape)
    qkv, *rest = block_n_sizes(str(options.get("block_n", BLOCK_N)))
    if qkv is None:
        qkv = qkv_block_n((mc.num_heads + 2 * mc.num_kv_heads) * mc.head_dim,
                          DEFAULT_NUM_SMS * options.get("programs_per_sm", 2))
    block_n = (qkv, *rest)
    step = StepShape(hidden=mc.hidden_size, heads=mc.num_heads, kv_heads=mc.num_kv_heads, head_dim=mc.head_dim,
                     intermediate=mc.intermediate_size, vocab=mc.vocab_size, layers=mc.num_layers, page_size=64,
                     num_splits=options.get("num_splits", 16), chunk=options.get("chunk", 128),
                     block_k=options.get("block_k", 256), block_n=block_n, split_k=options.get("split_k", 1),
                     kv_int8=kv_int8, k_smooth=kv_int8)
    consts = P.kernel_constants(step, int8=int8, lm_int8=False, stages=options.get("stages", 1),
                                int8_convert=options.get("int8_convert", "bits"))
    compile_options = P.compile_options(options.get("num_warps", 4), options.get("max_registers", 0))
    kernel = P.step_kernel(options.get("item_calls", False))
    names = list(inspect.signature(kernel.fn).parameters)
    types = {"items_ptr": "*i32", "counters_ptr": "*i32", "layer_ptrs": "*i64", "timeline_ptr": "*i64",
             "pos_ptr": "*i64", "eps": "fp32", "qk_scale": "fp32", "logits_ptr": "*fp32", "part_ptr": "*fp32",
             "stat_ptr": "*fp32", "bt_ptr": "*i32", "cos_ptr": "*fp32", "sin_ptr": "*fp32", "lm_s_ptr": "*fp32",
             "w_example_ptr": "*i8" if int8 else "*bf16"}
    signature = {n: "constexpr" if n in consts else types.get(n, "*bf16" if n.endswith("_ptr") else "i32")
                 for n in names}
    aligned = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names)
               if signature[n].startswith("*") or n.startswith("stride")}
    build = sm90_build.compile_source(kernel, signature, {(names.index(k),): v for k, v in consts.items()}, aligned,
                                      compile_options)
    regs, shared = build.registers, build.shared_bytes
    spill_stores, spill_loads = build.spill_stores, build.spill_loads
    fit = sm90_build.programs_per_sm(regs, build.warps, shared)
    memory = {op: n for op, n in sm90_build.opcodes(build.sass).items()
              if op.split(".")[0] in ("LDG", "STG", "LDGSTS", "UTMALDG")}
    return {"shape": shape, "int8": int8, "kv_int8": kv_int8, "options": options, "block_n": list(block_n),
            "registers": regs, "spill_stores": spill_stores, "spill_loads": spill_loads, "shared_bytes": shared,
            "programs_per_sm": fit, "global_memory": dict(sorted(memory.items()))}


def narrow(memory: dict[str, int]) -> dict[str, int]:
    """The global loads and stores of fewer than 32 bits (``LDG.E.U16``, ``STG.E.U8``, ...)."""
    return {op: n for op, n in memory.items() if re.search(r"\.(U|S)(8|16)\b", op)}


def option(text: str) -> tuple[str, object]:
    key, _, value = text.partition("=")
    if key not in (*INTS, *BOOLS, *STRINGS) or not value:
        raise ValueError(f"{text}: expected KEY=VALUE, KEY one of {', '.join((*INTS, *BOOLS, *STRINGS))}")
    if key == "block_n":
        from tileinfer.backends.triton.persistent_plan import block_n_sizes

        block_n_sizes(value)  # a bad value: argparse's one-line error
    return key, int(value) if key in INTS else value.lower() == "true" if key in BOOLS else value


def arguments(p) -> None:
    p.description = __doc__.split("\n\n")[0]
    p.add_argument("--shape", default="Qwen3-4B", help="model shape of bench/shapes.py (default Qwen3-4B), or a "
                   "checkpoint folder (its config.json), e.g. models/target")
    p.add_argument("--int8", action="store_true", help="int8 weights with float32 row scales")
    p.add_argument("--kv-int8", action="store_true", help="int8 KV pages with float32 scales and key smoothing")
    p.add_argument("options", nargs="*", type=option, metavar="KEY=VALUE", help="options.persistent.KEY")
    records.arguments(p)


def main(args) -> int:
    if args.shape not in SHAPES and not (Path(args.shape) / "config.json").is_file():
        print(f"error: --shape {args.shape}: neither a shape ({', '.join(SHAPES)}) nor a checkpoint folder with a "
              "config.json", file=sys.stderr)
        return 2
    result = compile_step(args.shape, int8=args.int8, kv_int8=args.kv_int8, **dict(args.options))
    run = records.Run("cpu", commit=args.commit, path=args.records)
    run.add("persistent_build", **result)
    print(f"{result['shape']} int8 weights {result['int8']}, int8 pages {result['kv_int8']}, "
          f"{result['options'] or 'default options'}: {result['registers']} registers, spills "
          f"{result['spill_stores']} / {result['spill_loads']} bytes, {result['shared_bytes']} bytes of shared "
          f"memory, {result['programs_per_sm']} programs per SM")
    print("  global loads and stores: " + ", ".join(f"{op} {n}" for op, n in result["global_memory"].items()))
    if narrow(result["global_memory"]):
        print(f"  narrower than 32 bits: {narrow(result['global_memory'])}")
    return 0
