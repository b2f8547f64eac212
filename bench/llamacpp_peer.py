"""The llama.cpp peer's two steps in Python (bench/llamacpp.sh runs them on the GPU machine).

    python bench/llamacpp_peer.py gguf --shape NAME --tree LLAMA_CPP_DIR --out FILE.gguf [--outtype q8_0]
    python bench/llamacpp_peer.py records --commit HASH --out results.json SHAPE[.q8_0].bench.json...

``gguf``: the random checkpoint bench/run.py measures (bench/shapes.py, same seed), with the shipped
model's tokenizer beside it (random weights need some tokenizer; llama-bench never tokenizes),
converted by the tree's own convert_hf_to_gguf.py (its gguf-py package writes the file) to a BF16
GGUF, or with ``--outtype q8_0`` to llama.cpp's Q8_0: every 2-D weight (the token embedding, which
is also the tied lm_head, included) in blocks of 32 int8 values along a row with one float16
scale (34 bytes), gguf-py's ``quants.quantize``; the norms stay float32. The converter identifies
the pre-tokenizer by hashing its output and refuses an unknown one; the shipped tokenizer's is
unknown, so it is declared ``qwen2`` (and read as the BPE vocabulary it is, without the
sentencepiece try first), which changes nothing llama-bench measures.

``records``: llama-bench's JSON (``-o json``) as rows of the benchmark matrix (bench/records.py),
peer ``llama.cpp`` (``SHAPE.bench.json``, the BF16 GGUF) or ``llama.cpp-q8_0``
(``SHAPE.q8_0.bench.json``): ``prefill1024`` (ms for the 1,024-token prompt from an empty cache:
1,024 / its tok/s) and ``decode128_ctx1024`` (128 tokens generated after 1,024 cached positions,
its ``-d 1024`` test); the empty-cache ``tg128`` goes in ``decode128_ctx0``, the figure llama-bench
reports by default. Roofline fractions as for our own rows: BF16 weights and KV, or for Q8_0 the
INT8 weights' bytes of our int8 variant (Q8_0 reads 34 bytes per 32 weights, about 6 % more, so
its fraction of the roofline is understated by that much).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))

SHIPPED_TOKENIZER = ("tokenizer.json", "tokenizer_config.json")
OUTTYPES = {"bf16": "llama.cpp", "q8_0": "llama.cpp-q8_0"}  # GGUF type -> the matrix's peer name


def to_gguf(shape: str, tree: Path, out: Path, checkpoints: Path, outtype: str = "bf16") -> None:
    """The random checkpoint of ``shape`` (written under ``checkpoints`` if not there) as a GGUF."""
    from shapes import write_random_checkpoint

    convert(write_random_checkpoint(shape, checkpoints / shape), tree, out, outtype)


def convert(folder: Path, tree: Path, out: Path, outtype: str = "bf16") -> None:
    """A transformers Qwen3 checkpoint folder (the shipped tokenizer copied into it) as a GGUF
    ``out`` of ``outtype`` (``bf16`` or ``q8_0``), by the llama.cpp ``tree``'s converter."""
    if outtype not in OUTTYPES:
        raise ValueError(f"outtype {outtype!r}; valid: {', '.join(OUTTYPES)}")
    for name in SHIPPED_TOKENIZER:
        shutil.copy(HERE.parent / "models" / "target" / name, Path(folder) / name)
    sys.path[:0] = [str(tree), str(tree / "gguf-py")]
    import conversion.base as base  # the tree's converter package
    import conversion.qwen as qwen

    base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "qwen2"
    qwen.Qwen2Model.set_vocab = lambda self: self._set_vocab_gpt2()  # BPE: no sentencepiece import
    import convert_hf_to_gguf

    argv = sys.argv
    sys.argv = ["convert_hf_to_gguf.py", str(folder), "--outtype", outtype, "--outfile", str(out)]
    try:
        convert_hf_to_gguf.main()
    finally:
        sys.argv = argv


def source(path: Path) -> tuple[str, str]:
    """(shape, peer) of a llama-bench record named ``SHAPE.bench.json`` (BF16) or
    ``SHAPE.q8_0.bench.json``."""
    stem = path.name.removesuffix(".bench.json")
    head, _, tail = stem.rpartition(".")  # "Qwen3-0.6B" has a dot of its own
    return (head, OUTTYPES[tail]) if tail in OUTTYPES else (stem, OUTTYPES["bf16"])


def to_records(files: list[Path], commit: str) -> list[dict]:
    import torch

    import limits as limits_mod
    import records
    from roofline import decode_roofline_tok_s, prefill_flops
    from shapes import SHAPES
    from tileinfer.model_config import ModelConfig

    env = records.environment(limits_mod.measure(torch.device("cuda")), commit)
    rows = []
    for path in files:
        shape, peer = source(path)
        layout = {"quantize": "int8"} if peer.endswith("q8_0") else {}
        mc = ModelConfig.from_dict({**SHAPES[shape], "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3"})
        for test in json.loads(path.read_text()):
            prompt, gen, depth = test["n_prompt"], test["n_gen"], test.get("n_depth", 0)
            kind = test.get("model_type", "").rsplit(" ", 1)[-1].lower()  # e.g. "qwen3 4B Q8_0"
            if kind and kind in OUTTYPES and OUTTYPES[kind] != peer:
                raise ValueError(f"{path}: llama-bench measured a {kind} model, not the {peer} its name says")
            tok_s = test["avg_ts"]
            row = {"shape": shape, "variant": None, "peer": peer, "unit": "tok/s", "value": tok_s,
                   "samples": test.get("samples_ts", []), "roofline_fraction": None, "tflops": None,
                   "peak_fraction": None, "note": f"llama-bench {test.get('build_commit', '')} "
                   f"n_prompt={prompt} n_gen={gen} n_depth={depth}", **env}
            if prompt == 1024 and gen == 0 and depth == 0:
                row.update(workload="prefill1024", unit="ms", value=1024 / tok_s * 1e3, samples=[])
                row["tflops"] = prefill_flops(mc, 1024)["total"] / (row["value"] / 1e3) / 1e12
                row["peak_fraction"] = row["tflops"] / env["matmul_peak_tflops"]
            elif prompt == 0 and gen == 128:
                row["workload"] = f"decode128_ctx{depth}"
                roof = decode_roofline_tok_s(mc, depth, gen, env["copy_bandwidth_tb_s"] * 1e12, **layout)
                row.update(roofline_tok_s=roof, roofline_fraction=tok_s / roof)
            else:
                continue
            rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    g = sub.add_parser("gguf", help="the random checkpoint of a shape as a BF16 (or Q8_0) GGUF")
    g.add_argument("--shape", required=True)
    g.add_argument("--outtype", choices=list(OUTTYPES), default="bf16")
    g.add_argument("--tree", type=Path, required=True, help="the llama.cpp source tree")
    g.add_argument("--out", type=Path, required=True)
    g.add_argument("--checkpoints", type=Path, default=Path("/tmp/tileinfer-checkpoints"))
    r = sub.add_parser("records",
                       help="llama-bench JSON files (SHAPE.bench.json, SHAPE.q8_0.bench.json) as matrix rows")
    r.add_argument("files", nargs="+", type=Path)
    r.add_argument("--commit", required=True)
    r.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    if args.command == "gguf":
        to_gguf(args.shape, args.tree, args.out, args.checkpoints, args.outtype)
    else:
        rows = to_records(args.files, args.commit)
        args.out.write_text(json.dumps(rows, indent=1) + "\n")
        for row in rows:
            print(f"{row['shape']:11} {row['peer']:15} {row['workload']:18} {row['value']:10.1f} {row['unit']}")


if __name__ == "__main__":
    main()
