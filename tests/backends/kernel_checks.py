"""What the tests of tests/backends share: the device, seeded random inputs, NaN-poisoned output
buffers, the one tolerance table, and the comparisons against a reference twin.

Without a GPU the Triton kernels run under the interpreter (tests/conftest.py sets
``TRITON_INTERPRET=1`` before any kernel module is imported) on float16 / float32 data, since the
interpreter computes ``tl.dot`` wrongly on bfloat16; the GPU tests (``@pytest.mark.gpu``) use
bfloat16 at the Qwen3 shapes.

Bit-identity of a fused kernel with the chain of per-op kernels it replaces (:func:`assert_fused`).
It is guaranteed where both sides compute every output element with the same tile at the same
position in it and then apply the same elementwise roundings: the same tile config (a per-op chain
takes the fused call's tiles), and for the linear's SwiGLU form an up half that starts on a tile
boundary (``I`` a multiple of BLOCK_N, as the tile rule gives for every Qwen3 shape) or an epilogue
that runs elementwise on the plain kernel's partials (split-K's reduce, the persistent GEMM's split
tail); the residual epilogue always. There the tests assert ``torch.equal``, under the interpreter
and on the GPU. Where the up half starts mid-tile, the interpreter's ``tl.dot`` (numpy's matmul,
whose float32 summation order depends on the operands' shapes, on an element's position and on the
CPU's BLAS kernels: the fused and the plain tiles are different matmul calls) may round an element
differently, with any Triton version (3.6 and 3.9 alike); there the tests assert the tolerance of
the roundings involved with at least ``MIN_EXACT`` of the elements bit-identical. Compiled, the
tensor cores sum each element in an order that does not depend on its position in the tile: the
GPU tests assert ``torch.equal`` at every Qwen3 shape, the lm_head's rows taken as a [gate; up]
weight included (I = 75,968, not a multiple of the GEMM's 128 columns).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zlib
from pathlib import Path

import torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
F16, F32, BF16 = torch.float16, torch.float32, torch.bfloat16
INTERPRETER_DTYPES = [F16, F32]
EPS = 1e-6  # the RMSNorm epsilon of the tests
THETA = 1_000_000.0  # Qwen3's rope_theta

QWEN3_LINEARS = {  # name: (N, K) of each linear's weight, [gate; up] and q/k/v fused as the engine loads them
    "4B.qkv": (6144, 2560), "4B.o_proj": (2560, 4096), "4B.gate_up": (19456, 2560),
    "4B.down": (2560, 9728), "4B.lm_head": (151936, 2560),
    "0.6B.qkv": (4096, 1024), "0.6B.o_proj": (1024, 2048), "0.6B.gate_up": (6144, 1024),
    "0.6B.down": (1024, 3072), "0.6B.lm_head": (151936, 1024),
}

# (atol, rtol) of a kernel's result against its twin's (or another kernel's), by the kind of
# difference the two may have and by the result's dtype (``dtype=`` overrides it where the
# roundings that matter are of another dtype: float32 logits of bfloat16 operands).
# - one_rounding: both compute in float32 in different orders and round once: ~1 ulp apart.
# - two_roundings: one more rounding on one side (the twin rounds silu(gate) before the product;
#   the attention rounds P to the K/V dtype before P.V): ~2 ulps.
# - norm_rope: a normalized value may be 1 ulp off (the sum of squares is ordered differently) and
#   RoPE mixes two such values (|cos| + |sin| <= sqrt 2), rounding again: two ulps at the vectors'
#   scale (|normalized * weight| < 8) absolute, two ulps relative.
# - norm_residual_matmul: a linear of inputs up to 30x the unit scale (that the RMSNorm prologue
#   must undo) or of normalized inputs an ulp off, carried through the sum over K, then the
#   residual's rounding.
TOLERANCES = {
    "one_rounding": {F32: (2e-5, 1e-5), F16: (2e-3, 2.5e-3), BF16: (1.6e-2, 1.6e-2)},
    "two_roundings": {F32: (2e-5, 2e-5), F16: (4e-3, 4e-3), BF16: (3.2e-2, 3.2e-2)},
    "norm_rope": {F32: (1e-5, 1e-5), F16: (2 * 2**-8, 2 * 2**-10), BF16: (2 * 2**-5, 2 * 2**-7)},
    "norm_residual_matmul": {F32: (1e-4, 1e-4), F16: (1.6e-2, 8e-3)},
}
# Where a half-precision result may be an ulp off the twin only where a sum's order moves a value
# across a rounding boundary, which is rare: this fraction of its elements must be bit-identical.
MIN_EXACT = 0.98


def tolerance(dtype: torch.dtype, kind: str = "one_rounding") -> tuple[float, float]:
    """``(atol, rtol)`` of the table for results in ``dtype``."""
    return TOLERANCES[kind][dtype]


def generator(*key) -> torch.Generator:
    """A generator on the test device seeded from ``key`` (the test case), so that every case draws
    its own inputs, the same on every run."""
    return torch.Generator(device=DEVICE).manual_seed(zlib.crc32(repr(key).encode()))


def randn(shape, dtype: torch.dtype, g: torch.Generator, scale: float = 1.0) -> torch.Tensor:
    return (torch.randn(shape, generator=g, device=DEVICE) * scale).to(dtype)


def norm_weight(n: int, dtype: torch.dtype, g: torch.Generator) -> torch.Tensor:
    """A norm weight in [0.5, 1.5): not ones, so that a weight left out fails."""
    return (torch.rand(n, generator=g, device=DEVICE) + 0.5).to(dtype)


def step_positions(t: int, capacity: int, g: torch.Generator) -> torch.Tensor:
    """``t`` consecutive int64 positions from a random start below ``capacity - t`` (a prefill or
    decode step)."""
    start = int(torch.randint(0, capacity - t + 1, (1,), generator=g, device=DEVICE))
    return torch.arange(start, start + t, device=DEVICE)


def poisoned(shape, dtype: torch.dtype, device: torch.device | str = DEVICE) -> torch.Tensor:
    """An output buffer filled with NaN before a launch: an element the kernel leaves unwritten fails
    the comparison."""
    return torch.full(tuple(shape), float("nan"), dtype=dtype, device=device)


def assert_close(actual: torch.Tensor, expected: torch.Tensor, kind: str = "one_rounding", *,
                 dtype: torch.dtype | None = None, min_exact: float = 0.0, equal_nan: bool = False) -> None:
    """``actual`` within :data:`TOLERANCES` ``[kind]`` of ``expected`` (same shape and dtype), with no
    NaN left where ``expected`` has none; and at least ``min_exact`` of the compared elements
    bit-identical (half precision only: float32 rounds too finely for that)."""
    assert actual.shape == expected.shape and actual.dtype == expected.dtype, (
        f"{tuple(actual.shape)} {actual.dtype} against {tuple(expected.shape)} {expected.dtype}")
    unwritten = actual.isnan() & ~expected.isnan()
    assert not unwritten.any(), f"{int(unwritten.sum())} elements unwritten (NaN poison left)"
    atol, rtol = tolerance(dtype or expected.dtype, kind)
    torch.testing.assert_close(actual, expected, atol=atol, rtol=rtol, equal_nan=equal_nan)
    if min_exact and expected.dtype != F32:
        written = ~expected.isnan()
        exact = (actual[written] == expected[written]).float().mean().item()
        assert exact >= min_exact, f"only {exact:.4f} of the elements are bit-identical to the reference"


def assert_fused(fused: torch.Tensor, chain: torch.Tensor, *, aligned: bool = True, kind: str = "two_roundings") -> None:
    """The bit-identity policy of the module docstring: ``fused`` equal to ``chain`` bit for bit where
    ``aligned`` (every element computed on the same tile position on both sides), else within
    :data:`TOLERANCES` ``[kind]`` with at least ``MIN_EXACT`` of the elements bit-identical."""
    if aligned:
        assert torch.equal(fused, chain), f"max diff {(fused.float() - chain.float()).abs().max().item()}"
    else:
        assert_close(fused, chain, kind, min_exact=MIN_EXACT)


def assert_same(actual: torch.Tensor, expected: torch.Tensor) -> None:
    """Bit for bit, NaN exactly where ``expected`` is NaN (page slots nobody writes stay poisoned)."""
    torch.testing.assert_close(actual, expected, atol=0, rtol=0, equal_nan=True)


def compiled_results(script: str, path: Path) -> list[dict]:
    """Run a kernel-compilation ``script`` (written to ``path``, so that worker processes can import
    it) in a subprocess without TRITON_INTERPRET (this process imported the kernels under the
    interpreter) and return the JSON list its last stdout line prints."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    path.write_text(script)
    proc = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])
