"""The quality of what a configuration generates: weight-only INT8 against the model dtype
(``quality``), and which sampling defaults keep the shipped model from looping (``defaults``).

``quality``: mean KL(model dtype || INT8) and top-1 agreement of the next-token distributions over
fixed prompts, every prompt position counted. Both runs use the same implementations (the reference
ops) and model dtype; only ``quantize`` differs. Each model is measured in bfloat16 and in float32
(no rounding of activations to 8 significant bits: INT8's own effect), and bfloat16 is compared with
float32 unquantized, the noise floor of the model dtype. Models: ``shipped`` (models/target;
prompts: windows of the held-out files, which it was not trained on), ``outliers`` (a random Qwen3
with weight statistics of trained checkpoints where per-channel INT8 hurts: Student-t (5 degrees of
freedom) weights and in every projection a few input columns 4x larger, so that those columns set
each row's absmax; prompts: random token ids), and any checkpoint folder (``--model DIR``).
Records: kind ``int8_quality``, one per model and comparison.

``defaults``: candidate sampling settings generate from held-out prompts (the ``def`` lines of the
held-out files, each alone, as the README's first command gives ``def fibonacci(n):``) with the
reference CPU engine, ``--new-tokens`` each, scored per reply: ``loops`` (it ran to the length
limit and its second half is one cycle of at most a quarter of its length repeated),
``repeated_line`` (a non-blank line of 4+ characters occurs 3 or more times), ``distinct_2``
(distinct token bigrams over bigrams). The chosen setting has the fewest looping replies, then the
fewest repeated lines, then is greedy (reproducible without a seed), then is the mildest change
from plain greedy decoding. Records: kind ``generation_defaults``, one per candidate (``chosen``
marks the choice); models/target/generation_config.json is set from it by hand.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import torch

from tileinfer.interfaces import SamplingParams
from tileinfer.models import prompts as prompts_mod

from . import records

OUTLIER_COLUMNS = 4  # input columns per projection scaled by OUTLIER_FACTOR
OUTLIER_FACTOR = 4.0
README_PROMPT = "def fibonacci(n):"
SEEDS = (0, 1, 2)
# name -> SamplingParams fields (seeded candidates run once per seed)
CANDIDATES = {
    "greedy": {},
    "greedy+rep1.05": {"repetition_penalty": 1.05},
    "greedy+rep1.1": {"repetition_penalty": 1.1},
    "greedy+rep1.15": {"repetition_penalty": 1.15},
    "greedy+rep1.2": {"repetition_penalty": 1.2},
    "greedy+rep1.3": {"repetition_penalty": 1.3},
    "greedy+freq0.5": {"frequency_penalty": 0.5},
    "t0.6+p0.95+k20": {"temperature": 0.6, "top_p": 0.95, "top_k": 20},
    "t0.8+p0.95": {"temperature": 0.8, "top_p": 0.95},
    "t0.6+p0.95+k20+rep1.1": {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "repetition_penalty": 1.1},
    "t0.6+p0.95+k20+rep1.2": {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "repetition_penalty": 1.2},
}


def heldout_prompts(tokenizer, count: int, tokens: int) -> list[list[int]]:
    """``count`` windows of ``tokens`` token ids, taken in turn from the held-out files."""
    files = sorted(prompts_mod.HELDOUT_DIR.glob("*.py.txt"))
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
    return prompts_mod.HELDOUT_DIR.parent / "target"


def run_model(name: str, args, work: Path) -> dict[str, dict]:
    """:func:`measure`'s comparisons of one model (``shipped``, ``outliers`` or a folder), printed."""
    if name == "shipped":
        from tileinfer.tokenizer import Tokenizer

        folder = shipped_model()
        prompts = heldout_prompts(Tokenizer.from_folder(folder), args.prompts, args.tokens)
    elif name == "outliers":
        folder = write_outlier_checkpoint(work / "outliers")
        prompts = random_prompts(1000, args.prompts, args.tokens)
    else:
        folder = Path(name)
        vocab = json.loads((folder / "config.json").read_text())["vocab_size"]
        prompts = random_prompts(vocab, args.prompts, args.tokens)
    result = measure(folder, prompts, device=args.device, dtypes=tuple(args.dtypes.split(",")))
    for key, r in result.items():
        print(f"{name:<10} {key:<20} mean KL {r['mean_kl']:.5f} nats (max {r['max_kl']:.4f}), top-1 "
              f"{r['top1_agree']}/{r['positions']} ({r['top1_fraction']:.3f}), reference entropy "
              f"{r['reference_entropy']:.2f}", flush=True)
    return result


def arguments(p) -> None:
    p.description = __doc__.split("\n\n")[1]
    p.add_argument("--models", default="shipped,outliers", help="comma-separated: shipped, outliers")
    p.add_argument("--model", action="append", default=[], metavar="DIR", help="also a checkpoint folder")
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtypes", default="bfloat16,float32", help="model dtypes, each measured against INT8")
    records.arguments(p)


def main(args) -> int:
    torch.manual_seed(0)
    run = records.Run(args.device, commit=args.commit, path=args.records)
    with tempfile.TemporaryDirectory() as tmp:
        for model in [*filter(None, args.models.split(",")), *args.model]:
            for comparison, figures in run_model(model, args, Path(tmp)).items():
                run.add("int8_quality", model=Path(model).name, comparison=comparison, device=args.device,
                        prompts=args.prompts, tokens_per_prompt=args.tokens, **figures)
    print(f"appended {len(run.records)} records to {run.path}")
    return 0


def loops(tokens: list[int], limit: int) -> bool:
    if len(tokens) < limit or len(tokens) < 8:
        return False
    half = len(tokens) // 2
    return any(all(tokens[i] == tokens[i - p] for i in range(half, len(tokens)))
               for p in range(1, len(tokens) // 4 + 1))


def repeated_line(text: str) -> bool:
    lines = [line.strip() for line in text.splitlines() if len(line.strip()) >= 4]
    return any(lines.count(line) >= 3 for line in set(lines))


def distinct_2(tokens: list[int]) -> float:
    pairs = list(zip(tokens, tokens[1:]))
    return len(set(pairs)) / len(pairs) if pairs else 1.0


def strength(fields: dict) -> float:
    """How far a candidate moves from plain greedy decoding: the sum of its penalties' distances
    from off."""
    return (abs(fields.get("repetition_penalty", 1.0) - 1.0) + abs(fields.get("frequency_penalty", 0.0))
            + abs(fields.get("presence_penalty", 0.0)))


def score(engine, prompts: list[str], fields: dict, new_tokens: int) -> dict:
    seeds = SEEDS if fields.get("temperature", 0) > 0 else (0,)
    replies = []
    for seed in seeds:
        params = SamplingParams(**{"temperature": 0.0, "repetition_penalty": 1.0, **fields, "seed": seed})
        for prompt in prompts:
            result = engine.generate(prompt, max_new_tokens=new_tokens, sampling=params)
            replies.append((result.token_ids, result.text, result.stats.finish_reason))
    n = len(replies)
    return {"replies": n, "seeds": list(seeds),
            "loops": sum(loops(t, new_tokens) for t, _, _ in replies) / n,
            "repeated_line": sum(repeated_line(x) for _, x, _ in replies) / n,
            "distinct_2": sum(distinct_2(t) for t, _, _ in replies) / n,
            "eos": sum(f == "eos" for _, _, f in replies) / n}


def defaults_arguments(p) -> None:
    p.description = __doc__.split("\n\n")[2]
    p.add_argument("--prompts", type=int, default=24, help="held-out prompts (default 24)")
    p.add_argument("--new-tokens", type=int, default=64, help="tokens per reply (default 64, the README's)")
    p.add_argument("--threads", type=int, default=1, help="CPU threads (default 1)")
    records.arguments(p)


def defaults_main(args) -> int:
    import tileinfer

    engine = tileinfer.Engine.from_config("reference", device="cpu", dtype="float32", threads=args.threads,
                                          progress=False)
    prompts = prompts_mod.def_lines(args.prompts, exclude=README_PROMPT)
    rows = {}
    for name, fields in CANDIDATES.items():
        rows[name] = {"sampling": fields, **score(engine, prompts, fields, args.new_tokens)}
        params = SamplingParams(**{"temperature": 0.0, "repetition_penalty": 1.0, **fields, "seed": 0})
        readme = engine.generate(README_PROMPT, max_new_tokens=args.new_tokens, sampling=params)
        rows[name].update(readme_reply=readme.text,
                          readme_loops=loops(readme.token_ids, args.new_tokens) or repeated_line(readme.text))
        print(f"{name:<24} loops {rows[name]['loops']:.2f}  repeated_line {rows[name]['repeated_line']:.2f}  "
              f"distinct_2 {rows[name]['distinct_2']:.2f}  eos {rows[name]['eos']:.2f}", flush=True)
    chosen = min(rows, key=lambda k: (rows[k]["loops"], rows[k]["repeated_line"],
                                      rows[k]["sampling"].get("temperature", 0) > 0, strength(rows[k]["sampling"])))
    run = records.Run("cpu", commit=args.commit, path=args.records)
    for name, row in rows.items():
        run.add("generation_defaults", candidate=name, chosen=name == chosen, model="target", prompts=len(prompts),
                new_tokens=args.new_tokens, threads=args.threads, **row)
    print(f"chosen: {chosen} {rows[chosen]['sampling']}; appended {len(run.records)} records to {run.path}")
    return 0


# -- the tables of python -m bench report ---------------------------------------------------------

def quality_table(rows: list[dict]) -> str:
    from .report import markdown

    body = [[r["comparison"], f"{r['mean_kl']:.5f}", f"{r['max_kl']:.4f}",
             f"{r['top1_agree']}/{r['positions']} ({r['top1_fraction']:.3f})", f"{r['reference_entropy']:.2f}"]
            for r in rows]
    return (f"{rows[0]['prompts']} prompts of {rows[0]['tokens_per_prompt']} tokens, device {rows[0]['device']}.\n\n"
            + markdown(["comparison", "mean KL (nats)", "max KL", "top-1 agreement", "reference entropy"], body))


def defaults_table(rows: list[dict]) -> str:
    from .report import markdown

    body = [[r["candidate"] + (" (chosen)" if r["chosen"] else ""), f"{r['loops']:.2f}", f"{r['repeated_line']:.2f}",
             f"{r['distinct_2']:.2f}", f"{r['eos']:.2f}", "yes" if r["readme_loops"] else "no"] for r in rows]
    return (f"{rows[0]['prompts']} held-out prompts, {rows[0]['new_tokens']} new tokens, reference engine on the "
            f"CPU; fractions of the replies.\n\n" + markdown(["candidate", "loops", "repeated line", "distinct-2",
                                                             "EOS", "README reply loops"], body))


def tables() -> list:
    from .report import Table

    return [Table("int8_quality", "INT8 weights against the model dtype, {group}", quality_table,
                  group=lambda r: r["model"]),
            Table("generation_defaults", "sampling defaults of the shipped {group} model", defaults_table,
                  group=lambda r: r["model"])]
