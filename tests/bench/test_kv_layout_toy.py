"""bench/kv_layout_toy.py on the CPU: every page layout's kernel gives the slot-major kernel's attention
(and the float32 attention of the dequantized pages) under the interpreter on a small random case,
odd group, two splits, pages out of order, the output poisoned (NaN) before the launch; a kernel reading pages
of another layout than its own does not (so that the check can fail); the toy builds for sm_90a
(in a subprocess: this session imported the kernels under TRITON_INTERPRET=1), and its slot-major V
tile is read a byte at a time where the transposed one is not; the ``prmt`` conversion to float16 is
exact for every byte (its arithmetic, in torch: the interpreter runs no inline PTX)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bench import kv_layout_toy as toy

ROOT = Path(__file__).resolve().parents[2]
HKV, GROUP, D, PAGES = 2, 3, 64, 5
TABLE = [[4, 0], [2, 3]]  # two splits
LAYOUTS = [(k, v) for k in toy.K_LAYOUTS for v in toy.V_LAYOUTS]


@pytest.fixture(scope="module")
def case() -> dict:
    g = torch.Generator().manual_seed(7)
    k = torch.randint(-127, 128, (PAGES, HKV, toy.PAGE, D), generator=g, dtype=torch.int8)
    v = torch.randint(-127, 128, (PAGES, HKV, toy.PAGE, D), generator=g, dtype=torch.int8)
    ks = torch.rand(PAGES, HKV, toy.PAGE, generator=g) * 0.02 + 0.001
    vs = torch.rand(PAGES, HKV, toy.PAGE, generator=g) * 0.02 + 0.001
    q = torch.randn(HKV * GROUP, D, generator=g)
    return dict(q=q, k=k, v=v, ks=ks, vs=vs, bt=torch.tensor(TABLE, dtype=torch.int32), scale=D ** -0.5)


def reference(c: dict) -> torch.Tensor:
    """Float32 attention of each q row over its kv head's keys of each split's pages, dequantized."""
    out = torch.empty(len(TABLE), HKV * GROUP, D)
    for split, pages in enumerate(TABLE):
        for h in range(HKV):
            kf = torch.cat([c["k"][p, h].float() * c["ks"][p, h, :, None] for p in pages])
            vf = torch.cat([c["v"][p, h].float() * c["vs"][p, h, :, None] for p in pages])
            rows = slice(h * GROUP, (h + 1) * GROUP)
            out[split, rows] = torch.softmax(c["q"][rows] @ kf.T * c["scale"], -1) @ vf
    return out


def run(c: dict, k_layout: int, v_layout: int, pages_of: tuple[int, int] | None = None) -> torch.Tensor:
    kl, vl = toy.page_layouts(*(pages_of or (k_layout, v_layout)))
    return toy.attend(c["q"], toy.pack_pages(c["k"], kl), toy.pack_pages(c["v"], vl), c["ks"], c["vs"], c["bt"],
                      c["scale"], k_layout, v_layout)


@pytest.fixture(scope="module")
def rows_out(case) -> torch.Tensor:
    return run(case, 0, 0)


def test_slot_major_toy_is_the_attention(case, rows_out):
    torch.testing.assert_close(rows_out, reference(case), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("k_layout,v_layout", LAYOUTS[1:], ids=[f"{toy.K_LAYOUTS[k]}-{toy.V_LAYOUTS[v]}"
                                                                 for k, v in LAYOUTS[1:]])
def test_layouts_give_the_slot_major_attention(case, rows_out, k_layout, v_layout):
    out = run(case, k_layout, v_layout)
    assert torch.isfinite(out).all()
    # The same products summed in the same order per tile: float32 ties, up to the interpreter's dot.
    torch.testing.assert_close(out, rows_out, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("k_layout,v_layout", [(1, 0), (2, 0), (0, 1), (0, 2), (0, 3)])
def test_pages_of_another_layout_give_another_attention(case, rows_out, k_layout, v_layout):
    assert (run(case, k_layout, v_layout, pages_of=(0, 0)) - rows_out).abs().max() > 1e-3


def test_pack_pages_keeps_the_bytes(case):
    for layout in ("pairs", "quads", "columns", "columns_pairs", "columns_quads"):
        packed = toy.pack_pages(case["k"], layout)
        assert packed.shape == case["k"].shape and not torch.equal(packed, case["k"])
        assert torch.equal(packed.flatten(2).sort(-1).values, case["k"].flatten(2).sort(-1).values)


SCRIPT = f'''
import json, sys
sys.path.insert(0, {str(ROOT)!r})
from bench.kv_layout_toy import build
print(json.dumps([build(0, 0, tiles=64), build(0, 1, tiles=64), build(0, 1, tiles=64, convert=1)]))
'''


def test_toy_builds_for_sm90():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows, columns, prmt = json.loads(proc.stdout.strip().splitlines()[-1])
    for r in (rows, columns, prmt):
        assert r["hmma"] == 32 and r["spill_stores"] == 0, r
    assert rows["lds_u8"] > 0 and columns["lds_u8"] == 0, (rows, columns)
    assert prmt["lds_u8"] == 0 and prmt["instructions"] < columns["instructions"] < rows["instructions"], (
        rows, columns, prmt)


def test_prmt_conversion_is_exact_for_every_byte():
    """What ``I8_TO_F16`` computes, in torch: the float16 of bits ``0x6400 | (x ^ 0x80)`` minus 1152 is x."""
    x = torch.arange(-128, 128, dtype=torch.int16)
    bits = 0x6400 | ((x ^ 0x80) & 0xFF)
    assert torch.equal(bits.view(torch.float16) - torch.tensor(1152.0, dtype=torch.float16), x.to(torch.float16))
    assert "0x64806480" in toy.I8_TO_F16.value and "0x5140" in toy.I8_TO_F16.value  # 1152; bytes 0, 1 of t
