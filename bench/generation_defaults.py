"""Which sampling defaults keep the shipped model from looping: candidate settings generated from
held-out prompts with the reference CPU engine, scored by how often the reply loops.

The prompts are the ``def`` lines of the held-out files (models/heldout/, never trained on; see
bench/prompts.py), each alone, as the README's first command gives ``def fibonacci(n):``. Each
candidate (greedy, greedy with a repetition penalty, sampling settings over several seeds)
generates ``--new-tokens`` tokens from each prompt, with the model's EOS. Scored per reply:

- ``loops``: the reply ran to the length limit and its second half is one cycle of at most a
  quarter of its length repeated (tokens[i] == tokens[i - p] for every i in the second half);
- ``repeated_line``: some non-blank line of 4+ characters occurs 3 or more times;
- ``distinct_2``: distinct token bigrams over bigrams (1.0: no bigram twice).

The chosen setting has the fewest looping replies, then the fewest repeated lines, then is greedy
(reproducible without a seed), then is the mildest change from plain greedy decoding (the smallest
penalty: code repeats names and indentation by nature, so more distinct output is not better). The JSON record holds every candidate's scores,
the README prompt's reply under each, and the choice; models/target/generation_config.json is set
from it by hand (this script writes no checkpoint).

examples:
  python bench/generation_defaults.py                     # writes bench/results/cpu/generation_defaults.json
  python bench/generation_defaults.py --prompts 8 --new-tokens 32 --out /tmp/g.json   # a quick look
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import torch  # noqa: E402

from tileinfer.models import prompts as prompts_mod  # noqa: E402
from records import git_commit  # noqa: E402
import tileinfer  # noqa: E402
from tileinfer.interfaces import SamplingParams  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "results" / "cpu" / "generation_defaults.json"
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


def heldout_prompts(limit: int) -> list[str]:
    """The distinct ``def`` lines of the held-out files, dedented, in file order."""
    seen: list[str] = []
    for name in sorted({b[0] for b in prompts_mod.BENCHMARK}):
        for line in (prompts_mod.HELDOUT_DIR / name).read_text().splitlines():
            m = re.match(r"\s*(def \w+\(.*\):)\s*$", line)
            if m and m.group(1) not in seen and m.group(1) != README_PROMPT:
                seen.append(m.group(1))
    return seen[:limit]


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=24, help="held-out prompts (default 24)")
    parser.add_argument("--new-tokens", type=int, default=64, help="tokens per reply (default 64, the README's)")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads (default 1)")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    engine = tileinfer.Engine.from_config("reference", device="cpu", dtype="float32", threads=args.threads,
                                          progress=False)
    prompts = heldout_prompts(args.prompts)
    rows = {}
    for name, fields in CANDIDATES.items():
        rows[name] = {"sampling": fields, **score(engine, prompts, fields, args.new_tokens)}
        params = SamplingParams(**{"temperature": 0.0, "repetition_penalty": 1.0, **fields, "seed": 0})
        readme = engine.generate(README_PROMPT, max_new_tokens=args.new_tokens, sampling=params)
        rows[name]["readme_reply"] = readme.text
        rows[name]["readme_loops"] = loops(readme.token_ids, args.new_tokens) or repeated_line(readme.text)
        print(f"{name:<24} loops {rows[name]['loops']:.2f}  repeated_line {rows[name]['repeated_line']:.2f}  "
              f"distinct_2 {rows[name]['distinct_2']:.2f}  eos {rows[name]['eos']:.2f}", flush=True)
    chosen = min(rows, key=lambda k: (rows[k]["loops"], rows[k]["repeated_line"],
                                      rows[k]["sampling"].get("temperature", 0) > 0, strength(rows[k]["sampling"])))
    record = {"script": "bench/generation_defaults.py", "command": " ".join(["python", "bench/generation_defaults.py",
                                                                            *(argv or sys.argv[1:])]),
              "model": "models/target", "engine": "reference config, cpu, float32", "threads": args.threads,
              "new_tokens": args.new_tokens, "prompts": prompts, "readme_prompt": README_PROMPT,
              "candidates": rows, "chosen": chosen, "torch": torch.__version__, "machine": platform.machine(),
              "commit": git_commit(),
              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=1, ensure_ascii=False) + "\n")
    print(f"chosen: {chosen} {rows[chosen]['sampling']} -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
