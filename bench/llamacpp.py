"""llama.cpp as a peer: its vendored source packed here, llama-bench built and run on the GPU machine.

    python -m bench llamacpp prepare                 # here, once (needs the package index): .peer/llama.cpp.tgz
    python -m bench llamacpp build                   # there: llama-bench (CUDA, sm_90, Ninja), 4-6 minutes
    python -m bench llamacpp bench Qwen3-0.6B        # there (carry .peer and .whl): one shape per call

``prepare`` downloads the llama-cpp-python 0.3.36 sdist and packs its vendored llama.cpp tree without
the models, docs and the ggml backends other than CPU and CUDA (about 7 MB; .peer/ is not in git).
``build`` builds llama-bench under /tmp/llamacpp (once per machine; ``bench`` builds it if needed).
``bench`` converts the random checkpoint the matrix measures (bench/shapes.py, same seed), with the
shipped model's tokenizer beside it (random weights need some tokenizer; llama-bench never
tokenizes), by the tree's own convert_hf_to_gguf.py to a BF16 GGUF and to llama.cpp's Q8_0 (every
2-D weight in blocks of 32 int8 values with a float16 scale; the norms float32). The converter
identifies the pre-tokenizer by hashing its output and refuses an unknown one; the shipped
tokenizer's is declared ``qwen2`` (and read as the BPE vocabulary it is), which changes nothing
llama-bench measures. llama-bench runs each at the matrix's sizes (pp1024 from an empty cache; tg128
at depths 0 and 1024; flash attention, all layers on the GPU, 3 repetitions), and its tests become
matrix records of peers ``llama.cpp`` and ``llama.cpp-q8_0``: ``prefill1024`` (1,024 / its tok/s),
``decode128_ctx1024`` and the empty-cache ``decode128_ctx0``. Roofline fractions as for our rows
(Q8_0 with our INT8 weights' bytes: it reads 34 bytes per 32 weights, so its fraction is understated
by about 6 %). Minutes per shape after the build: about 1 for BF16, 1 to 3 more for Q8_0.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import torch

from . import records
from .shapes import CHECKPOINTS, SHAPES, decode_roofline_tok_s, model_config, prefill_flops, write_random_checkpoint
from .timing import measure_limits

ROOT = Path(__file__).resolve().parents[1]
VERSION = "0.3.36"
ARCHIVE = ROOT / ".peer" / "llama.cpp.tgz"
BUILD = Path("/tmp/llamacpp")
OUTTYPES = {"bf16": "llama.cpp", "q8_0": "llama.cpp-q8_0"}  # GGUF type -> the matrix's peer name
DROPPED = ("cann", "openvino", "webgpu", "et", "metal", "hexagon", "sycl", "vulkan", "opencl", "virtgpu", "zdnn",
           "zendnn", "musa", "hip")
# Run with the tree and its gguf-py on PYTHONPATH: the converter, told the pre-tokenizer and the vocabulary.
CONVERT = """import sys
import conversion.base as base
import conversion.qwen as qwen
base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "qwen2"
qwen.Qwen2Model.set_vocab = lambda self: self._set_vocab_gpt2()
import convert_hf_to_gguf
sys.argv = ["convert_hf_to_gguf.py", *sys.argv[1:]]
convert_hf_to_gguf.main()
"""


def prepare() -> None:
    with tempfile.TemporaryDirectory() as work:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
                        f"llama-cpp-python=={VERSION}", "-d", work], check=True)
        with tarfile.open(f"{work}/llama_cpp_python-{VERSION}.tar.gz") as tar:
            tar.extractall(work, filter="data")
        tree = Path(work) / f"llama_cpp_python-{VERSION}" / "vendor" / "llama.cpp"
        for sub in ("models", "docs", "media", "tools/ui", "benches", ".github",
                    *(f"ggml/src/ggml-{b}" for b in DROPPED)):
            shutil.rmtree(tree / sub, ignore_errors=True)
        (tree / "models").mkdir()
        ARCHIVE.parent.mkdir(exist_ok=True)
        with tarfile.open(ARCHIVE, "w:gz") as tar:
            tar.add(tree, arcname="llama.cpp")
    print(f"wrote {ARCHIVE} ({ARCHIVE.stat().st_size / 1e6:.1f} MB)")


def build(jobs: int) -> Path:
    """llama-bench under BUILD (built once per machine); its path."""
    binary = BUILD / "out" / "bin" / "llama-bench"
    if binary.is_file():
        return binary
    if not ARCHIVE.is_file():
        raise SystemExit(f"error: {ARCHIVE} is missing: run 'python -m bench llamacpp prepare' here and carry .peer")
    BUILD.mkdir(parents=True, exist_ok=True)
    with tarfile.open(ARCHIVE) as tar:
        tar.extractall(BUILD, filter="data")
    log = (BUILD / "build.log").open("w")
    subprocess.run(["cmake", "-S", BUILD / "llama.cpp", "-B", BUILD / "out", "-G", "Ninja",
                    "-DCMAKE_BUILD_TYPE=Release", "-DGGML_CUDA=ON", "-DCMAKE_CUDA_ARCHITECTURES=90",
                    "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_SERVER=OFF",
                    "-DLLAMA_CURL=OFF"],
                   stdout=log, stderr=subprocess.STDOUT, check=True)
    subprocess.run(["cmake", "--build", BUILD / "out", "--target", "llama-bench", f"-j{jobs}"], stdout=log,
                   stderr=subprocess.STDOUT, check=True)
    return binary


def convert(folder: Path, tree: Path, out: Path, outtype: str = "bf16") -> None:
    """A transformers Qwen3 checkpoint folder (the shipped tokenizer copied into it) as a GGUF
    ``out`` of ``outtype`` (``bf16`` or ``q8_0``), by the llama.cpp ``tree``'s converter."""
    if outtype not in OUTTYPES:
        raise ValueError(f"outtype {outtype!r}; valid: {', '.join(OUTTYPES)}")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(ROOT / "models" / "target" / name, Path(folder) / name)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree), str(tree / "gguf-py")])}
    subprocess.run([sys.executable, "-c", CONVERT, str(folder), "--outtype", outtype, "--outfile", str(out)],
                   env=env, check=True)


def rows(tests: list[dict], shape: str, peer: str, limits: dict) -> list[dict]:
    """llama-bench's JSON tests (``-o json``) as matrix records' figures; tests at other sizes are left out."""
    mc = model_config(shape)
    layout = {"quantize": "int8"} if peer.endswith("q8_0") else {}
    out = []
    for test in tests:
        prompt, gen, depth = test["n_prompt"], test["n_gen"], test.get("n_depth", 0)
        kind = test.get("model_type", "").rsplit(" ", 1)[-1].lower()  # e.g. "qwen3 4B Q8_0"
        if kind and kind in OUTTYPES and OUTTYPES[kind] != peer:
            raise ValueError(f"llama-bench measured a {kind} model, not the {peer} asked for")
        tok_s = test["avg_ts"]
        row = {"shape": shape, "variant": None, "peer": peer, "unit": "tok/s", "value": tok_s,
               "samples": test.get("samples_ts", []), "roofline_tok_s": None, "roofline_fraction": None,
               "tflops": None, "peak_fraction": None, "prompt_tokens": prompt or depth, "new_tokens": gen or 1,
               "part": None, "note": f"llama-bench {test.get('build_commit', '')} n_prompt={prompt} n_gen={gen} "
               f"n_depth={depth}", **limits}
        if prompt == 1024 and gen == 0 and depth == 0:
            row.update(workload="prefill1024", unit="ms", value=1024 / tok_s * 1e3, samples=[])
            row["tflops"] = prefill_flops(mc, 1024)["total"] / (row["value"] / 1e3) / 1e12
            row["peak_fraction"] = row["tflops"] / limits["matmul_peak_tflops"]
        elif prompt == 0 and gen == 128:
            roof = decode_roofline_tok_s(mc, depth, gen, limits["copy_bandwidth_tb_s"] * 1e12, **layout)
            row.update(workload=f"decode128_ctx{depth}", roofline_tok_s=roof, roofline_fraction=tok_s / roof)
        else:
            continue
        out.append(row)
    return out


def bench(args) -> int:
    binary = build(args.jobs)
    limits = measure_limits(torch.device("cuda")).figures()
    run = records.Run("cuda", commit=args.commit, path=args.records)
    for shape in args.shapes:
        folder = write_random_checkpoint(shape, args.checkpoints / shape)
        for outtype in args.types:
            gguf = BUILD / f"{shape}.{outtype}.gguf"
            if not gguf.is_file():  # written once per machine, under another name until complete
                convert(folder, BUILD / "llama.cpp", gguf.with_suffix(".part"), outtype)
                gguf.with_suffix(".part").rename(gguf)
            result = subprocess.run([binary, "-m", gguf, "-p", "1024", "-n", "128", "-d", "0,1024", "-ngl", "99",
                                     "-fa", "1", "-r", "3", "-o", "json"], capture_output=True, text=True, check=True)
            for row in rows(json.loads(result.stdout), shape, OUTTYPES[outtype], limits):
                run.add("matrix", **row)
                print(f"{shape:11} {row['peer']:15} {row['workload']:18} {row['value']:10.1f} {row['unit']}",
                      flush=True)
    print(f"appended {len(run.records)} records to {run.path}")
    return 0


def arguments(p) -> None:
    p.description, p.epilog = __doc__.split("\n\n")[0], __doc__.split("\n\n", 1)[1]
    p.add_argument("action", choices=("prepare", "build", "bench"))
    p.add_argument("shapes", nargs="*", metavar="SHAPE", help=f"bench: the shapes to measure ({', '.join(SHAPES)})")
    p.add_argument("--types", type=lambda s: s.split(","), default=list(OUTTYPES),
                   help="GGUF types (default bf16,q8_0)")
    p.add_argument("--jobs", type=int, default=16, help="build processes")
    p.add_argument("--checkpoints", type=Path, default=CHECKPOINTS, help="where random checkpoints are written once")
    records.arguments(p)


def main(args) -> int:
    if args.action == "prepare":
        prepare()
    elif args.action == "build":
        print(f"built {build(args.jobs)}")
    else:
        if not args.shapes or set(args.shapes) - set(SHAPES) or set(args.types) - set(OUTTYPES):
            print(f"error: bench needs shapes of {', '.join(SHAPES)} and --types of {', '.join(OUTTYPES)}",
                  file=sys.stderr)
            return 2
        return bench(args)
    return 0
