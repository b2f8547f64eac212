"""The prefill attention kernel (backends/triton/paged_attention_prefill.py) as Triton and ptxas build
it for an H100/H200 (sm_90), on any machine: no GPU, no run. ``python -m bench kernels
paged_attention --build [--prefill-tiles NAMES] [--page-size P]`` builds the launch
``paged_prefill_attention`` makes at Qwen3-4B's shape (32 q heads, 8 kv heads, head_dim 128, bf16 q
and pages of 64, a 4,096-token chunk, causal, PDL; bench/sm90_build.py gives it the launch's own
specialization) with each candidate's tiles (:data:`CANDIDATES`, the rule's first) and prints and
records (kind ``attention_build``, machine ``cpu``): registers a thread, spilled bytes, shared
memory, the warps launched, programs per SM, the warpgroup MMAs (``HGMMA``: wgmma, A from registers
or shared memory; ``HMMA`` would be mma.sync) and the global loads (cp.async ``LDGSTS``, ``LDG`` by
width).

Every figure is the compiler's, never a measurement; the timing is ``python -m bench kernels
paged_attention --prefill-prompts 8192,32768`` on a GPU.
"""

from __future__ import annotations

from .. import sm90_build

SHAPE = dict(heads=32, kv_heads=8, head_dim=128)  # Qwen3-4B
CHUNK = 4096  # configs/default.yaml's prefill_chunk: the T a long prompt's prefill steps run with
CANDIDATES = ("rule", "128x64", "128x128")  # prefill_tiles' shapes


def candidate_tiles(name: str, rows: int, head_dim: int):
    """The ``PrefillTiles`` of candidate ``name`` for ``rows = T * G`` query rows."""
    from tileinfer.backends.triton.paged_attention import prefill_tiles

    return prefill_tiles(rows, head_dim, shape=name)


def prefill_launch_on_meta(tiles, t: int = CHUNK, start: int = 4096, causal: bool = True, page_size: int = 64):
    """The launch ``paged_prefill_attention`` makes with ``tiles`` at :data:`SHAPE` (pages of
    ``page_size``) on ``meta`` tensors (a T-token step after ``start`` cached positions)."""
    import torch

    from tileinfer.backends.triton.paged_attention import LOG2E
    from tileinfer.backends.triton.paged_attention_prefill import prefill_launch

    h, hkv, d, page = SHAPE["heads"], SHAPE["kv_heads"], SHAPE["head_dim"], page_size
    meta = dict(device="meta")
    pages = -(-(start + t) // page) + 4
    q = torch.empty(t, h, d, dtype=torch.bfloat16, **meta)
    k_pages = torch.empty(pages, hkv, page, d, dtype=torch.bfloat16, **meta)
    v_pages = torch.empty_like(k_pages)
    block_table = torch.empty(pages, dtype=torch.int32, **meta)
    positions = torch.empty(t, dtype=torch.int64, **meta)
    return prefill_launch(q, k_pages, v_pages, block_table, torch.empty_like(q), positions, d ** -0.5 * LOG2E,
                          h // hkv, tiles, False, "tf32", True, causal)


def loads(ops: dict[str, int]) -> dict[str, int]:
    """The global loads and the copies into shared memory among SASS opcode counts."""
    return {op: n for op, n in sorted(ops.items()) if op.startswith("LDG")}


def compile_prefill(name: str, causal: bool = True, page_size: int = 64) -> dict:
    """Build candidate ``name``'s launch for sm_90 and read what it takes (the module docstring)."""
    tiles = candidate_tiles(name, CHUNK * SHAPE["heads"] // SHAPE["kv_heads"], SHAPE["head_dim"])
    launch = prefill_launch_on_meta(tiles, causal=causal, page_size=page_size)
    build = sm90_build.compile_launch(launch.kernel, launch.args, launch.kwargs)
    ops = sm90_build.opcodes(build.sass)
    return dict(candidate=name, causal=causal, page_size=page_size, tiles=tiles.__dict__, registers=build.registers,
                spill_stores=build.spill_stores, spill_loads=build.spill_loads, shared_bytes=build.shared_bytes,
                requested_warps=build.requested_warps, warps=build.warps,
                programs_per_sm=sm90_build.programs_per_sm(build.registers, build.warps, build.shared_bytes),
                hgmma=sm90_build.hgmma(build.sass), hmma=sum(n for op, n in ops.items() if op.startswith("HMMA")),
                loads=loads(ops))


def build_main(names: list[str], page_size: int, commit: str | None, path) -> int:
    """Build every candidate of ``names`` over pages of ``page_size``, print one block each and
    record it."""
    from .. import records

    run = records.Run("cpu", commit=commit, path=path)
    for name in names:
        r = compile_prefill(name, page_size=page_size)
        run.add("attention_build", shape="Qwen3-4B", T=CHUNK, **r)
        print(f"{name}: {r['registers']} registers, spills {r['spill_stores']} / {r['spill_loads']} bytes, "
              f"{r['shared_bytes']} bytes of shared memory, {r['warps']} warps, "
              f"{r['programs_per_sm']} programs per SM")
        mma = {**r["hgmma"], **({"HMMA": r["hmma"]} if r["hmma"] else {})}
        print("  MMA: " + (", ".join(f"{op} {n}" for op, n in mma.items()) or "none"))
        print("  loads: " + ", ".join(f"{op} {n}" for op, n in r["loads"].items()))
    print(f"compiler figures, not measurements; appended {len(run.records)} records to {run.path}")
    return 0


__all__ = ["CANDIDATES", "CHUNK", "build_main", "candidate_tiles", "compile_prefill", "prefill_launch_on_meta"]
