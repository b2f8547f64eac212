"""The table of bench/compare_commits.sh: the default config of two commits, side by side.

    python bench/compare_commits.py DIR [--records FILE]   # DIR/<side>-<round>/results.json
    python bench/compare_commits.py FILE                   # the rows --records wrote, in one JSON file

For each shape and workload: each round's figure of each side (the median of that run's samples),
the median over the rounds, and after / before of the medians (a speed ratio: > 1 is faster after,
for prefill milliseconds too). The spread between one side's rounds is the noise the ratio is read
against. Prints Markdown.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

SIDES = ("before", "after")


def read(source: Path) -> list[dict]:
    """Every default row with a figure, each with its ``side`` and ``round``: from a folder of
    ``<side>-<round>/results.json`` or from one JSON file of such rows."""
    if source.is_file():
        return json.loads(source.read_text())
    found = []
    for path in source.glob("*-*/results.json"):
        side, round_ = path.parent.name.rsplit("-", 1)
        found += [{**row, "side": side, "round": int(round_)} for row in json.loads(path.read_text())
                  if row.get("variant") == "default" and row.get("value") is not None and side in SIDES]
    return sorted(found, key=lambda r: (r["round"], SIDES.index(r["side"]), r["shape"], r["workload"]))


def load(found: list[dict]) -> dict[tuple[str, str, str], list[dict]]:
    """(side, shape, workload) -> the rows of each round, in round order."""
    rows: dict[tuple[str, str, str], list[dict]] = {}
    for row in sorted(found, key=lambda r: r["round"]):
        rows.setdefault((row["side"], row["shape"], row["workload"]), []).append(row)
    return rows


def speed(row: dict) -> float:
    """Higher is faster: tok/s as is, milliseconds inverted."""
    return 1 / row["value"] if row["unit"] == "ms" else row["value"]


def table(rows: dict[tuple[str, str, str], list[dict]]) -> str:
    keys = sorted({(shape, workload) for _, shape, workload in rows})
    lines = ["| shape | workload | before (each round) | after (each round) | before, median | after, median | "
             "after / before (speed) |", "|---|---|---|---|---|---|---|"]
    for shape, workload in keys:
        before, after = rows.get(("before", shape, workload), []), rows.get(("after", shape, workload), [])
        unit = (before or after)[0]["unit"]

        def cells(side: list[dict]) -> str:
            return ", ".join(f"{r['value']:.4g}" for r in side) or "-"

        def median(side: list[dict]) -> str:
            if not side:
                return "-"
            value = statistics.median(r["value"] for r in side)
            fraction = statistics.median(r["roofline_fraction"] for r in side) if side[0].get("roofline_fraction") else None
            return f"{value:.4g} {unit}" + (f" ({fraction:.1%} of roofline)" if fraction else "")

        ratio = "-"
        if before and after:
            ratio = f"x{statistics.median(map(speed, after)) / statistics.median(map(speed, before)):.3f}"
        lines.append(f"| {shape} | {workload} | {cells(before)} | {cells(after)} | {median(before)} | "
                     f"{median(after)} | {ratio} |")
    commits = {side: sorted({r["commit"] for (s, _, _), rs in rows.items() if s == side for r in rs}) for side in SIDES}
    return "\n".join(lines) + f"\n\nbefore: {', '.join(commits['before'])}; after: {', '.join(commits['after'])}\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("source", type=Path, help="the rounds' folder of bench/compare_commits.sh, or the JSON "
                        "file --records wrote")
    parser.add_argument("--records", type=Path, metavar="FILE", help="also write every row (with side and round) "
                        "to FILE, one JSON list")
    args = parser.parse_args(argv)
    found = read(args.source)
    if not found:
        print(f"error: no default rows in {args.source}", file=sys.stderr)
        return 2
    if args.records:
        args.records.write_text(json.dumps(found, indent=1) + "\n")
    print(table(load(found)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
