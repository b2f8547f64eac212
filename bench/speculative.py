"""Plain greedy decoding against n-gram and draft-model speculation on the benchmark prompts (bench/prompts.py).

For each prompt (EDIT and OPEN tasks on the held-out files, rendered with the chat template) one
engine without a proposer, one with ``proposer=ngram`` and one with ``proposer=draft`` (with
--draft-model, or the shipped models/draft when --model is the shipped target; else left out)
generate greedily, each after a warm-up
generation of 8 tokens on that prompt (compilation and CUDA-graph capture are not timed; a verify
step of a token count the warm-up did not meet is captured in the first timed run, so use
--repeats 3 with cuda_graphs). Recorded: new tokens, steps, tokens per step, drafted and accepted
tokens, acceptance rate, decode tok/s (median over the repeats) and prefill ms. Each proposer's
token ids must equal the plain ones: a prompt where they differ is a failure in the JSON and the exit
status is 1.

examples:
  python bench/speculative.py --device cpu --config reference --new-tokens 64
  python bench/speculative.py --device cuda --repeats 3
  python bench/speculative.py --device cuda --config eager
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import platform
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import torch  # noqa: E402
from tqdm.auto import tqdm  # noqa: E402

import prompts as prompts_mod  # noqa: E402
from records import git_commit, triton_version  # noqa: E402
import tileinfer  # noqa: E402
from tileinfer.errors import TileinferError  # noqa: E402
from tileinfer.tokenizer import Tokenizer  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PROPOSERS = ("none", "ngram", "draft")
WARM_UP_TOKENS = 8


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, metavar="DIR", default=ROOT / "models" / "target",
                   help="Qwen3 checkpoint folder with tokenizer.json and a chat template (default: models/target)")
    p.add_argument("--draft-model", type=Path, metavar="DIR", help="draft checkpoint for proposer=draft (default: "
                   "models/draft when --model is models/target; otherwise the draft model is left out)")
    p.add_argument("--max-tokens", type=int, metavar="N", default=prompts_mod.DEFAULT_MAX_TOKENS,
                   help="prompt length bound in tokens, chat template included (default: %(default)s)")
    p.add_argument("--new-tokens", type=int, metavar="N", default=256,
                   help="at most this many new tokens per generation; an EOS stops it earlier (default: %(default)s)")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto", help="default: %(default)s")
    p.add_argument("--config", action="append", default=[], metavar="NAME_OR_FILE",
                   help="a shipped config (e.g. eager, reference) or YAML file over configs/default.yaml; repeatable")
    p.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                   help="config override, e.g. cuda_graphs=true or spec_k=5; repeatable (proposer is set by the script)")
    p.add_argument("--repeats", type=int, metavar="N", default=1, help="timed runs per prompt and proposer; tok/s and prefill "
                   "ms are their medians (default: %(default)s)")
    p.add_argument("--out", type=Path, metavar="FILE.json", help="JSON file to write (default: bench/results/<device name>/"
                   "speculative_<model folder name>.json)")
    args = p.parse_args(argv)
    if not (args.model / "config.json").is_file():
        p.error(f"{args.model} holds no config.json (models/target is built by models/make_all.py; pass --model DIR)")
    if args.draft_model is None and args.model.resolve() == (ROOT / "models" / "target").resolve():
        args.draft_model = ROOT / "models" / "draft"
    if args.max_tokens < 1 or args.new_tokens < 1 or args.repeats < 1:
        p.error("--max-tokens, --new-tokens and --repeats must be >= 1")
    return args


def environment(device: torch.device) -> dict:
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else (platform.processor() or "cpu")
    return {"device": device.type, "device_name": name, "torch": torch.__version__, "triton": triton_version(),
            "commit": git_commit(), "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}


def run(engine, ids: list[int], new_tokens: int, repeats: int) -> dict:
    engine.generate(ids, max_new_tokens=min(WARM_UP_TOKENS, new_tokens))
    runs = [engine.generate(ids, max_new_tokens=new_tokens) for _ in range(repeats)]
    if any(r.token_ids != runs[0].token_ids for r in runs):
        raise RuntimeError("greedy generation is not deterministic across repeats")
    s = runs[0].stats
    return {"new_tokens": s.new_tokens, "steps": s.steps, "tokens_per_step": s.tokens_per_step,
            "drafted_tokens": s.drafted_tokens, "accepted_tokens": s.accepted_tokens,
            "acceptance": s.accepted_tokens / s.drafted_tokens if s.drafted_tokens else None,
            "decode_tok_s": statistics.median(r.stats.decode_tok_s for r in runs),
            "prefill_ms": statistics.median(r.stats.prefill_ms for r in runs),
            "decode_tok_s_runs": [r.stats.decode_tok_s for r in runs], "finish_reason": s.finish_reason,
            "token_ids": runs[0].token_ids, "text": runs[0].text}


def first_difference(a: list[int], b: list[int]) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None if len(a) == len(b) else min(len(a), len(b)))


def fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def spec_proposers(rows: list[dict]) -> list[str]:
    return [p for p in PROPOSERS[1:] if rows and p in rows[0]]


def table(rows: list[dict]) -> str:
    names = spec_proposers(rows)
    head = ("task", "file", "prompt", "new", "plain tok/s",
            *(f"{p} {c}" for p in names for c in ("tok/s", "speedup", "tok/step", "acceptance")))
    lines = [head]
    for r in rows:
        lines.append((r["task"], r["file"], str(r["prompt_tokens"]), str(r["none"]["new_tokens"]),
                      fmt(r["none"]["decode_tok_s"], ".1f"),
                      *(x for p in names for x in (fmt(r[p]["decode_tok_s"], ".1f"), fmt(r[p]["speedup"], ".2f"),
                                                   fmt(r[p]["tokens_per_step"], ".2f"), fmt(r[p]["acceptance"], ".0%")))))
    for task, m in summarize(rows).items():
        lines.append((task, "mean", "", "", fmt(m["plain_tok_s"], ".1f"),
                      *(x for p in names for x in (fmt(m[f"{p}_tok_s"], ".1f"), fmt(m[f"{p}_speedup"], ".2f"),
                                                   fmt(m[f"{p}_tokens_per_step"], ".2f"), fmt(m[f"{p}_acceptance"], ".0%")))))
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(line, widths)))
                     for line in lines)


def summarize(rows: list[dict]) -> dict:
    def mean(values):
        values = [v for v in values if v is not None]
        return statistics.fmean(values) if values else None

    out = {}
    for task in dict.fromkeys(r["task"] for r in rows):
        mine = [r for r in rows if r["task"] == task]
        out[task] = {"plain_tok_s": mean(r["none"]["decode_tok_s"] for r in mine),
                     # n-gram's under the names of the two-proposer records
                     "speedup": mean(r["speedup"] for r in mine),
                     "acceptance": mean(r["ngram"]["acceptance"] for r in mine)}
        for p in spec_proposers(rows):
            out[task].update({f"{p}_tok_s": mean(r[p]["decode_tok_s"] for r in mine),
                              f"{p}_speedup": mean(r[p]["speedup"] for r in mine),
                              f"{p}_tokens_per_step": mean(r[p]["tokens_per_step"] for r in mine),
                              f"{p}_acceptance": mean(r[p]["acceptance"] for r in mine)})
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    device = torch.device("cuda" if args.device == "cuda" or args.device == "auto" and torch.cuda.is_available()
                          else "cpu")
    try:
        draft = [f"options.draft.model={args.draft_model}"] if args.draft_model else []
        engines = {p: tileinfer.Engine.from_config(*args.config, overrides=[*args.override, f"proposer={p}",
                                                                       *(draft if p == "draft" else [])],
                                                   model=str(args.model), device=device.type, progress=False)
                   for p in PROPOSERS if p != "draft" or args.draft_model}
        bench = prompts_mod.benchmark_prompts(Tokenizer.from_folder(args.model), args.max_tokens)
    except TileinferError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_status
    rows = []
    for prompt in tqdm(bench, desc="prompts", unit="prompt"):
        row = {"task": prompt.task, "file": prompt.name, "prompt_tokens": len(prompt.token_ids)}
        row.update({p: run(engine, prompt.token_ids, args.new_tokens, args.repeats) for p, engine in engines.items()})
        plain_s = row["none"]["decode_tok_s"]
        for p in engines:
            if p != "none":
                row[p]["first_difference"] = first_difference(row["none"]["token_ids"], row[p]["token_ids"])
                row[p]["speedup"] = row[p]["decode_tok_s"] / plain_s if plain_s else None
        differences = [row[p]["first_difference"] for p in engines if p != "none"]
        row["first_difference"] = min((d for d in differences if d is not None), default=None)
        row["match"] = row["first_difference"] is None
        row["speedup"] = row["ngram"]["speedup"]
        rows.append(row)
    failures = [f"{r['task']} {r['file']}: {p} tokens differ from plain greedy from new token "
                f"{r[p]['first_difference']} on" for r in rows for p in engines
                if p != "none" and r[p]["first_difference"] is not None]
    env = environment(device)
    result = {**env, "model": str(args.model), "args": {k: str(v) if isinstance(v, Path) else v
                                                        for k, v in vars(args).items()},
              "config": {p: dataclasses.asdict(e.config) for p, e in engines.items()},
              "summary": summarize(rows), "failures": failures, "prompts": rows}
    out = args.out or ROOT / "bench" / "results" / env["device_name"].replace(" ", "-") / \
        f"speculative_{args.model.resolve().name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"{env['device_name']}, {args.model}, config {' + '.join(args.config) or 'default'}"
          f"{' ' + ' '.join(args.override) if args.override else ''}, up to {args.new_tokens} new tokens, greedy")
    print(table(rows))
    print(f"wrote {out}")
    for failure in failures:
        print(f"FAILURE: {failure}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
