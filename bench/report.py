"""results.md (and results.png) from the rows of one commit's matrix; the merge of its parts.

    python bench/report.py --merge DIR [DIR ...] --out DIR   # parts of one commit -> one results.*
    python bench/report.py --render DIR                      # DIR/results.md and .png from DIR/results.json

--merge reads each DIR/results.json (one part of bench/gpu_matrix.sh, or any run of
bench/run.py), refuses parts of different commits or GPUs and rows measured by two parts, and
writes results.json, results.md and (with matplotlib) results.png under --out from scratch.
--render refuses a results.json that is not one such matrix (e.g. rows of several runs).

Tables, one section per shape: (1) the summary (default and the quantized variants: prefill ms and
TFLOP/s, decode tok/s and fraction of the roofline), (2) the ablation (every variant and the gain
of the feature it switches off: default over the variant, > 1 when the feature helps), (3) the
CUDA-graph chain, (4) the peers (their figures and our default's speed over theirs; a peer that
could not run shows its reason in its cells, one of bench/peers.py that has no row at all is named
below the table, and peers recorded by other scripts, e.g. llama.cpp, follow them). Every gain
divides by the default measured in the same part (run); where a part measured no default, or the
two rows of a chain step come from different parts, the gain is left blank.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import chart  # noqa: E402
import records as records_mod  # noqa: E402
from peers import PEERS  # noqa: E402
from records import CombineError, name  # noqa: E402
from variants import QUANTIZED, VARIANTS  # noqa: E402
from workloads import NAMES  # noqa: E402

# The CUDA-graph table: per kernel set, the variants that run its decode steps eagerly,
# replayed from graphs step by step, and replayed with the host one step behind (pipelined).
GRAPH_WORKLOAD = "decode128_ctx1024"
GRAPH_STEPS = ("eager", "CUDA graphs", "CUDA graphs + pipelined")
GRAPH_TABLE = (("fused", ("eager", "no-pipelining", "default")),
               ("one kernel per op", ("eager-per-op", "no-fused-kernels-no-pipelining", "no-fused-kernels")))
GAIN_NOTE = "x: divides by the default measured in the same part; blank where that part measured none."


def _num(v: float) -> str:
    return f"{v:.0f}" if v >= 100 else f"{v:.1f}" if v >= 10 else f"{v:.2f}" if v >= 0.01 else f"{v:.3g}"


def _cell(row: dict | None, *, fraction: bool = True, note_chars: int = 100) -> str:
    if row is None:
        return ""
    if row["value"] is None:
        return f"– ({(row['note'] or 'not run')[:note_chars]})"
    text = f"{_num(row['value'])} {row['unit']}"
    if fraction and row["roofline_fraction"] is not None:
        text += f" ({row['roofline_fraction']:.1%})"
    if fraction and row["tflops"] is not None:
        text += f", {_num(row['tflops'])} TFLOP/s ({row['peak_fraction']:.1%})"
    return text


def _ratio(ours: dict | None, theirs: dict | None) -> str:
    """How many times faster ``ours`` is (ms: theirs / ours; tok/s: ours / theirs), if both are
    measured in the same part; else empty."""
    if not ours or not theirs or ours["value"] is None or theirs["value"] is None:
        return ""
    if ours.get("part") != theirs.get("part"):
        return ""
    r = theirs["value"] / ours["value"] if ours["unit"] == "ms" else ours["value"] / theirs["value"]
    return f" x{r:.2f}"


def _table(header: list[str], rows: list[list[str]]) -> str:
    """Markdown; a row whose cells all carry the same note shows it once."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in rows:
        cells = [c for c in r if c.startswith("–")]
        if len(cells) > 1 and len(set(cells)) == 1:
            r = [c if i == r.index(cells[0]) or c != cells[0] else "–" for i, c in enumerate(r)]
        lines.append("| " + " | ".join(r) + " |")
    return "\n".join(lines)


def order(records: list[dict]) -> tuple[list[str], list[str]]:
    """The shapes as they first appear, and the workloads in the matrix's order."""
    shapes = list(dict.fromkeys(r["shape"] for r in records))
    names = list(dict.fromkeys(r["workload"] for r in records))
    return shapes, sorted(names, key=lambda n: NAMES.index(n) if n in NAMES else len(NAMES))


def main_part(rows: list[dict]) -> str | None:
    """The part whose default a shape's summary shows: the one that measured most variants."""
    counts: dict = {}
    for r in rows:
        if r["variant"] is not None:
            counts[r.get("part")] = counts.get(r.get("part"), 0) + 1
    return max(counts, key=counts.get) if counts else None


def figures(records: list[dict]) -> list[dict]:
    """One row per shape/variant-or-peer/workload: every row, the default of each shape's main part only."""
    mains = {s: main_part([r for r in records if r["shape"] == s]) for s in order(records)[0]}
    return [r for r in records if r["variant"] != "default" or r.get("part") == mains[r["shape"]]]


def tables(records: list[dict]) -> str:
    """The four tables (summary, ablation, CUDA graphs, peers), Markdown, one section per shape."""
    shapes, names = order(records)
    return "\n\n".join(_shape_tables(s, [r for r in records if r["shape"] == s], names) for s in shapes) + "\n"


def _shape_tables(shape: str, rows: list[dict], names: list[str]) -> str:
    defaults = {(r.get("part"), r["workload"]): r for r in rows if r["variant"] == "default"}
    index = {(name(r), r["workload"]): r for r in figures(rows)}
    sizes = {r["workload"]: f"{r['prompt_tokens']}+{r['new_tokens']}" for r in rows}
    configs = {r["variant"]: r.get("config") for r in rows if r["variant"]}  # as measured
    variants = [*(v for v in VARIANTS if v in configs), *(v for v in configs if v not in VARIANTS)]

    def gain(row: dict | None) -> str:
        return _ratio(defaults.get((row.get("part"), row["workload"])), row) if row else ""

    out = [f"## {shape}\n\nprompt + new tokens: " + ", ".join(f"{n} {sizes[n]}" for n in names if n in sizes)]
    summary = [[v, *(_cell(index.get((v, n))) for n in names)] for v in variants if v in ("default", *QUANTIZED)]
    if summary:
        out.append("### Summary (decode: % of the roofline; prefill: TFLOP/s, % of the matmul peak)\n\n"
                   + _table(["variant", *names], summary))
    ablation = [[v, " ".join(configs[v] or []) or "configs/default.yaml",
                 *(_cell(index.get((v, n)), fraction=False) + ("" if v == "default" else gain(index.get((v, n))))
                   for n in names)] for v in variants]
    if ablation:
        out.append("### Ablation (the gain of the feature switched off: default over the variant)\n\n"
                   + _table(["variant", "config", *names], ablation) + "\n\n" + GAIN_NOTE)
    graph_rows = []
    for kernels, chain in GRAPH_TABLE:
        previous = None
        for step, variant in zip(GRAPH_STEPS, chain):
            row = index.get((variant, GRAPH_WORKLOAD))
            if row is not None and row["value"] is not None:
                graph_rows.append([kernels, step, variant, _cell(row), _ratio(row, previous).strip()])
                previous = row
    if graph_rows:
        out.append(f"### CUDA graphs ({GRAPH_WORKLOAD}; gain: over the row above, blank across parts)\n\n"
                   + _table(["kernels", "decode steps", "variant", "tok/s", "gain"], graph_rows))
    peer_rows = []
    peers = [*PEERS, *dict.fromkeys(r["peer"] for r in rows if r["peer"] and r["peer"] not in PEERS)]
    for part in dict.fromkeys(r.get("part") for r in rows if r["peer"]):
        mine = {(r["peer"], r["workload"]): r for r in rows if r["peer"] and r.get("part") == part}
        label = "default" + (f" ({part})" if part is not None else "")
        peer_rows.append([label, *(_cell(defaults.get((part, n)), fraction=False) for n in names)])
        peer_rows += [[p, *(_cell(mine.get((p, n)), fraction=False, note_chars=200) + gain(mine.get((p, n)))
                            for n in names)] for p in peers if any(k[0] == p for k in mine)]
    if peer_rows:
        absent = [p for p in PEERS if not any(r["peer"] == p for r in rows)]
        out.append("### Peers (x: our default's speed over theirs)\n\n" + _table(["peer", *names], peer_rows)
                   + "\n\n" + GAIN_NOTE
                   + (f"\n\nNot measured (no row in these results): {', '.join(absent)}." if absent else ""))
    return "\n\n".join(out)


def header(records: list[dict]) -> str:
    """Where the figures come from: the commit and versions, and each part's date and limits."""
    first = records[0]
    parts = {}
    for r in records:
        parts.setdefault(r.get("part"), r)
    lines = [f"- {part + ': ' if part else ''}{r['date']}, copy bandwidth {r['copy_bandwidth_tb_s']:.3g} TB/s, "
             f"matmul peak {r['matmul_peak_tflops']:.3g} TFLOP/s" for part, r in parts.items()]
    return (f"# tileinfer benchmark: {first['gpu']}\n\ncommit {first['commit']}, torch {first['torch']}, "
            f"triton {first['triton']}; the limits measured in the same run as the rows they bound:\n\n"
            + "\n".join(lines) + "\n")


def render(records: list[dict], out: Path, *, chart_too: bool = True) -> list[Path]:
    """results.md and, with ``chart_too`` and matplotlib, results.png of ``records`` under ``out``."""
    (out / "results.md").write_text(header(records) + "\n" + tables(records))
    written = [out / "results.md"]
    if chart_too and chart.plot(figures(records), out / "results.png"):
        written.append(out / "results.png")
    return written


def write(records: list[dict], out: Path, *, chart_too: bool = True) -> list[Path]:
    """results.json (exactly ``records``, nothing kept from an earlier file) and, if there are
    rows, :func:`render`'s files under ``out``; returns the paths written."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / "results.json"
    path.write_text(json.dumps(records, indent=1, allow_nan=False) + "\n")
    return [path, *(render(records, out, chart_too=chart_too) if records else [])]


def missing(records: list[dict]) -> list[str]:
    """``SHAPE/NAME/WORKLOAD`` of the full matrix (every variant and peer at the four workloads,
    for each shape present) that no row holds."""
    have = {(r["shape"], name(r), r["workload"]) for r in records}
    return [f"{s}/{n}/{w}" for s in order(records)[0] for n in [*VARIANTS, *PEERS] for w in NAMES
            if (s, n, w) not in have]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    todo = p.add_mutually_exclusive_group(required=True)
    todo.add_argument("--merge", nargs="+", type=Path, metavar="DIR", help="part folders, each with a results.json")
    todo.add_argument("--render", type=Path, metavar="DIR", help="write DIR/results.md (and .png) from DIR/results.json")
    p.add_argument("--out", type=Path, help="with --merge: the folder to write (its results.* are replaced)")
    args = p.parse_args(argv)
    if args.merge and not args.out:
        p.error("--merge needs --out")
    try:
        if args.merge:
            rows = records_mod.combine(records_mod.load_parts(args.merge))
        else:
            rows = json.loads((args.render / "results.json").read_text())
            records_mod.check_one_matrix(rows)
    except (CombineError, OSError, json.JSONDecodeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    gaps = missing(rows)
    if gaps:
        print(f"notice: {len(gaps)} rows of the full matrix were not measured: {', '.join(gaps[:12])}"
              + (", ..." if len(gaps) > 12 else ""), file=sys.stderr)
    written = write(rows, args.out) if args.merge else render(rows, args.render)
    print("wrote " + ", ".join(str(path) for path in written))
    return 0


if __name__ == "__main__":
    sys.exit(main())
