"""The tables (and charts) of every benchmark, regenerated from the record stores.

Each table is of one kind of record (bench/records.py) and one group (a shape, a model, ...), and
comes from the records of ONE commit: the newest commit (by its newest record) whose records of
that table are complete (every row the table has: with the matrix measured a part per device
call, a table is complete when every part's rows of one commit are there). Each table says which commit, when, and
on which versions. The output is a function of the records alone, so that it is reproducible.

Writes docs/performance.md (--out) from bench/results/*/records.jsonl and, with matplotlib (``pip
install tileinfer[bench]``), a chart per matrix shape beside each store (matrix-<shape>.png).
``--add FILE...`` first appends the records of FILE (e.g. what a device call brought back) to
their machine's store, leaving out records already there.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from . import records as records_mod

OUT = Path(__file__).resolve().parents[1] / "docs" / "performance.md"
# The modules whose tables() the report shows, in this order.
MODULES = ("matrix_tables", "steps", "speculative", "kernels", "server", "install", "quality", "peers")


@dataclass(frozen=True)
class Table:
    kind: str  # the records' kind
    title: str  # "{group}" is replaced by the group
    render: Callable[[list[dict]], str]  # Markdown of one commit's selected records of one group ("": none)
    group: Callable[[dict], str] = field(default=lambda r: "")
    select: Callable[[dict], bool] = field(default=lambda r: True)
    missing: Callable[[list[dict], str], list[str]] = field(default=lambda records, group: [])  # rows it lacks


def markdown(header: list[str], rows: list[list[str]]) -> str:
    """A Markdown table; a row whose cells all carry the same note (``– (...)``) shows it once."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in rows:
        notes = [c for c in r if c.startswith("–")]
        if len(notes) > 1 and len(set(notes)) == 1:
            r = [c if i == r.index(notes[0]) or c != notes[0] else "–" for i, c in enumerate(r)]
        lines.append("| " + " | ".join(r) + " |")
    return "\n".join(lines)


def number(v: float | None, digits: int = 3) -> str:
    """``v`` with ``digits`` significant digits, ``-`` for None."""
    return "-" if v is None else f"{v:.{digits}g}" if abs(v) < 10 ** digits else f"{v:.0f}"


def all_tables() -> list[Table]:
    import importlib

    return [t for m in MODULES for t in importlib.import_module(f"bench.{m}").tables()]


def choose(records: list[dict], table: Table, group: str) -> tuple[list[dict] | None, str]:
    """The records of the newest complete commit for ``table`` and ``group``; where no commit is
    complete, None and what the newest commit lacks."""
    by_commit: dict[str, list[dict]] = {}
    for r in records:
        if r["kind"] == table.kind and table.group(r) == group and table.select(r):
            by_commit.setdefault(r["commit"], []).append(r)
    newest = sorted(by_commit, key=lambda c: (max(r["date"] for r in by_commit[c]), c), reverse=True)
    chosen = next((c for c in newest if not table.missing(by_commit[c], group)), None)
    if chosen:
        return by_commit[chosen], ""
    lacks = table.missing(by_commit[newest[0]], group)
    return None, (f"the newest, {newest[0]}, lacks {len(lacks)} ({', '.join(lacks[:6])}"
                  f"{', ...' if len(lacks) > 6 else ''})")


def provenance(records: list[dict]) -> str:
    """Commit, the runs' dates, and the versions of ``records``."""
    dates = sorted({r["date"] for r in records})
    when = f"run of {dates[0]}" if len(dates) == 1 else f"{len(dates)} runs, {dates[0]} to {dates[-1]}"
    versions = []
    for key, label in (("torch", "torch"), ("triton", "triton"), ("cuda", "CUDA"), ("gpu", "")):
        seen = sorted({str(r["versions"].get(key)) for r in records if r["versions"].get(key)})
        if seen:
            versions.append(f"{label} {' / '.join(seen)}".strip())
    return f"Commit {records[0]['commit']}, {when}; {', '.join(versions)}."


def notices(records: list[dict]) -> str:
    """The engine's notices during the runs of ``records`` (what a figure stands for where a
    feature fell back), each once with the variants it came with; "" when there were none."""
    seen: dict[str, list[str]] = {}
    for r in records:
        for message in r.get("notices") or ():
            names = seen.setdefault(message, [])
            name = r.get("variant") or r.get("peer") or r.get("kind")
            if name not in names:
                names.append(name)
    return "".join(f"\n\nNotice while measuring {', '.join(names)}: {m}" for m, names in seen.items())


def render(machine: str, records: list[dict], tables: list[Table]) -> str:
    out = [f"## {machine}"]
    for table in tables:
        groups = sorted({table.group(r) for r in records if r["kind"] == table.kind and table.select(r)})
        for group in groups:
            chosen, lacks = choose(records, table, group)
            title = table.title.format(group=group)
            if chosen is None:
                out.append(f"### {title}\n\nNo commit has every row of this table yet: {lacks}.")
            elif body := table.render(chosen):  # "": nothing of this table among the chosen records
                out.append(f"### {title}\n\n{provenance(chosen)}\n\n{body}{notices(chosen)}")
    return "\n\n".join(out)


def report(stores: list[Path]) -> str:
    tables = all_tables()
    sections = [render(store.parent.name, records_mod.load(store), tables) for store in stores]
    return ("# Performance tables\n\nGenerated by `python -m bench report` from `bench/results/<machine>/"
            "records.jsonl` (do not edit: measure, then report; `python -m bench --help`). Each table comes "
            "from the records of one commit, the newest that has every row of the table, named under its "
            "title.\n\n" + "\n\n".join(sections) + "\n")


def add(files: list[Path]) -> int:
    """Append the records of ``files`` to their machines' stores, leaving out those already there;
    the number appended."""
    added = 0
    for path in files:
        fresh: dict[Path, list[dict]] = {}
        for r in records_mod.load(path):
            store = records_mod.RESULTS / records_mod.machine(r["versions"].get("gpu")) / "records.jsonl"
            fresh.setdefault(store, []).append(r)
        for store, new in fresh.items():
            have = {json.dumps(r, sort_keys=True) for r in records_mod.load(store)}
            new = [r for r in new if json.dumps(r, sort_keys=True) not in have]
            records_mod.append(store, new)
            added += len(new)
    return added


def charts(stores: list[Path]) -> list[Path]:
    """Per store and matrix shape, the ablation table's records as a bar chart (matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("notice: matplotlib is not installed, so no charts (pip install 'tileinfer[bench]')")
        return []
    from .matrix_tables import name, tables

    ablation = tables()[1]
    written = []
    for store in stores:
        records = records_mod.load(store)
        for shape in sorted({r["shape"] for r in records if r["kind"] == "matrix"}):
            chosen, _ = choose(records, ablation, shape)
            measured = [r for r in chosen or [] if r["value"] is not None]
            decode = sorted({r["workload"] for r in measured if r["unit"] == "tok/s"})
            if not decode:
                continue
            labels = list(dict.fromkeys(name(r) for r in measured))
            fig, ax = plt.subplots(figsize=(16, 5))
            width = 0.8 / len(decode)
            for j, workload in enumerate(decode):
                index = {name(r): r for r in measured if r["workload"] == workload}
                xs = [i + (j - (len(decode) - 1) / 2) * width for i, n in enumerate(labels) if n in index]
                ax.bar(xs, [index[n]["value"] for n in labels if n in index], width, label=workload)
            ax.set_xticks(range(len(labels)), labels, rotation=45, ha="right")
            ax.set_yscale("log")
            ax.set_ylabel("decode tok/s")
            ax.set_title(f"{shape}: decode, commit {chosen[0]['commit']}")
            ax.legend(fontsize="small")
            fig.tight_layout()
            path = store.parent / f"matrix-{shape}.png"
            fig.savefig(path, dpi=100)
            plt.close(fig)
            written.append(path)
    return written


def arguments(p) -> None:
    p.description, p.epilog = __doc__.split("\n\n")[0], __doc__.split("\n\n", 1)[1]
    p.add_argument("--add", nargs="+", type=Path, metavar="FILE", default=[],
                   help="first append these records files to their machines' stores")
    p.add_argument("--out", type=Path, default=OUT, help="the Markdown file to write (default: docs/performance.md)")
    p.add_argument("--stores", nargs="+", type=Path, metavar="FILE",
                   help="the records.jsonl files to report (default: every bench/results/*/records.jsonl)")
    p.add_argument("--no-charts", action="store_true", help="tables only")


def main(args) -> int:
    if args.add:
        print(f"appended {add(args.add)} records")
    stores = args.stores or sorted(records_mod.RESULTS.glob("*/records.jsonl"))
    missing = [s for s in stores if not s.is_file()]
    if missing or not stores:
        print(f"error: no records at {', '.join(map(str, missing)) or records_mod.RESULTS}", file=sys.stderr)
        return 2
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(report(stores))
    written = [args.out, *([] if args.no_charts else charts(stores))]
    print("wrote " + ", ".join(str(p) for p in written))
    return 0
