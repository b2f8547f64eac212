"""Plain greedy decoding against n-gram, draft-model and DFlash speculation on the benchmark prompts (bench/prompts.py).

For each prompt (EDIT and OPEN tasks on the held-out files, rendered with the chat template) one
engine without a proposer, one with ``proposer=ngram``, one with ``proposer=draft`` (with
--draft-model, or the shipped models/draft when --model is the shipped target; else left out) and
one with ``proposer=dflash`` (with --dflash-model, or the shipped models/dflash when --model is the
shipped target and it is there; else left out) generate greedily, each after a warm-up
generation of 8 tokens on that prompt (compilation and CUDA-graph capture are not timed; a verify
step of a token count the warm-up did not meet is captured in the first timed run, so use
--repeats 3 with cuda_graphs). Recorded: new tokens, steps, tokens per step, drafted and accepted
tokens, acceptance rate, decode tok/s (median over the repeats), prefill ms and the decoding loop
that ran (``decode_loop``: sequential or pipelined plain decoding, speculative-sequential, or
speculative-device, the device-resident loop of a greedy run with ``pipelined`` on CUDA). Each proposer's
token ids must equal the plain ones: a prompt where they differ is a failure in the JSON and the exit
status is 1.

Each proposer drafts ``spec_k`` tokens a step (the config's, 7 by default; ``--k dflash=15`` sets
one proposer's; ``--k ngram=3,7,15`` measures each of several, as rows ``ngram@3`` ..., and the
summary's ``best`` gives, per task, the k of each proposer with the highest mean tok/s). ``--sampled T`` samples at temperature T instead (seeded, so repeats reproduce;
the drafts are verified by the p/q rule, greedy drafts unless ``--sampled-drafts``): the tokens
then differ from plain decoding's by design and are not compared.

examples:
  python bench/speculative.py --device cpu --config reference --new-tokens 64
  python bench/speculative.py --device cpu --new-tokens 128 --k dflash=15
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

from tileinfer.models import prompts as prompts_mod  # noqa: E402
from records import git_commit, triton_version  # noqa: E402
import tileinfer  # noqa: E402
from tileinfer.errors import TileinferError  # noqa: E402
from tileinfer.tokenizer import Tokenizer  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PROPOSERS = ("none", "ngram", "draft", "dflash")
WARM_UP_TOKENS = 8


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, metavar="DIR", default=ROOT / "models" / "target",
                   help="Qwen3 checkpoint folder with tokenizer.json and a chat template (default: models/target)")
    p.add_argument("--draft-model", type=Path, metavar="DIR", help="draft checkpoint for proposer=draft (default: "
                   "models/draft when --model is models/target; otherwise the draft model is left out)")
    p.add_argument("--dflash-model", type=Path, metavar="DIR", help="DFlash drafter for proposer=dflash (default: "
                   "models/dflash when --model is models/target and it is there; otherwise DFlash is left out)")
    p.add_argument("--k", action="append", default=[], metavar="PROPOSER=K[,K...]",
                   help="spec_k of one proposer, e.g. dflash=15, or several to compare, e.g. ngram=3,7,15 "
                   "(default: the config's); repeatable")
    p.add_argument("--sampled", type=float, metavar="T", help="sample at temperature T (p/q verification) "
                   "instead of greedy decoding")
    p.add_argument("--sampled-drafts", action="store_true", help="with --sampled: the draft and DFlash "
                   "proposers sample their drafts too (options.<name>.greedy=false)")
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
    p.add_argument("--commit", help="commit to record (default: git rev-parse of this checkout; give it where the "
                   "checkout is a copy without its history, as on the GPU machine)")
    p.add_argument("--out", type=Path, metavar="FILE.json", help="JSON file to write (default: bench/results/<device name>/"
                   "speculative_<model folder name>.json)")
    args = p.parse_args(argv)
    if not (args.model / "config.json").is_file():
        p.error(f"{args.model} holds no config.json (models/target is built by models/make_all.py; pass --model DIR)")
    shipped = args.model.resolve() == (ROOT / "models" / "target").resolve()
    if args.draft_model is None and shipped:
        args.draft_model = ROOT / "models" / "draft"
    if args.dflash_model is None and shipped and (ROOT / "models" / "dflash" / "config.json").is_file():
        args.dflash_model = ROOT / "models" / "dflash"
    try:
        args.k = {name: [int(k) for k in ks.split(",")] for name, ks in (item.split("=", 1) for item in args.k)}
    except ValueError:
        p.error(f"--k takes PROPOSER=K[,K...], got {args.k}")
    if set(args.k) - set(PROPOSERS[1:]) or any(k < 1 for ks in args.k.values() for k in ks):
        p.error(f"--k: proposers are {', '.join(PROPOSERS[1:])}, and K >= 1")
    if args.sampled_drafts and not args.sampled:
        p.error("--sampled-drafts needs --sampled T")
    if args.sampled is not None and not args.sampled > 0:
        p.error("--sampled T needs T > 0 (greedy is the default)")
    if args.max_tokens < 1 or args.new_tokens < 1 or args.repeats < 1:
        p.error("--max-tokens, --new-tokens and --repeats must be >= 1")
    return args


def environment(device: torch.device, commit: str | None = None) -> dict:
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else (platform.processor() or "cpu")
    return {"device": device.type, "device_name": name, "torch": torch.__version__, "triton": triton_version(),
            "commit": commit or git_commit(), "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}


def run(engine, ids: list[int], new_tokens: int, repeats: int) -> dict:
    engine.generate(ids, max_new_tokens=min(WARM_UP_TOKENS, new_tokens))
    runs = [engine.generate(ids, max_new_tokens=new_tokens) for _ in range(repeats)]
    if any(r.token_ids != runs[0].token_ids for r in runs):
        raise RuntimeError("generation is not deterministic across repeats (greedy, or sampled with one seed)")
    s = runs[0].stats
    return {"new_tokens": s.new_tokens, "steps": s.steps, "tokens_per_step": s.tokens_per_step,
            "drafted_tokens": s.drafted_tokens, "accepted_tokens": s.accepted_tokens,
            "acceptance": s.accepted_tokens / s.drafted_tokens if s.drafted_tokens else None,
            "decode_tok_s": statistics.median(r.stats.decode_tok_s for r in runs),
            "prefill_ms": statistics.median(r.stats.prefill_ms for r in runs),
            "decode_tok_s_runs": [r.stats.decode_tok_s for r in runs], "finish_reason": s.finish_reason,
            "decode_loop": s.decode_loop,
            "token_ids": runs[0].token_ids, "text": runs[0].text}


def first_difference(a: list[int], b: list[int]) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None if len(a) == len(b) else min(len(a), len(b)))


def fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def spec_proposers(rows: list[dict]) -> list[str]:
    """The speculative rows' labels: a proposer's name, or ``name@k`` for each k of a sweep."""
    return [label for label, value in rows[0].items()
            if isinstance(value, dict) and "decode_tok_s" in value and label != "none"] if rows else []


def best_k(summary: dict, labels: list[str]) -> dict:
    """Per task and proposer, the label (and its k) of the highest mean tok/s."""
    best: dict = {}
    for task, m in summary.items():
        for label in labels:
            name = label.split("@")[0]
            mine = best.setdefault(task, {}).get(name)
            if m[f"{label}_tok_s"] is not None and (mine is None or m[f"{label}_tok_s"] > mine["tok_s"]):
                best[task][name] = {"label": label, "k": int(label.split("@")[1]) if "@" in label else None,
                                    "tok_s": m[f"{label}_tok_s"], "speedup": m[f"{label}_speedup"],
                                    "tokens_per_step": m[f"{label}_tokens_per_step"]}
    return best


def decode_loops(rows: list[dict]) -> dict:
    """Per row label, the loops its generations ran (``GenerationStats.decode_loop``: on CUDA with the
    default config, ``speculative-device`` for a proposer that drafts on the device)."""
    labels = ["none", *spec_proposers(rows)]
    return {label: sorted({r[label]["decode_loop"] for r in rows}) for label in labels} if rows else {}


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


def ngram_label(rows: list[dict]) -> str:
    """The n-gram row (the first of a sweep): the records' top-level ``speedup``/``acceptance``."""
    return next(label for label in spec_proposers(rows) if label.split("@")[0] == "ngram")


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
                     "acceptance": mean(r[ngram_label(rows)]["acceptance"] for r in mine)}
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
        folders = {"draft": args.draft_model, "dflash": args.dflash_model}
        extra = {p: [f"options.{p}.model={folder}"] for p, folder in folders.items() if folder}
        labels = {}  # label -> (proposer, its overrides)
        for p in PROPOSERS:
            if p in folders and not folders[p]:
                continue
            ks = args.k.get(p, [None])
            for k in ks:
                label = f"{p}@{k}" if len(ks) > 1 else p
                labels[label] = (p, extra.get(p, []) + ([f"spec_k={k}"] if k else []))
        sampling = [f"temperature={args.sampled}"] if args.sampled else []
        if args.sampled and args.sampled_drafts:
            for label, (p, keys) in labels.items():
                if p in folders:
                    keys.append(f"options.{p}.greedy=false")
        engines = {label: tileinfer.Engine.from_config(*args.config, overrides=["temperature=0", "repetition_penalty=1.0",
                                                                           *args.override, *sampling, f"proposer={p}",
                                                                           *keys],
                                                       model=str(args.model), device=device.type, progress=False)
                   for label, (p, keys) in labels.items()}
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
        differences = [row[p]["first_difference"] for p in engines if p != "none" and not args.sampled]
        row["first_difference"] = min((d for d in differences if d is not None), default=None)
        row["match"] = row["first_difference"] is None
        row["speedup"] = row[ngram_label([row])]["speedup"]
        rows.append(row)
    failures = [f"{r['task']} {r['file']}: {p} tokens differ from plain greedy from new token "
                f"{r[p]['first_difference']} on" for r in rows for p in engines
                if p != "none" and r[p]["first_difference"] is not None and not args.sampled]
    env = environment(device, args.commit)
    result = {**env, "model": str(args.model), "args": {k: str(v) if isinstance(v, Path) else v
                                                        for k, v in vars(args).items()},
              "config": {p: dataclasses.asdict(e.config) for p, e in engines.items()},
              "summary": summarize(rows), "best": best_k(summarize(rows), spec_proposers(rows)),
              "decode_loops": decode_loops(rows),
              "failures": failures, "prompts": rows}
    out = args.out or ROOT / "bench" / "results" / env["device_name"].replace(" ", "-") / \
        f"speculative_{args.model.resolve().name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"{env['device_name']}, {args.model}, config {' + '.join(args.config) or 'default'}"
          f"{' ' + ' '.join(args.override) if args.override else ''}, up to {args.new_tokens} new tokens, "
          f"{f'sampled at temperature {args.sampled} (p/q)' if args.sampled else 'greedy'}")
    print(table(rows))
    print("loops: " + ", ".join(f"{label} {'/'.join(loops)}" for label, loops in result["decode_loops"].items()))
    for task, best in result["best"].items():
        print(f"best k, {task}: " + ", ".join(f"{p} {b['label']} {b['tok_s']:.1f} tok/s (x{b['speedup']:.2f}, "
                                                f"{b['tokens_per_step']:.2f} tok/step)" for p, b in best.items()))
    print(f"wrote {out}")
    for failure in failures:
        print(f"FAILURE: {failure}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
