"""The int8 -> float conversions of ``device_functions.int8_to`` give the same values every way.

``BITS`` 0 and 1 run under the interpreter against torch's cast on every int8 value. ``BITS`` 2 is
inline PTX, which only a GPU runs: here its instructions are executed by an emulator of the two PTX
instructions it uses (``xor.b32``; ``prmt.b32`` in its default mode, as the PTX ISA defines it:
byte ``i`` of the result is byte ``c[4i+2:4i]`` of ``{b, a}``) on every int8 value in every byte
position, and it is built for sm_90 next to ``BITS`` 1 in a GEMV-like loop, where it must take fewer
instructions a loaded byte (the aim of the permutes) and no int -> float conversion instruction.
The GPU tests of the linear check it against the twin through the kernels that select it."""

from __future__ import annotations

import re
import struct
from pathlib import Path

import pytest
import torch
import triton
import triton.language as tl

from tileinfer.backends.triton.device_functions import INT8_TO_F32_PATTERNS, int8_to

from ..kernel_checks import DEVICE, compiled_results

ALL_INT8 = torch.arange(-128, 128, dtype=torch.int16).to(torch.int8)


def _registers(asm: str, operands: dict[str, int]) -> dict[str, int]:
    """Run the asm's ``xor.b32`` / ``prmt.b32`` lines on 32-bit ``operands`` (``$4`` the input)."""
    regs = dict(operands)

    def value(token: str) -> int:
        token = token.strip()
        return regs[token] if token in regs else int(token, 0)

    for op, args in re.findall(r"(xor\.b32|prmt\.b32)\s+([^;]+);", asm):
        d, *src = [a.strip() for a in args.split(",")]
        if op == "xor.b32":
            regs[d] = value(src[0]) ^ value(src[1])
        else:
            a, b, c = (value(x) for x in src)
            pool = (b << 32 | a).to_bytes(8, "little")
            regs[d] = int.from_bytes(bytes(pool[(c >> 4 * i) & 7] for i in range(4)), "little")
    return regs


def test_the_permutes_build_each_byte_s_float32_pattern():
    """0x4B0000uu with u = q + 128 in output j for the int8 q in byte j of the input, for every q
    in every position (the rest of the word random): the float 2^23 + 128 + q."""
    g = torch.Generator().manual_seed(0)
    assert INT8_TO_F32_PATTERNS.value.count("prmt.b32") == 4
    for j in range(4):
        for q in range(-128, 128):
            word = torch.randint(0, 2**32, (1,), generator=g, dtype=torch.int64).item()
            word = word & ~(0xFF << 8 * j) | (q & 0xFF) << 8 * j
            out = _registers(INT8_TO_F32_PATTERNS.value, {"$4": word})[f"${j}"]
            assert out == 0x4B000000 | (q + 128), (j, q)
            assert struct.unpack("<f", out.to_bytes(4, "little"))[0] - 8388736.0 == q


@triton.jit
def _convert_kernel(q_ptr, out_ptr, N, DTYPE: tl.constexpr, BITS: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    q = tl.load(q_ptr + offs, mask=offs < N, other=0)
    tl.store(out_ptr + offs, int8_to(q, DTYPE, BITS).to(out_ptr.dtype.element_ty), mask=offs < N)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32] + ([torch.bfloat16] if DEVICE == "cuda" else []))
@pytest.mark.parametrize("bits", [0, 1] + ([2] if DEVICE == "cuda" else []))
def test_every_int8_value_converts_exactly(dtype, bits):
    q = ALL_INT8.to(DEVICE)
    out = torch.full((256,), float("nan"), dtype=dtype, device=DEVICE)
    tl_dtype = {torch.float16: tl.float16, torch.float32: tl.float32, torch.bfloat16: tl.bfloat16}[dtype]
    _convert_kernel[(1,)](q, out, 256, DTYPE=tl_dtype, BITS=bits, BLOCK=256)
    assert torch.equal(out, q.to(dtype))


SCRIPT = r'''
import json, sys
import triton
import triton.language as tl
sys.path.insert(0, %(root)r)
from bench import sm90_build as B
from tileinfer.backends.triton.device_functions import int8_to


@triton.jit
def gemv_like(w_ptr, x_ptr, y_ptr, K, DTYPE: tl.constexpr, BITS: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    rows = tl.program_id(0) * BN + tl.arange(0, BN)
    offs = tl.arange(0, BK)
    acc = tl.zeros((BN, BK), tl.float32)
    for k0 in range(0, K, BK):
        q = tl.load(w_ptr + rows[:, None] * K + k0 + offs[None, :])
        x = tl.load(x_ptr + k0 + offs)
        acc += int8_to(q, DTYPE, BITS).to(tl.float32) * x.to(tl.float32)[None, :]
    tl.store(y_ptr + rows, tl.sum(acc, axis=1))


results = []
for dtype, name in ((tl.float32, "float32"), (tl.bfloat16, "bfloat16")):
    for bits in (1, 2):
        sig = {"w_ptr": "*i8", "x_ptr": "*bf16", "y_ptr": "*fp32", "K": "i32", "DTYPE": "constexpr",
               "BITS": "constexpr", "BN": "constexpr", "BK": "constexpr"}
        b = B.compile_source(gemv_like, sig, {(4,): dtype, (5,): bits, (6,): 16, (7,): 512},
                             {(i,): [["tt.divisibility", 16]] for i in range(4)}, {"num_warps": 4})
        loop = max(B.loops(b.sass), key=len)
        ops = B.opcodes(b.sass, loop)
        results.append(dict(dtype=name, bits=bits, loop=len(loop), ops=ops,
                            weight_bytes=sum(16 * n for op, n in ops.items() if op == "LDG.E.128")))
print(json.dumps(results))
'''


def test_the_permutes_take_fewer_instructions_a_byte(tmp_path):
    root = str(Path(__file__).resolve().parents[3])
    results = compiled_results(SCRIPT % {"root": root}, tmp_path / "compile_int8_convert.py")
    for dtype in ("float32", "bfloat16"):
        bits, prmt = (next(r for r in results if r["dtype"] == dtype and r["bits"] == b) for b in (1, 2))
        print(dtype, "instructions in the loop: bits", bits["loop"], "permutes", prmt["loop"], "for",
              prmt["weight_bytes"], "weight bytes")
        assert bits["weight_bytes"] == prmt["weight_bytes"] > 0, (bits, prmt)
        assert prmt["loop"] < bits["loop"], (bits, prmt)
        assert not any(op.startswith("I2F") for op in prmt["ops"]), prmt
