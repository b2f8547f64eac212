"""The CPU path: prefill of a long prompt and decode tok/s at a short and a long context, tileinfer's
default config on a CPU against transformers' Qwen3ForCausalLM (``attn_implementation="sdpa"``) on
the shipped model, the same prompt tokens and the same thread count, in the same run.

The prompt is the token ids of the held-out files (``models/heldout``, not in the shipped models'
training corpus), cut to ``--long`` tokens; the short context is its first ``--short`` tokens.

- prefill ms: from the call to the first token of a one-token generation;
- decode tok/s at a context: the tokens after the first over the time from the first to the last
  of a ``--new``-token generation from a prompt of that many tokens (EOS ignored).

Each figure is the median of ``--repeats`` runs after one warm-up, wall clock (``time.perf_counter``);
the two take turns run by run, so that other work on the machine weighs on both alike (the load
average is kept with the record).
The record (JSON) keeps the runs labelled by ``--label`` (e.g. ``before`` and ``after`` a change)
side by side: a new run replaces the one of the same label and keeps the others.

    .venv/bin/python bench/cpu_attention.py --label after
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))

from peers import token_arrivals  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
MODEL = ROOT / "models" / "target"
OUT = ROOT / "bench" / "results" / "cpu" / "cpu_attention.json"


def heldout_tokens(n: int) -> list[int]:
    """The first ``n`` token ids of the held-out files, concatenated in name order."""
    from tileinfer.tokenizer import Tokenizer

    tok = Tokenizer.from_folder(MODEL)
    text = "\n\n".join(p.read_text() for p in sorted((ROOT / "models" / "heldout").glob("*.py.txt")))
    ids = tok.encode(text, add_special_tokens=False)
    if len(ids) < n:
        raise SystemExit(f"the held-out files hold {len(ids)} tokens, fewer than {n}")
    return ids[:n]


class Tileinfer:
    name = "tileinfer"

    def __init__(self) -> None:
        import tileinfer

        self.engine = tileinfer.Engine.from_config(model=str(MODEL), device="cpu", temperature=0.0,
                                                   repetition_penalty=1.0, progress=False)  # plain greedy

    def prefill_ms(self, ids: list[int]) -> float:
        return self.engine.generate(ids, max_new_tokens=1, ignore_eos=True).stats.prefill_ms

    def decode_tok_s(self, ids: list[int], new: int) -> float:
        result = self.engine.generate(ids, max_new_tokens=new, ignore_eos=True)
        assert len(result.token_ids) == new
        return result.stats.decode_tok_s


class Transformers:
    name = "transformers-sdpa"

    def __init__(self) -> None:
        import transformers
        from transformers import Qwen3ForCausalLM

        transformers.utils.logging.disable_progress_bar()
        self.model = Qwen3ForCausalLM.from_pretrained(MODEL, attn_implementation="sdpa", dtype=torch.float32).eval()

    def _times(self, ids: list[int], new: int) -> list[float]:
        return token_arrivals(self.model, torch.tensor([ids]), new, do_sample=False, repetition_penalty=1.0,
                              pad_token_id=0)

    def prefill_ms(self, ids: list[int]) -> float:
        return self._times(ids, 1)[0] * 1e3

    def decode_tok_s(self, ids: list[int], new: int) -> float:
        times = self._times(ids, new)
        return (new - 1) / (times[-1] - times[0])


def interleaved(runners: list, fn, repeats: int) -> list[float]:
    """Median of ``repeats`` calls of ``fn(runner)`` for each runner, after one warm-up each; the
    runners take turns, so that a load that comes and goes on the machine falls on both alike."""
    samples: list[list[float]] = [[] for _ in runners]
    for _ in range(repeats + 1):
        for i, runner in enumerate(runners):
            samples[i].append(fn(runner))
    return [statistics.median(s[1:]) for s in samples]


def measure(runners: list, long_ids: list[int], short: int, new: int, repeats: int) -> dict[str, dict]:
    figures: dict[str, dict] = {r.name: {} for r in runners}
    rows = [("prefill_ms", lambda r: r.prefill_ms(long_ids), 2),
            (f"decode_tok_s_at_{short}", lambda r: r.decode_tok_s(long_ids[:short], new), 1),
            (f"decode_tok_s_at_{len(long_ids)}", lambda r: r.decode_tok_s(long_ids, new), 1)]
    for key, fn, digits in rows:
        for runner, value in zip(runners, interleaved(runners, fn, repeats)):
            figures[runner.name][key] = round(value, digits)
        print(f"{key}: " + ", ".join(f"{r.name} {figures[r.name][key]}" for r in runners), flush=True)
    return figures


def commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
        return out.stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     epilog=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--label", default="after", help="the run's name in the record (before, after, ...)")
    parser.add_argument("--long", type=int, default=1900, help="prompt tokens of the prefill and the long context")
    parser.add_argument("--short", type=int, default=8, help="prompt tokens of the short context")
    parser.add_argument("--new", type=int, default=65, help="tokens generated per decode run")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per figure, after one warm-up (default 5)")
    parser.add_argument("--out", type=Path, default=OUT, help=f"the JSON record (default {OUT})")
    parser.add_argument("--note", default="", help="a line kept with the run")
    args = parser.parse_args(argv)

    import transformers

    ids = heldout_tokens(args.long)
    threads = torch.get_num_threads()  # tileinfer leaves torch's default: the same for both
    run = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": commit(),
        "threads": threads,
        "note": args.note,
        "results": {},
    }
    run["load_average_before"] = [round(x, 2) for x in os.getloadavg()]
    run["results"] = measure([Tileinfer(), Transformers()], ids, args.short, args.new, args.repeats)
    run["load_average_after"] = [round(x, 2) for x in os.getloadavg()]

    record = json.loads(args.out.read_text()) if args.out.exists() else {}
    record.update({
        "what": "CPU path, shipped model (models/target): prefill of a held-out prompt, decode tok/s after "
                f"{args.short} and {args.long} positions ({args.new} new tokens, EOS ignored); medians of "
                f"{args.repeats} after a warm-up, wall clock; tileinfer default config (device cpu) and "
                "transformers Qwen3ForCausalLM (sdpa, float32) in the same run, taking turns, same thread count. "
                "Runs of different labels are separate processes on the same machine, minutes apart: compare "
                "each run's tileinfer with its own transformers figure.",
        "machine": {"cpu": platform.processor() or platform.machine(), "cores": len(os.sched_getaffinity(0)),
                    "python": platform.python_version(), "torch": torch.__version__,
                    "transformers": transformers.__version__},
        "prompt": {"source": "models/heldout/*.py.txt, concatenated, tokenized", "tokens": args.long},
    })
    record.setdefault("runs", {})[args.label] = run
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=2) + "\n")

    keys = list(next(iter(run["results"].values())))
    print(f"\n{'run':8} {'impl':18} " + " ".join(f"{k:>22}" for k in keys))
    for label, r in record["runs"].items():
        for name, figures in r["results"].items():
            print(f"{label:8} {name:18} " + " ".join(f"{figures.get(k, float('nan')):>22}" for k in keys))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
