"""The int8 decode attention with ``int8_keep_layout`` (each int8 K/V tile converted in the layout
it is loaded in, then moved to the MMA operand as 16-bit values; ``keep_layout`` of
paged_attention_tiles.py): against the twin within the int8 kernels' bound, at the CPU cases and on
the GPU at Qwen3-4B's attention shape (on the interpreter, where the move is no instruction, the
same bits as without; compiled, not: an H100 gave other last bits at 1-token steps); and as sm_90
builds the 1-token decode kernel, no shared-memory load of a single byte in its key loop and fewer
instructions there (the int8 tile read a byte at a time is what the option removes)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tileinfer.backends.triton.paged_attention import paged_decode_attention

from ..kernel_checks import BF16, DEVICE, F16, compiled_results, poisoned
from .test_paged_attention_int8 import make_int8_case, run_int8_case

CASES = [(1, 100, 4, 64, 16, 3, F16), (7, 380, 2, 128, 64, 3, F16)]
if DEVICE == "cuda":
    CASES = [(t, context, 4, 128, 64, splits, BF16) for t in (1, 16) for context in (1024, 32768)
             for splits in (16, 32)]


@pytest.mark.parametrize("case", CASES)
def test_the_kept_layout_matches_the_twin(case):
    t, start, group, head_dim, page_size, splits, dtype = case
    run_int8_case(paged_decode_attention, 12, t, start, group, head_dim, page_size, dtype,
                  kv_heads=8 if DEVICE == "cuda" else 2, num_splits=splits, int8_keep_layout=True)


@pytest.mark.skipif(DEVICE == "cuda", reason="compiled, the last bits may differ (see the module docstring)")
def test_on_the_interpreter_the_kept_layout_gives_the_same_bits():
    t, start, group, head_dim, page_size, splits, dtype = CASES[0]
    q, k_pages, v_pages, block_table, int8 = make_int8_case(11, t, start, group, head_dim, page_size, dtype)
    outs = []
    for keep in (False, True):
        out = poisoned(q.shape, q.dtype)
        paged_decode_attention(q, k_pages, v_pages, block_table, start, head_dim ** -0.5, num_splits=splits,
                               out=out, int8_keep_layout=keep, **int8)
        outs.append(out)
    assert not outs[0].isnan().any() and torch.equal(outs[0], outs[1])


SCRIPT = r'''
import json, sys
sys.path.insert(0, %(root)r)
import torch
from triton.runtime.jit import KernelInterface
from bench import sm90_build as B
import tileinfer.backends.triton.paged_attention as PA

launches = []
KernelInterface.__getitem__ = lambda self, grid: (lambda *a, **k: launches.append((self, a, k)))
PA._kernel_flags = lambda dtype, device: (False, "tf32")
hkv, heads, d, page, ctx = 8, 32, 128, 64, 32768
pages = ctx // page + 2
meta = dict(device="meta")
results = []
for keep in (False, True):
    q = torch.empty(1, heads, d, dtype=torch.bfloat16, **meta)
    kp = torch.empty(pages, hkv, page, d, dtype=torch.int8, **meta)
    PA.paged_decode_attention(q, kp, torch.empty_like(kp), torch.empty(pages, dtype=torch.int32, **meta), ctx - 1,
                              0.088, positions=torch.empty(1, dtype=torch.int64, **meta), num_splits=32,
                              k_scale=torch.empty(pages, hkv, page, **meta),
                              v_scale=torch.empty(pages, hkv, page, **meta), k_smooth=torch.empty(d, **meta),
                              int8_keep_layout=keep)
    kernel, args, kwargs = launches[0]
    launches.clear()
    b = B.compile_launch(kernel, args, kwargs)
    loop = max(B.loops(b.sass), key=len)
    results.append(dict(keep=keep, loop=len(loop), ops=B.opcodes(b.sass, loop), registers=b.registers,
                        spills=b.spill_stores))
print(json.dumps(results))
'''


def test_the_kept_layout_reads_no_single_bytes_from_shared_memory(tmp_path):
    root = str(Path(__file__).resolve().parents[3])
    plain, kept = compiled_results(SCRIPT % {"root": root}, tmp_path / "compile_int8_keep_layout.py")
    print(f"key loop: {plain['loop']} instructions, {kept['loop']} with the kept layout")
    assert plain["ops"].get("LDS.U8", 0) > 0, plain  # what the option is for
    assert not any(op.startswith(("LDS.U8", "LDS.S8")) for op in kept["ops"]), kept
    assert kept["loop"] < plain["loop"] and kept["spills"] == 0, (plain["loop"], kept)
