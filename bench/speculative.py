"""Plain greedy decoding against n-gram, draft-model and DFlash speculation on the benchmark prompts.

For each prompt (EDIT and OPEN tasks on the held-out files, tileinfer.models.prompts, rendered with
the chat template) one engine without a proposer, one with ``proposer=ngram``, one with
``proposer=draft`` (--draft-model, or the shipped models/draft when --model is the shipped target;
else left out) and one with ``proposer=dflash`` (--dflash-model, or the shipped models/dflash with
the shipped target; else left out) generate greedily, each after a warm-up generation of 8 tokens on
that prompt (compilation and CUDA-graph capture are not timed; a verify step of a token count the
warm-up did not meet is captured in the first timed run, so use --repeats 3 with CUDA graphs).
Recorded (kind ``speculative``, one record per prompt and proposer): new tokens, steps, tokens per
step, drafted and accepted tokens, acceptance, decode tok/s (median over the repeats), prefill ms,
the speedup over plain decoding, and the decoding loop that ran (``decode_loop``: sequential or
pipelined plain decoding, speculative-sequential, or speculative-device). Each proposer's token ids
must equal the plain ones: a prompt where they differ is a failure, and the exit status is 1.

Each proposer drafts ``spec_k`` tokens a step (the config's; ``--k dflash=15`` sets one proposer's;
``--k ngram=3,7,15`` measures each of several, labelled ``ngram@3`` ...). ``--sampled T`` samples at
temperature T instead (seeded, so repeats reproduce; the drafts are verified by the p/q rule, greedy
drafts unless ``--sampled-drafts``): the tokens then differ from plain decoding's by design and are
not compared.

examples:
  python -m bench spec --device cpu --config reference --new-tokens 64
  python -m bench spec --device cpu --new-tokens 128 --k dflash=15
  python -m bench spec --device cuda --new-tokens 256 --repeats 3 --k ngram=7,15 --k draft=3,7 --k dflash=7,15
"""

from __future__ import annotations

import logging
import statistics
import sys
from pathlib import Path

import torch
from tqdm.auto import tqdm

import tileinfer
from tileinfer.errors import TileinferError
from tileinfer.interfaces import SamplingParams
from tileinfer.models import prompts as prompts_mod
from tileinfer.tokenizer import Tokenizer

from . import records
from .timing import cold_salt
from .workloads import NoticeLog

SHIPPED = Path(prompts_mod.__file__).resolve().parent
PROPOSERS = ("none", "ngram", "draft", "dflash")
WARM_UP_TOKENS = 8
FIGURES = ("new_tokens", "steps", "tokens_per_step", "drafted_tokens", "accepted_tokens", "acceptance",
           "decode_tok_s", "prefill_ms", "decode_tok_s_runs", "finish_reason", "decode_loop")


def ks(text: str) -> tuple[str, list[int]]:
    """``PROPOSER=K[,K...]`` -> ``(proposer, [k, ...])``."""
    import argparse

    name, _, values = text.partition("=")
    try:
        k = [int(v) for v in values.split(",")]
    except ValueError:
        k = []
    if name not in PROPOSERS[1:] or not k or min(k) < 1:
        raise argparse.ArgumentTypeError(f"{text}: expected PROPOSER=K[,K...] with PROPOSER one of "
                                         f"{', '.join(PROPOSERS[1:])} and K >= 1")
    return name, k


def arguments(p) -> None:
    p.description, p.epilog = __doc__.split("\n\n")[0], __doc__.split("\n\n", 1)[1]
    p.add_argument("--model", type=Path, metavar="DIR", default=SHIPPED / "target",
                   help="Qwen3 checkpoint folder with tokenizer.json and a chat template (default: models/target)")
    p.add_argument("--draft-model", type=Path, metavar="DIR", help="draft checkpoint for proposer=draft")
    p.add_argument("--dflash-model", type=Path, metavar="DIR", help="DFlash drafter for proposer=dflash")
    p.add_argument("--k", action="append", default=[], type=ks, metavar="PROPOSER=K[,K...]",
                   help="spec_k of one proposer, or several to compare (default: the config's); repeatable")
    p.add_argument("--sampled", type=float, metavar="T", help="sample at temperature T (p/q verification)")
    p.add_argument("--sampled-drafts", action="store_true", help="with --sampled: the draft and DFlash proposers "
                   "sample their drafts too (options.<name>.greedy=false)")
    p.add_argument("--max-tokens", type=int, metavar="N", default=prompts_mod.DEFAULT_MAX_TOKENS,
                   help="prompt length bound in tokens, chat template included (default: %(default)s)")
    p.add_argument("--new-tokens", type=int, metavar="N", default=256,
                   help="at most this many new tokens per generation (default: %(default)s)")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto", help="default: %(default)s")
    p.add_argument("--config", action="append", default=[], metavar="NAME_OR_FILE",
                   help="a shipped config (e.g. eager, reference) or YAML file over configs/default.yaml; repeatable")
    p.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                   help="config override, e.g. spec_k=5; repeatable (proposer is set here)")
    p.add_argument("--repeats", type=int, metavar="N", default=1, help="timed runs per prompt and proposer; tok/s "
                   "and prefill ms are their medians (default: %(default)s)")
    records.arguments(p)


def check(args) -> str | None:
    if not (args.model / "config.json").is_file():
        return f"{args.model} holds no config.json (pass --model DIR)"
    if args.sampled_drafts and not args.sampled:
        return "--sampled-drafts needs --sampled T"
    if args.sampled is not None and not args.sampled > 0:
        return "--sampled T needs T > 0 (greedy is the default)"
    if args.max_tokens < 1 or args.new_tokens < 1 or args.repeats < 1:
        return "--max-tokens, --new-tokens and --repeats must be >= 1"
    return None


def run(engine, ids: list[int], new_tokens: int, repeats: int) -> dict:
    """The prompt ``ids`` generated ``repeats`` times after a warm-up, each a cold prefill (a new
    ``cache_salt``: its time to first token is not a prefix-cache hit's)."""
    def generate(new: int):
        return engine.generate(ids, SamplingParams(max_tokens=new, cache_salt=cold_salt()))

    generate(min(WARM_UP_TOKENS, new_tokens))
    runs = [generate(new_tokens) for _ in range(repeats)]
    if any(r.stats.cached_tokens for r in runs):
        raise RuntimeError("a cold prefill reused cached tokens")
    if any(r.token_ids != runs[0].token_ids for r in runs):
        raise RuntimeError("generation is not deterministic across repeats (greedy, or sampled with one seed)")
    s = runs[0].stats
    return {"new_tokens": s.new_tokens, "steps": s.steps, "tokens_per_step": s.tokens_per_step,
            "drafted_tokens": s.drafted_tokens, "accepted_tokens": s.accepted_tokens,
            "acceptance": s.accepted_tokens / s.drafted_tokens if s.drafted_tokens else None,
            "decode_tok_s": statistics.median(r.stats.decode_tok_s for r in runs),
            "prefill_ms": statistics.median(r.stats.prefill_ms for r in runs),
            "decode_tok_s_runs": [r.stats.decode_tok_s for r in runs], "finish_reason": s.finish_reason,
            "decode_loop": s.decode_loop, "token_ids": runs[0].token_ids}


def first_difference(a: list[int], b: list[int]) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None if len(a) == len(b) else min(len(a), len(b)))


def engines(args, device: torch.device) -> dict:
    """label -> engine: ``none``, then each proposer (``name@k`` for each k of a sweep)."""
    shipped = args.model.resolve() == (SHIPPED / "target").resolve()
    folders = {name: given or (SHIPPED / name if shipped and (SHIPPED / name / "config.json").is_file() else None)
               for name, given in (("draft", args.draft_model), ("dflash", args.dflash_model))}
    k_values = dict(args.k)
    out = {}
    for p in PROPOSERS:
        if p in folders and not folders[p]:
            continue
        for k in k_values.get(p, [None]):
            keys = [f"proposer={p}", *([f"options.{p}.model={folders[p]}"] if p in folders else []),
                    *([f"spec_k={k}"] if k else []), *([f"temperature={args.sampled}"] if args.sampled else []),
                    *([f"options.{p}.greedy=false"] if args.sampled_drafts and p in folders else [])]
            label = f"{p}@{k}" if len(k_values.get(p, [])) > 1 else p
            out[label] = tileinfer.Engine.from_config(
                *args.config, overrides=["temperature=0", "repetition_penalty=1.0", *args.override, *keys],
                model=str(args.model), device=device.type, progress=False)
    return out


def main(args) -> int:
    if reason := check(args):
        print(f"error: {reason}", file=sys.stderr)
        return 2
    device = torch.device("cuda" if args.device == "cuda" or args.device == "auto" and torch.cuda.is_available()
                          else "cpu")
    notices = NoticeLog()  # the engines' notices (a fallback, say), which the records carry
    logging.getLogger("tileinfer").addHandler(notices)
    try:
        built = engines(args, device)
        bench = prompts_mod.benchmark_prompts(Tokenizer.from_folder(args.model), args.max_tokens)
    except TileinferError as exc:
        logging.getLogger("tileinfer").removeHandler(notices)
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_status
    log = records.Run(device, commit=args.commit, path=args.records)
    setting = {"model": args.model.resolve().name, "mode": f"sampled {args.sampled}" if args.sampled else "greedy",
               "sampled_drafts": args.sampled_drafts, "max_new_tokens": args.new_tokens, "repeats": args.repeats,
               "config": [*args.config, *args.override]}
    failures = []
    for prompt in tqdm(bench, desc="prompts", unit="prompt"):
        done = {label: run(engine, prompt.token_ids, args.new_tokens, args.repeats) for label, engine in built.items()}
        plain = done["none"]
        for label, figures in done.items():
            diff = None if args.sampled else first_difference(plain["token_ids"], figures["token_ids"])
            speedup = figures["decode_tok_s"] / plain["decode_tok_s"] if plain["decode_tok_s"] else None
            log.add("speculative", **setting, task=prompt.task, file=prompt.name,
                    prompt_tokens=len(prompt.token_ids), label=label, proposer=built[label].config.proposer,
                    spec_k=built[label].config.spec_k, **{k: figures[k] for k in FIGURES},
                    speedup=None if label == "none" else speedup, first_difference=diff,
                    notices=list(notices.messages))
            if diff is not None:
                failures.append(f"{prompt.task} {prompt.name}: {label} tokens differ from plain greedy from new "
                                f"token {diff} on")
    logging.getLogger("tileinfer").removeHandler(notices)
    print(f"{device.type}, {args.model}, {setting['mode']}, up to {args.new_tokens} new tokens")
    print(summary_table(log.records))
    print(f"appended {len(log.records)} records to {log.path}")
    for failure in failures:
        print(f"FAILURE: {failure}", file=sys.stderr)
    return 1 if failures else 0


def summary_table(rows: list[dict]) -> str:
    """Per task and proposer: mean time to first token (the prefill, with the proposer's own pass
    over the prompt: a draft model's or DFlash drafter's context), tok/s, speedup over plain
    decoding, tokens per step, acceptance, the loops that ran; the best k of each proposer marked
    with *."""
    from .report import markdown

    def mean(values) -> float | None:
        values = [v for v in values if v is not None]
        return statistics.fmean(values) if values else None

    def fmt(v, spec: str) -> str:
        return "-" if v is None else format(v, spec)

    body = []
    for task in dict.fromkeys(r["task"] for r in rows):
        mine = [r for r in rows if r["task"] == task]
        labels = list(dict.fromkeys(r["label"] for r in mine))
        tok_s = {label: mean(r["decode_tok_s"] for r in mine if r["label"] == label) for label in labels}
        best = {}
        for label in labels:
            p = label.split("@")[0]
            if tok_s[label] is not None and (p not in best or tok_s[label] > tok_s[best[p]]):
                best[p] = label
        for label in labels:
            of = [r for r in mine if r["label"] == label]
            star = "*" if "@" in label and best.get(label.split("@")[0]) == label else ""
            body.append([task, label + star, fmt(mean(r["prefill_ms"] for r in of), ".1f"),
                         fmt(tok_s[label], ".1f"), fmt(mean(r["speedup"] for r in of), ".2f"),
                         fmt(mean(r["tokens_per_step"] for r in of), ".2f"),
                         fmt(mean(r["acceptance"] for r in of), ".0%"),
                         "/".join(sorted({r["decode_loop"] for r in of}))])
    return markdown(["task", "proposer", "first token ms", "tok/s", "speedup", "tok/step", "acceptance", "loop"],
                    body)


def tables() -> list:
    from .report import Table

    def missing(rows: list[dict], group: str) -> list[str]:  # every prompt of each proposer of the newest run
        last = [r for r in rows if r["date"] == max(r["date"] for r in rows)]
        have = {(r["task"], r["file"], r["label"]) for r in last}
        return [f"{label}/{task}/{file}" for task, file in sorted({(r["task"], r["file"]) for r in last})
                for label in sorted({r["label"] for r in last}) if (task, file, label) not in have]

    def render(rows: list[dict]) -> str:
        newest = [r for r in rows if r["date"] == max(r["date"] for r in rows)]
        first = newest[0]
        return (f"{len({r['file'] for r in newest})} files x {len({r['task'] for r in newest})} tasks, up to "
                f"{first['max_new_tokens']} new tokens, config {' '.join(first['config']) or 'default'}; means over "
                f"the prompts (* the best k of a sweep).\n\n" + summary_table(newest))

    return [Table("speculative", "speculative decoding, {group}", render,
                  group=lambda r: f"{r['model']}, {r['mode']}", missing=missing)]
