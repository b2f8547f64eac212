"""Triton kernels as Triton and ptxas build them for an H100/H200 (sm_90a), on any machine: no GPU,
no run. :func:`compile_launch` compiles a launch (``kernel[grid](*args, **kwargs)``, the arguments
``meta`` tensors or TMA descriptors of them) with the specialization Triton's launcher would give
it (its own binder: pointers 16-byte aligned, integers divisible by 16 marked so, 1 a constant);
:func:`compile_source` a signature given by hand. A :class:`Build` holds the Triton IR, PTX and SASS
(``nvdisasm``) and what ptxas reports. Readers: :func:`opcodes` (SASS instructions by full name,
``LDS.U16``, ``HGMMA.64x128x16.F32.BF16``), :func:`loops` (the SASS loops, from the backward
branches), :func:`hgmma` (each MMA's shape and whether its A operand is registers),
:func:`programs_per_sm` (the launch's occupancy rule).

Every figure here is the compiler's, never a measurement.
"""

from __future__ import annotations

import collections
import os
import re
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

REGISTERS, THREADS, SHARED, SHARED_RESERVED, REG_UNIT = 65536, 2048, 228 * 1024, 1024, 8
CAPABILITY = 90
INSTRUCTION = re.compile(r"\s+/\*([0-9a-f]+)\*/\s+(@!?U?P[T\d]+\s+)?([A-Z][A-Z0-9_]*(?:\.\w+)*)\s*([^;]*);")
LABEL = re.compile(r"(\.L_x_\d+):")
BRANCH_TARGET = re.compile(r"`\((\.L_x_\d+)\)")


@dataclass
class Build:
    """One kernel built for sm_90a: ``ttgir``, ``ptx``, ``sass`` texts; ``requested_warps`` (the
    launch's num_warps) and ``warps`` (those the kernel runs: more where Triton warp-specialized it);
    ``shared_bytes``; ptxas's ``registers`` a thread and spilled bytes."""

    name: str
    ttgir: str
    ptx: str
    sass: str
    requested_warps: int
    warps: int
    shared_bytes: int
    registers: int
    spill_stores: int
    spill_loads: int

    @property
    def warp_specialized(self) -> bool:
        """Whether Triton split the kernel into warp-specialized partitions (the IR's
        ``ttg.warp_specialize`` and more warps than the launch asked for)."""
        return "ttg.warp_specialize" in self.ttgir and self.warps > self.requested_warps


def compile_source(kernel, signature: dict, constexprs: dict, attrs: dict, options: dict) -> Build:
    """Build ``kernel`` (a ``@triton.jit`` function) for sm_90a from a hand-made specialization
    (``ASTSource``'s arguments; ``options``: num_warps, num_stages, maxnreg, ...)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    options = {k: v for k, v in options.items() if v is not None}
    compiled = triton.compile(ASTSource(kernel, signature, constexprs, attrs),
                              target=GPUTarget("cuda", CAPABILITY, 32), options=options)
    return _read(compiled, kernel.__name__, options.get("num_warps", 4), options.get("maxnreg"))


def compile_launch(kernel, args: tuple, kwargs: dict) -> Build:
    """Build ``kernel`` for sm_90a as ``kernel[grid](*args, **kwargs)`` would on an sm_90 GPU: the
    arguments specialized by Triton's own launch binder (``meta`` tensors stand for device ones:
    their data pointer 0 is 16-byte aligned, as a CUDA allocation is)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend
    from triton.runtime.jit import create_function_from_signature

    target = GPUTarget("cuda", CAPABILITY, 32)
    backend = make_backend(target)
    binder = create_function_from_signature(kernel.signature, kernel.params, backend)
    bound, specialization, options = binder(*args, **kwargs)
    options, signature, constexprs, attrs = kernel._pack_args(backend, kwargs, bound, specialization, options)
    compiled = triton.compile(ASTSource(kernel, signature, constexprs, attrs), target=target, options=options.__dict__)
    return _read(compiled, kernel.__name__, options.num_warps, options.maxnreg)


def _read(compiled, name: str, requested_warps: int, maxnreg: int | None) -> Build:
    from triton.backends.nvidia.compiler import get_ptxas

    ptxas = get_ptxas(CAPABILITY)
    ptxas = getattr(ptxas, "path", ptxas)
    with tempfile.TemporaryDirectory() as work:
        ptx, cubin = Path(work) / "kernel.ptx", Path(work) / "kernel.cubin"
        ptx.write_text(compiled.asm["ptx"])
        cubin.write_bytes(compiled.asm["cubin"])
        cap = [f"--maxrregcount={maxnreg}"] if maxnreg else []
        info = subprocess.run([ptxas, "-v", f"--gpu-name=sm_{CAPABILITY}a", str(ptx), "-o", os.devnull, *cap],
                              capture_output=True, text=True, check=True).stderr
        sass = subprocess.run([str(Path(ptxas).with_name("nvdisasm")), "-c", str(cubin)], capture_output=True,
                              text=True, check=True).stdout
    spill_stores, spill_loads = (int(x) for x in re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads",
                                                             info).groups())
    return Build(name=name, ttgir=compiled.asm["ttgir"], ptx=compiled.asm["ptx"], sass=sass,
                 requested_warps=requested_warps, warps=compiled.metadata.num_warps,
                 shared_bytes=compiled.metadata.shared,
                 registers=int(re.search(r"Used (\d+) registers", info).group(1)), spill_stores=spill_stores,
                 spill_loads=spill_loads)


def programs_per_sm(registers: int, warps: int, shared_bytes: int) -> int:
    """Programs of ``warps`` warps at ``registers`` a thread (allocated in units of 8) and
    ``shared_bytes`` (plus 1 KiB reserved) that fit on one multiprocessor: 65,536 registers, 2,048
    threads, 228 KiB of shared memory."""
    threads = warps * 32
    return min(REGISTERS // (-(-registers // REG_UNIT) * REG_UNIT * threads), THREADS // threads,
               SHARED // (shared_bytes + SHARED_RESERVED) if shared_bytes else THREADS)


def instructions(sass: str) -> list[tuple[int, str, str]]:
    """``(line, opcode, operands)`` of every SASS instruction (``line``: its line number in ``sass``)."""
    found = []
    for n, text in enumerate(sass.splitlines()):
        m = INSTRUCTION.match(text)
        if m:
            found.append((n, m.group(3), m.group(4).strip()))
    return found


def opcodes(sass: str, lines: range | None = None) -> dict[str, int]:
    """Instruction counts by full opcode (``LDS.U16``, ``PRMT``, ...), within ``lines`` if given."""
    return dict(collections.Counter(op for n, op, _ in instructions(sass) if lines is None or n in lines))


def loops(sass: str) -> list[range]:
    """The SASS loops: for each branch back to a label above it, the lines from the label to the
    branch. Left out: the branches back from the blocks placed after the kernel's end that retry a
    barrier wait (a block whose own label a branch in it targets), so that a loop is its body."""
    labels, found, block = {}, [], None
    spins = set()
    lines = sass.splitlines()
    for n, text in enumerate(lines):
        m = LABEL.match(text)
        if m:
            labels[m.group(1)], block = n, m.group(1)
            continue
        ins = INSTRUCTION.match(text)
        target = ins and ins.group(3).startswith("BRA") and BRANCH_TARGET.search(ins.group(4))
        if not target:
            continue
        if target.group(1) == block:
            spins.add(block)
        if labels.get(target.group(1), n) < n and (block not in spins or target.group(1) == block):
            found.append(range(labels[target.group(1)], n + 1))
    return found


def innermost(sass: str, opcode_prefix: str) -> list[range]:
    """The loops holding an instruction starting with ``opcode_prefix`` that hold no other such loop."""
    at = [n for n, op, _ in instructions(sass) if op.startswith(opcode_prefix)]
    having = [r for r in loops(sass) if any(n in r for n in at)]
    return [r for r in having if not any(o is not r and o.start >= r.start and o.stop <= r.stop for o in having)]


def hgmma(sass: str, lines: range | None = None) -> dict[str, int]:
    """The warpgroup MMAs by shape and A operand (``HGMMA.64x128x16.F32.BF16 A=registers``: A read
    from registers, ``A=shared``: both operands through shared-memory descriptors)."""
    return dict(collections.Counter(
        f"{op} A={'shared' if operands.split(',')[1].strip().startswith('gdesc') else 'registers'}"
        for n, op, operands in instructions(sass) if op.startswith("HGMMA") and (lines is None or n in lines)))


def max_registers(sass: str) -> list[int]:
    """The register counts a warp-specialized kernel's partitions set (``USETMAXREG``), in order."""
    return [int(v, 16) for v in re.findall(r"USETMAXREG\.\w+(?:\.\w+)*\s+0x([0-9a-f]+)", sass)]


__all__ = ["Build", "compile_launch", "compile_source", "hgmma", "innermost", "instructions", "loops",
           "max_registers", "opcodes", "programs_per_sm"]
