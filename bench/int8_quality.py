"""Quality of weight-only INT8 (``quantize=int8``): mean KL(model dtype || INT8) and top-1 agreement
of the next-token distributions over fixed prompts, every prompt position counted.

Both runs use the same implementations (the reference ops) and model dtype; only ``quantize``
differs. Each model is measured in bfloat16 (as the seed measured "BF16 against INT8") and in
float32 (no rounding of activations to 8 significant bits: INT8's own effect), and bfloat16 is
compared with float32 unquantized, the noise floor of the model dtype. Models:

- ``shipped``: the shipped model (models/target); prompts: ``--prompts`` windows of ``--tokens``
  tokens of the held-out files (models/heldout), which it was not trained on.
- ``outliers``: a random Qwen3 written by transformers' save_pretrained with weight statistics of
  trained checkpoints where per-channel INT8 hurts: Student-t (5 degrees of freedom) weights, and
  in every projection a few input columns 10x larger (the hidden dimensions that carry activation
  outliers in real LLMs), so that those columns set each row's absmax and the other weights of the
  row get fewer levels; std 0.1 so that the next-token distributions are peaked (entropy printed);
  prompts: random token ids.
- ``--model DIR``: any checkpoint folder (e.g. Qwen3-0.6B on a GPU with ``--device cuda``).

    .venv/bin/python bench/int8_quality.py [--models shipped,outliers] [--model DIR] [--device cpu]
                                           [--dtypes bfloat16,float32] [--out bench/results/cpu]

writes ``int8_quality.json`` (one row per model) to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
OUTLIER_COLUMNS = 4  # input columns per projection scaled by OUTLIER_FACTOR
OUTLIER_FACTOR = 4.0


def heldout_prompts(tokenizer, count: int, tokens: int) -> list[list[int]]:
    """``count`` windows of ``tokens`` token ids, taken in turn from the held-out files."""
    files = sorted((ROOT / "models" / "heldout").glob("*.py.txt"))
    ids = [tokenizer.encode(f.read_text()) for f in files]
    prompts = []
    for n in range(count):
        source = ids[n % len(ids)]
        start = (n // len(ids)) * tokens
        prompts.append(source[start:start + tokens])
    return prompts


def random_prompts(vocab: int, count: int, tokens: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (tokens,), generator=g).tolist() for _ in range(count)]


def write_outlier_checkpoint(folder: Path, *, seed: int = 0, hidden: int = 256, layers: int = 4,
                             intermediate: int = 704, vocab: int = 1000, head_std: float = 0.2) -> Path:
    """See the module docstring: each projection's weights ~ Student-t(5) x 1/sqrt(in_features)
    (unit gain, as trained checkpoints are scaled), ``OUTLIER_COLUMNS`` input columns x
    ``OUTLIER_FACTOR`` (row absmax / std ~5, against ~3 in the shipped trained model); unit-variance
    embeddings and an lm_head of std ``head_std`` (0.2: mean next-token entropy ~3 nats, about the
    shipped model's). Non-default config values: GQA 4:2, head_dim 64, rope_theta 1e6."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=1024,
                         rope_theta=1e6, tie_word_embeddings=False, eos_token_id=None)
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(config).eval()
    t = torch.distributions.StudentT(5.0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
            elif "proj" in name:
                w = t.sample(p.shape) / (5 / 3) ** 0.5 / p.shape[1] ** 0.5  # unit-variance Student-t, unit gain
                w[:, torch.randperm(p.shape[1])[:OUTLIER_COLUMNS]] *= OUTLIER_FACTOR
                p.copy_(w)
            elif name == "lm_head.weight":
                p.normal_(0.0, head_std)
            elif p.dim() == 2:
                p.normal_(0.0, 1.0)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    return folder


def prompt_logits(engine, prompts: list[list[int]]) -> torch.Tensor:
    """float32 logits of every position of every prompt, ``[positions, vocab]`` (one forward each)."""
    from tileinfer.interfaces import Step

    rows = []
    with torch.inference_mode():
        for ids in prompts:
            engine.kv.reset()
            engine.kv.reserve(len(ids))
            step = Step.at(0, len(ids), engine.device)
            rows.append(engine.model.forward(torch.tensor(ids, device=engine.device), step, engine.kv)[0].float().cpu())
    return torch.cat(rows)


def compare(reference: torch.Tensor, other: torch.Tensor) -> dict:
    """Mean KL(reference || other) in nats, top-1 agreement, and the reference's mean entropy."""
    lp, lq = reference.double().log_softmax(-1), other.double().log_softmax(-1)
    kl = (lp.exp() * (lp - lq)).sum(-1)
    agree = int((reference.argmax(-1) == other.argmax(-1)).sum())
    entropy = -(lp.exp() * lp).sum(-1)
    return dict(mean_kl=kl.mean().item(), max_kl=kl.max().item(), top1_agree=agree, positions=len(kl),
                top1_fraction=agree / len(kl), reference_entropy=entropy.mean().item())


def measure(folder: Path, prompts: list[list[int]], *, device: str = "cpu",
            dtypes: tuple[str, ...] = ("bfloat16", "float32"), config: str = "reference") -> dict:
    """Per model dtype: ``quantize=int8`` against ``quantize=none`` on ``folder`` (``compare``'s
    figures); and, with both dtypes, bfloat16 against float32 without quantization (the rounding
    noise of the model dtype, for scale). One engine at a time."""
    import tileinfer

    capacity = max(len(p) for p in prompts)
    logits = {}
    for dtype in dtypes:
        for quantize in ("none", "int8"):
            engine = tileinfer.Engine.from_config(config, model=str(folder), device=device, dtype=dtype,
                                                  quantize=quantize, kv_page_size=16,
                                                  kv_capacity=-(-capacity // 16) * 16, progress=False)
            logits[dtype, quantize] = prompt_logits(engine, prompts)
            del engine
    out = {f"int8_vs_{dtype}": compare(logits[dtype, "none"], logits[dtype, "int8"]) for dtype in dtypes}
    if {"bfloat16", "float32"} <= set(dtypes):
        out["bfloat16_vs_float32"] = compare(logits["float32", "none"], logits["bfloat16", "none"])
    return out


def shipped_model() -> Path:
    return ROOT / "models" / "target"


def run_model(name: str, args, work: Path) -> dict:
    if name == "shipped":
        from tileinfer.tokenizer import Tokenizer

        folder = shipped_model()
        prompts = heldout_prompts(Tokenizer.from_folder(folder), args.prompts, args.tokens)
    elif name == "outliers":
        folder = write_outlier_checkpoint(work / "outliers")
        prompts = random_prompts(1000, args.prompts, args.tokens)
    else:
        folder = Path(name)
        prompts = random_prompts(json.loads((folder / "config.json").read_text())["vocab_size"], args.prompts, args.tokens)
    row = dict(model=name, prompts=len(prompts), tokens_per_prompt=args.tokens,
               **measure(folder, prompts, device=args.device, dtypes=tuple(args.dtypes.split(","))))
    for key, r in row.items():
        if isinstance(r, dict):
            print(f"{name:<10} {key:<20} mean KL {r['mean_kl']:.5f} nats (max {r['max_kl']:.4f}), top-1 "
                  f"{r['top1_agree']}/{r['positions']} ({r['top1_fraction']:.3f}), reference entropy "
                  f"{r['reference_entropy']:.2f}", flush=True)
    return row


def main(argv: list[str] | None = None) -> int:
    import tempfile

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="shipped,outliers", help="comma-separated: shipped, outliers")
    p.add_argument("--model", action="append", default=[], metavar="DIR", help="also a checkpoint folder")
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtypes", default="bfloat16,float32", help="model dtypes, each measured against INT8")
    p.add_argument("--out", default=None, help="folder of int8_quality.json (default: print only)")
    args = p.parse_args(argv)
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        rows = [run_model(m, args, Path(tmp)) for m in [*filter(None, args.models.split(",")), *args.model]]
    if args.out:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
        record = dict(script="bench/int8_quality.py", argv=argv if argv is not None else sys.argv[1:],
                      device=args.device, dtypes=args.dtypes, machine=platform.machine(), torch=torch.__version__,
                      commit=commit.stdout.strip() or None, results=rows)
        out = Path(args.out) / "int8_quality.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(record, indent=2) + "\n")
        print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
