"""The GPU machine's calls that run several benchmarks or the GPU tests, each within one 10-minute
device call: ``check`` (the measurements beside the matrix), ``compare`` (the default config of two
commits) and ``gpu-tests``. Each runs ``python -m bench ...`` or pytest in subprocesses, each step
stopped at its share of the call's time so that the call returns with what was measured.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from . import records

ROOT = Path(__file__).resolve().parents[1]
SPEC_K = ["--k", "ngram=7,15", "--k", "draft=3,7", "--k", "dflash=7,15"]
LOOPS = ["--loop", "ngram@7", "--loop", "ngram@15", "--loop", "draft@3", "--loop", "draft@7", "--loop", "dflash@7",
         "--loop", "dflash@15"]
TTFT_NAMES = [a for name in ("default", "torch-matmul", "hf-sdpa", "engine-compiled")
              for a in ("--variant", name)]
ON_GPU = "tests/plugins/test_persistent_gpu.py::test_"
# check -> (seconds at most, the command's arguments) for each step, with minutes estimated for the whole
# check (setup, checkpoints and Triton compilation included, the machine's start not)
CHECKS = {
    "steps": [(300, ["steps", "--profile", "--variant", "default", "--variant", "no-pdl"]),
              (90, ["steps", "--model", "models/target", "--contexts", "1024", "--loop", "ngram@15", "--loop",
                    "draft@7", "--loop", "dflash@7"])],
    "gemv": [(200, ["kernels", "linear", "--sweep", "--tokens", "1,2,16", "--repeats", "20"]),
             (120, ["kernels", "paged_attention", "--kv", "bf16,int8", "--contexts", "8192,32768"])],
    # the persistent TMA candidates of both formats against the rule, the tiled rule and cuBLAS at T = 128..32k
    # (every Qwen3-4B linear); then every persistent W8A16 candidate at T = 1,024 and 4,096
    "gemm": [(330, ["kernels", "linear", "--sweep", "--sweep-filter", "tma", "--models", "Qwen3-4B", "--formats",
                    "bf16", "--layers", "qkv,o_proj,gate_up,down", "--tokens", "128,1024,4096,32768", "--repeats",
                    "10"]),
             (210, ["kernels", "linear", "--sweep", "--sweep-filter", "persistent", "--models", "Qwen3-4B",
                    "--formats", "int8", "--tokens", "1024,4096", "--repeats", "10"])],
    "spec": [(330, ["spec", "--device", "cuda", "--new-tokens", "256", "--repeats", "3", *SPEC_K]),
             (90, ["steps", "--model", "models/target", "--contexts", "1024", "--repeats", "40", *LOOPS]),
             (150, ["dflash-step"])],
    # issue 29's table: 1,024 tokens against cuBLAS linears and the peers, INT8 (dequantized, the default from 1,024
    # tokens, and the W8A16 GEMM throughout) against BF16;
    # 8k / 32k against cuBLAS linears, the follow-up turn; INT8 at 50 and 256 tokens (its target there: >= BF16)
    "ttft": [(260, ["matrix", "--shape", "Qwen3-0.6B", "--shape", "Qwen3-4B", *TTFT_NAMES, "--variant", "int8",
                    "--variant", "int8+options.triton.int8_prefill_dequant=0", "--workload", "prefill1024"]),
             (180, ["matrix", "--shape", "Qwen3-4B", "--variant", "default", "--variant", "torch-matmul", "--workload",
                    "prefill8192", "--workload", "prefill32768", "--workload", "prefill50", "--workload",
                    "prefill50_after4000", "--no-peers"]),
             (140, ["matrix", "--shape", "Qwen3-0.6B", "--shape", "Qwen3-4B", "--variant", "default", "--variant",
                    "int8", "--workload", "prefill50", "--workload", "prefill64", "--workload", "prefill128",
                    "--workload", "prefill256", "--no-peers"])],
    "persistent": [(500, ["steps", "--variant", "default", "--variant", "persistent",
                          "--variant", "persistent+options.persistent.stages=1",
                          "--variant", "persistent+options.persistent.split_k=1",
                          "--variant", "persistent+options.persistent.item_calls=true"
                          "+options.persistent.max_registers=128+options.persistent.programs_per_sm=4",
                          "--variant", "int8-persistent",
                          "--variant", "persistent+options.persistent.timeline=true", "--tokens", "1,16"])],
    "int8": [(280, ["steps", "--variant", "default", "--variant", "int8",
                    "--variant", "int8+options.triton.int8_convert=permute",
                    "--variant", "int8+options.triton.int8_convert=cast", "--tokens", "1,16"]),
             (240, ["steps", "--variant", "default", "--variant", "int8-kv", "--variant", "int8-int8-kv",
                    "--contexts", "32768", "--tokens", "1,16"])],
    # int8 weights in the fragments layout against rows and BF16: every Qwen3-4B layer at prefill T = 64..1,024 (the
    # rule's tile with bits and, as a sweep row, with permute) and the GEMVs; then the engine's decode step
    "int8_layout": [(300, ["kernels", "linear", "--models", "Qwen3-4B", "--formats", "bf16,int8,int8f", "--tokens",
                           "1,16,64,256,1024", "--sweep", "--sweep-filter", "permute", "--repeats", "10"]),
                    (240, ["steps", "--variant", "default", "--variant", "int8",
                           "--variant", "int8+options.triton.int8_layout=fragments",
                           "--variant", "int8+options.triton.int8_layout=fragments+options.triton.int8_convert=permute",
                           "--tokens", "1,16"])],
    # issue 29's INT8 prefill through the BF16 GEMM (options.triton.int8_prefill_dequant): every Qwen3-4B decoder layer
    # in bf16, int8 (W8A16) and int8d (dequantized, then the BF16 GEMM with the scales, timed as one call) at
    # T = 256..4,096; then the 4B prefill in the engine, int8 (the option's default: from 1,024 tokens) against
    # the W8A16 GEMM throughout, from 512 tokens and BF16
    "int8_dequant": [(300, ["kernels", "linear", "--models", "Qwen3-4B", "--layers", "qkv,o_proj,gate_up,down",
                            "--formats", "bf16,int8,int8d", "--tokens", "256,1024,4096", "--repeats", "10"]),
                     (240, ["matrix", "--shape", "Qwen3-4B", "--variant", "int8",
                            "--variant", "int8+options.triton.int8_prefill_dequant=0",
                            "--variant", "int8+options.triton.int8_prefill_dequant=512", "--variant", "default",
                            "--workload", "prefill1024", "--workload", "prefill8192", "--no-peers"])],
    # issue 31's target: decoding under a JSON schema against unconstrained, plain and with n-gram drafts (random
    # weights with a stand-in tokenizer of Qwen3's size; then the shipped model, whose n-gram drafts are real)
    "json": [(300, ["matrix", "--shape", "Qwen3-4B", "--variant", "default", "--variant", "ngram", "--workload",
                    "decode128_ctx1024", "--workload", "decode128_json_ctx1024", "--no-peers", "--seconds", "2"]),
             (150, ["matrix", "--model", "models/target", "--variant", "default", "--variant", "ngram", "--workload",
                    "decode128_ctx1024", "--workload", "decode128_json_ctx1024", "--no-peers", "--seconds", "2"])],
    # what closes issue 28 where device time is scarce (issue 31's target: check json): speculative greedy = plain
    # greedy at the Qwen3 shapes with the shipped persistent defaults and on the shipped family (the structured
    # generation's GPU cases beside them), then the shipped family's device loop over both steps
    "close": [(360, ["gpu-tests", f"{ON_GPU}speculative_greedy_gives_plain_greedy_tokens_at_the_qwen3_shapes",
                     f"{ON_GPU}the_shipped_family_in_the_persistent_step_gives_plain_greedy_tokens",
                     "tests/core/test_structured_generation.py", "--workers", "3", "--seconds", "350"]),
              (150, ["steps", "--model", "models/target", "--contexts", "1024", "--variant", "default",
                     "--variant", "persistent", "--loop", "ngram@15", "--loop", "draft@7", "--loop", "dflash@7"])],
    "stream": [(150, ["stream-probe"]),
               (90, ["stream-probe", "--shape", "Qwen3-4B", "--programs-per-sm", "2"]),
               (150, ["steps", "--model", "models/target", "--contexts", "1024", "--variant", "default",
                      "--variant", "persistent", "--loop", "ngram@15", "--loop", "draft@7", "--loop", "dflash@7"])],
    # the prefill attention's tile shapes against the rule: 8k and 32k prompts in the engine's 4,096-token chunks
    # over pages of 64 (the engine's), then of 128 (a 128-key tile in one page)
    "attention": [(300, ["kernels", "paged_attention", "--prefill-prompts", "8192,32768", "--repeats", "20"]),
                  (180, ["kernels", "paged_attention", "--prefill-prompts", "8192,32768", "--page-size", "128",
                         "--prefill-tiles", "rule,128x64,128x128", "--repeats", "20"])],
    # short prompts (50-256 tokens), where the tile rules' cost model is weakest: the BF16 and W8A16 candidates of
    # every decoder layer (unflattened and split persistent tiles, 64-row W8A16 SwiGLU tiles), then the engine
    "short": [(330, ["kernels", "linear", "--sweep", "--models", "Qwen3-0.6B,Qwen3-4B", "--formats", "bf16,int8",
                     "--layers", "qkv,o_proj,gate_up,down", "--tokens", "50,128,256", "--repeats", "10"]),
              (150, ["matrix", "--shape", "Qwen3-0.6B", "--shape", "Qwen3-4B", "--variant", "default", "--variant",
                     "torch-matmul", "--variant", "int8", "--workload", "prefill50", "--workload", "prefill128",
                     "--workload", "prefill256", "--no-peers"])],
    # issue 29's short prompts: the W8A16 rule's GPU cases (its split tails and fragments layout, graphed prefill),
    # then its layers at 50 to 1,024 tokens against the BF16 Triton GEMM and cuBLAS (`check ttft` has the engine's)
    "prefill": [(150, ["gpu-tests", "tests/backends/triton/test_linear_gemm_persistent.py",
                       "tests/backends/triton/test_linear_layout.py", "tests/core/test_prefill_graphs.py", "-k",
                       "int8 or split or graphed or fragments", "--workers", "4", "--seconds", "140"]),
                (120, ["kernels", "linear", "--models", "Qwen3-0.6B,Qwen3-4B", "--formats", "int8", "--layers",
                       "qkv,o_proj,gate_up,down", "--tokens", "50,64,128,256,1024", "--repeats", "10"])],
}
MINUTES = {"steps": 6, "gemv": 6, "gemm": 9, "spec": 7, "ttft": 8, "persistent": 10, "int8": 10, "stream": 8,
           "attention": 7, "int8_layout": 10, "json": 8, "close": 10, "int8_dequant": 9, "prefill": 5,
           "short": 8}


def step_argv(argv: list[str], extra: list[str]) -> list[str]:
    """A step's command line: its arguments, then ``extra`` (--commit, --records) where it writes records."""
    return argv if argv[0] == "gpu-tests" else [*argv, *extra]


def run_steps(steps: list[tuple[float, list[str]]], budget: float, extra: list[str], env: dict | None = None,
              cwd: Path = ROOT) -> list[int]:
    """``python -m bench ARGS EXTRA`` for each (seconds, ARGS), each stopped at its seconds or what
    is left of ``budget``; the exit statuses (124: stopped)."""
    began, statuses = time.monotonic(), []
    for seconds, argv in steps:
        left = budget - (time.monotonic() - began)
        if left < 30:
            print(f"out of time before: {' '.join(argv)}", flush=True)
            statuses.append(124)
            continue
        print(f"[{time.strftime('%H:%M:%S')}] python -m bench {' '.join(argv)}", flush=True)
        try:
            statuses.append(subprocess.run([sys.executable, "-m", "bench", *step_argv(argv, extra)], cwd=cwd, env=env,
                                           timeout=min(seconds, left)).returncode)
        except subprocess.TimeoutExpired:
            statuses.append(124)
        print(f"  exit {statuses[-1]} (124: stopped, the records measured are kept)", flush=True)
    return statuses


def check_arguments(p) -> None:
    listing = "\n".join(f"  {name:<6} ~{MINUTES[name]} min: " + "; ".join(" ".join(a) for _, a in steps)
                        for name, steps in CHECKS.items())
    p.description = __doc__.split("\n\n")[0]
    p.epilog = "checks (python -m bench ...):\n" + listing
    p.add_argument("check", choices=CHECKS)
    p.add_argument("--seconds", type=float, default=560, help="the whole check's time (default %(default)s)")
    records.arguments(p)


def check_main(args) -> int:
    extra = [*(["--commit", args.commit] if args.commit else []), *(["--records", str(args.records)] if args.records
                                                                     else [])]
    statuses = run_steps(CHECKS[args.check], args.seconds, extra)
    return max(statuses)


def compare_arguments(p) -> None:
    p.description = ("The default config of two commits in one call: prefill1024 and decode128_ctx1024 at both GPU "
                     "shapes, each commit's own `python -m bench matrix`, alternating (A B A B ... for --rounds), so "
                     "that a drift of the machine shows as spread between rounds of one commit; both commits need "
                     "`python -m bench`. Each side runs from "
                     "a package folder made of its core/, backends/, plugins/ and configs/ (no install, so that the "
                     "two never mix). The other side's tree, here, once: mkdir -p .ab/before && git archive OLD core "
                     "backends plugins configs bench | tar -x -C .ab/before (carry .ab). Records: kind compare, "
                     "each with its side and round.")
    p.add_argument("--before", type=Path, default=ROOT / ".ab" / "before", help="the other commit's tree "
                   "(default .ab/before)")
    p.add_argument("--before-commit", required=True, help="the other commit's hash, recorded")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--seconds", type=float, default=2, help="time budget per row")
    p.add_argument("--shape", action="append", default=[], help="default: Qwen3-0.6B and Qwen3-4B")
    p.add_argument("--model", type=Path, help="a checkpoint folder instead of the random shapes (e.g. models/target)")
    p.add_argument("--budget", type=float, default=420, help="seconds for the whole comparison")
    records.arguments(p)


def package(tree: Path, folder: Path) -> Path:
    """``folder/tileinfer`` laid out as pyproject.toml's package-dir maps ``tree``."""
    shutil.rmtree(folder, ignore_errors=True)
    shutil.copytree(tree / "core", folder / "tileinfer")
    for sub in ("backends", "plugins", "configs", "models"):
        if (tree / sub).is_dir():
            shutil.copytree(tree / sub, folder / "tileinfer" / sub)
    return folder


def compare_main(args) -> int:
    if not (args.before / "core" / "engine.py").is_file():
        print(f"error: {args.before} holds no tileinfer tree (see --help)", file=sys.stderr)
        return 2
    sides = {"before": (args.before, args.before_commit), "after": (ROOT, args.commit or records.git_commit())}
    where = ["--model", str(args.model.resolve())] if args.model else [
        a for s in args.shape or ["Qwen3-0.6B", "Qwen3-4B"] for a in ("--shape", s)]
    began, found = time.monotonic(), []
    for round_ in range(1, args.rounds + 1):
        for side, (tree, commit) in sides.items():
            folder = package(tree, Path(f"/tmp/ab/{side}"))
            out = Path(f"/tmp/ab-runs/{side}-{round_}.jsonl")
            out.unlink(missing_ok=True)
            env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(folder),
                                                                             os.environ.get("PYTHONPATH")]))}
            argv = ["matrix", *where, "--variant", "default", "--workload", "prefill1024", "--workload",
                    "decode128_ctx1024", "--seconds", str(args.seconds), "--no-peers", "--commit", commit]
            left = args.budget - (time.monotonic() - began)
            run_steps([(left, argv)], left, ["--records", str(out)], env=env, cwd=tree.resolve())
            found += [{**r, "kind": "compare", "side": side, "round": round_} for r in records.load(out)
                      if r["value"] is not None]
    if not found:
        print("error: neither side recorded a row (their output is above)", file=sys.stderr)
        return 1
    records.append(args.records or records.RESULTS / records.machine(found[0]["versions"]["gpu"]) / "records.jsonl",
                   found)
    print(compare_table(found))
    return 0


def compare_table(rows: list[dict]) -> str:
    """Per shape and workload: each round's figure of each side, the medians, and after / before of
    the medians as a speed ratio (> 1: faster after, for prefill milliseconds too)."""
    from .report import markdown

    def speed(r: dict) -> float:
        return 1 / r["value"] if r["unit"] == "ms" else r["value"]

    body = []
    for shape, workload in sorted({(r["shape"], r["workload"]) for r in rows}):
        sides = {s: sorted((r for r in rows if (r["shape"], r["workload"], r["side"]) == (shape, workload, s)),
                           key=lambda r: r["round"]) for s in ("before", "after")}
        cells = [", ".join(f"{r['value']:.4g}" for r in sides[s]) or "-" for s in sides]
        medians = [f"{statistics.median(r['value'] for r in sides[s]):.4g} {sides[s][0]['unit']}" if sides[s] else "-"
                   for s in sides]
        ratio = "-"
        if all(sides.values()):
            after, before = (statistics.median(map(speed, sides[s])) for s in ("after", "before"))
            ratio = f"x{after / before:.3f}"
        body.append([shape, workload, *cells, *medians, ratio])
    commits = {s: ", ".join(sorted({r["commit"] for r in rows if r["side"] == s})) for s in ("before", "after")}
    return (markdown(["shape", "workload", "before (each round)", "after (each round)", "before, median",
                      "after, median", "after / before (speed)"], body)
            + f"\n\nbefore: {commits['before']}; after: {commits['after']}")


def tests_arguments(p) -> None:
    p.description = ("The GPU-marked tests (pytest -m gpu), over --workers processes with pytest-xdist where it "
                     "imports (bench/device.sh carries it; in one process the GPU tests take more than 9 minutes), "
                     "each test to the next free worker, one line a test; after --seconds pytest is interrupted, so "
                     "that it still prints the failures so far.")
    p.add_argument("paths", nargs="*", default=["tests"], help="test paths (default: tests)")
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--seconds", type=float, default=540)
    p.add_argument("-k", dest="keyword", help="pytest's -k: only the tests whose names match this expression")


def tests_main(args) -> int:
    import importlib.util
    import signal

    workers = ["-n", str(args.workers), "--dist", "load"] if importlib.util.find_spec("xdist") else []
    argv = [sys.executable, "-m", "pytest", "-v", "-rfE", "-p", "no:cacheprovider", "-m", "gpu", "--durations=15",
            *workers, *(["-k", args.keyword] if args.keyword else []), *args.paths]
    proc = subprocess.Popen(argv, cwd=ROOT)
    try:
        return proc.wait(timeout=args.seconds)
    except subprocess.TimeoutExpired:
        print(f"stopped after {args.seconds:.0f} s: interrupting pytest for its summary", flush=True)
        proc.send_signal(signal.SIGINT)  # pytest prints the failures so far on KeyboardInterrupt
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        return 124
