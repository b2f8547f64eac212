"""``python -m bench COMMAND [OPTIONS]``: the command line of bench/ (``python -m bench COMMAND --help``)."""

from __future__ import annotations

import argparse
import importlib
import sys

import bench

# command -> (module of bench, prefix of its ``arguments``/``main`` functions, what it measures)
COMMANDS = {
    "matrix": ("matrix", "", "shape x variant-or-peer x workload: prefill ms, decode tok/s, their rooflines"),
    "peers": ("peers", "", "our default and INT8 beside every peer, at the matrix's workloads"),
    "cpu": ("peers", "cpu_", "the CPU path on the shipped model against transformers, runs taking turns"),
    "llamacpp": ("llamacpp", "", "llama.cpp as a peer: its source packed here, built and benched on the GPU"),
    "spec": ("speculative", "", "plain greedy against n-gram, draft-model and DFlash speculation"),
    "steps": ("steps", "", "ms per step of T tokens after N positions; the device loop's whole step"),
    "dflash-step": ("steps", "dflash_", "one DFlash step taken apart, against a decode step"),
    "kernels": ("kernels", "", "Triton kernels against their twins: the small ops, paged attention, the linear"),
    "server": ("server", "", "time to first token and tok/s through tileinfer serve against the engine"),
    "install": ("install", "", "the venv of pip install . against make install's, and generate run in it"),
    "quality": ("quality", "", "weight-only INT8 against the model dtype: KL and top-1 agreement"),
    "grammars": ("grammar_engines", "", "xgrammar against llguidance: schema compile and per-token mask times"),
    "persistent-build": ("persistent_build", "", "the persistent step's kernel as sm_90 builds it, on the CPU: "
                         "registers, spills, programs per SM, load widths"),
    "gemm-build": ("gemm_build", "", "the prefill GEMM as sm_90 builds it, on the CPU: registers, warps, warp "
                   "specialization, the main loop's SASS"),
    "stream-probe": ("stream_probe", "", "how fast a persistent grid streams the weights by each loading scheme "
                     "(registers, cp.async, TMA, warp-specialized)"),
    "defaults": ("quality", "defaults_", "which sampling defaults keep the shipped model from looping"),
    "check": ("gpu", "check_", "one GPU call of measurements beside the matrix: steps, gemv, gemm, spec, ttft, "
              "persistent, int8, stream, attention"),
    "compare": ("gpu", "compare_", "the default config of two commits, alternating, in one GPU call"),
    "gpu-tests": ("gpu", "tests_", "the GPU-marked tests over several processes"),
    "report": ("report", "", "docs/performance.md (and charts) from the records, each table of one commit"),
}


def parser() -> argparse.ArgumentParser:
    listing = "\n".join(f"  {name:<16} {line}" for name, (_, _, line) in COMMANDS.items())
    p = argparse.ArgumentParser(prog="python -m bench", description=bench.__doc__.split("\n\n")[0],
                                epilog=f"commands:\n{listing}\n\n" + bench.__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("command", choices=COMMANDS, metavar="COMMAND", help="one of the commands below")
    p.add_argument("options", nargs=argparse.REMAINDER, help="the command's options (COMMAND --help)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(sys.argv[1:] if argv is None else argv)
    module_name, prefix, line = COMMANDS[args.command]
    module = importlib.import_module(f"bench.{module_name}")
    p = argparse.ArgumentParser(prog=f"python -m bench {args.command}", description=line,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    getattr(module, f"{prefix}arguments")(p)
    return getattr(module, f"{prefix}main")(p.parse_args(args.options))


if __name__ == "__main__":
    sys.exit(main())
