"""Records and their presentation: results.json, the Markdown tables, the bar chart.

A record is one row of the matrix (one shape x variant-or-peer x workload). ``value`` is null
when the row was not measured, and ``note`` says why (a config that does not load, an
incompatible combination, out of memory, a peer that failed). Tables: (1) the summary (default
and the quantized variants: prefill ms and TFLOP/s, decode tok/s and fraction of the roofline),
(2) the ablation (every variant and the gain of the feature it switches off: default over the
variant, > 1 when the feature helps), (3) the CUDA-graph chain, (4) the peers (their figures and
our default's speed over theirs). A gain divides by the default row of the same run (``date``);
results.json keeps a replaced default row, ``superseded: true``, while rows of its run remain, and
a gain against another run's default is marked.
"""

from __future__ import annotations

import datetime
import json
import math
import subprocess
from pathlib import Path

import torch

from limits import Limits
from roofline import decode_roofline_tok_s, prefill_flops
from tileinfer.model_config import ModelConfig
from variants import QUANTIZED, VARIANTS
from workloads import NAMES, Measurement, Workload

REQUIRED = ("shape", "variant", "workload", "value", "unit", "roofline_fraction", "tflops", "peak_fraction", "peer",
            "gpu", "torch", "triton", "commit", "date")


def environment(limits: Limits, commit: str | None = None) -> dict:
    """Where and when: gpu, torch, triton, commit (``git rev-parse --short HEAD`` or null), date."""
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    if commit is None:
        try:
            commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                    cwd=Path(__file__).parent, timeout=10).stdout.strip() or None
        except (OSError, subprocess.SubprocessError):
            commit = None
    return {"gpu": limits.device, "torch": torch.__version__, "triton": triton_version, "commit": commit,
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "copy_bandwidth_tb_s": limits.copy_bandwidth / 1e12, "matmul_peak_tflops": limits.matmul_peak / 1e12}


def record(*, shape: str, workload: Workload, env: dict, mc: ModelConfig, variant: str | None = None,
           peer: str | None = None, measurement: Measurement | None = None, note: str | None = None,
           layout: dict | None = None, kv_capacity: int | None = None) -> dict:
    """One row. ``layout`` (``quantize``, ``storage``, ``dtype_bytes``) sets the roofline's bytes."""
    value = measurement.value if measurement else None
    row = {"shape": shape, "variant": variant, "peer": peer, "workload": workload.name, "value": value,
           "unit": workload.unit, "roofline_fraction": None, "roofline_tok_s": None, "tflops": None,
           "peak_fraction": None, "prompt_tokens": workload.prompt_tokens, "new_tokens": workload.new_tokens,
           "kv_capacity": kv_capacity, "samples": measurement.samples if measurement else [], "note": note,
           "config": VARIANTS.get(variant) if variant else None, **env}
    if value is None:
        return row
    if workload.kind == "decode":
        roof = decode_roofline_tok_s(mc, workload.prompt_tokens, workload.new_tokens,
                                     env["copy_bandwidth_tb_s"] * 1e12, **(layout or {}))
        row.update(roofline_tok_s=roof, roofline_fraction=value / roof)
    else:
        flops = prefill_flops(mc, workload.prompt_tokens)["total"]
        row.update(tflops=flops / (value / 1e3) / 1e12)
        row.update(peak_fraction=row["tflops"] / env["matmul_peak_tflops"])
    return row


def key(row: dict) -> tuple:
    """What identifies a row: shape, variant, peer, workload."""
    return row["shape"], row["variant"], row["peer"], row["workload"]


def run_of(row: dict) -> tuple:
    """Which run of bench/run.py measured a row: its shape and the run's start (``date``)."""
    return row["shape"], row.get("date")


def merge(old: list[dict], new: list[dict]) -> list[dict]:
    """``old`` with the rows of ``new`` replacing those of the same shape/variant/peer/workload.

    A replaced ``default`` row of another run stays, marked ``superseded``, as long as other rows
    of its run remain: it is their baseline, so that each gain is a ratio within one run (rows
    bound by the host, eager steps and prefill, vary between runs more than the gains)."""
    replaced = {key(r) for r in new}
    new_runs = {run_of(r) for r in new}
    rows = []
    for r in old:
        if key(r) in replaced and not r.get("superseded"):
            if r["variant"] != "default" or run_of(r) in new_runs:
                continue
            r = {**r, "superseded": True}
        rows.append(r)
    rows += new
    live = {run_of(r) for r in rows if r["variant"] != "default"}
    return [r for r in rows if not r.get("superseded") or run_of(r) in live]


def current(records: list[dict]) -> list[dict]:
    """The rows that are the matrix's figures (without superseded baselines)."""
    return [r for r in records if not r.get("superseded")]


def _num(v: float) -> str:
    return f"{v:.0f}" if v >= 100 else f"{v:.1f}" if v >= 10 else f"{v:.2f}" if v >= 0.01 else f"{v:.3g}"


def _cell(row: dict | None, *, fraction: bool = True) -> str:
    if row is None:
        return ""
    if row["value"] is None:
        return f"– ({(row['note'] or 'not run')[:100]})"
    text = f"{_num(row['value'])} {row['unit']}"
    if fraction and row["roofline_fraction"] is not None:
        text += f" ({row['roofline_fraction']:.1%})"
    if fraction and row["tflops"] is not None:
        text += f", {_num(row['tflops'])} TFLOP/s ({row['peak_fraction']:.1%})"
    return text


def _ratio(ours: dict | None, theirs: dict | None) -> str:
    """How many times faster ``ours`` is (ms: theirs / ours; tok/s: ours / theirs)."""
    if not ours or not theirs or ours["value"] is None or theirs["value"] is None:
        return ""
    r = theirs["value"] / ours["value"] if ours["unit"] == "ms" else ours["value"] / theirs["value"]
    return f" x{r:.2f}"


CROSS_RUN = "†"
CROSS_RUN_NOTE = (f"{CROSS_RUN}: against the default of another run (the row's own run measured no default); "
                  "rows bound by the host (eager steps, prefill) vary between runs.")


def _table(header: list[str], rows: list[list[str]]) -> str:
    """Markdown; a row whose cells all carry the same note shows it once."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in rows:
        cells = [c for c in r if c.startswith("–")]
        if len(cells) > 1 and len(set(cells)) == 1:
            r = [c if i == r.index(cells[0]) or c != cells[0] else "–" for i, c in enumerate(r)]
        lines.append("| " + " | ".join(r) + " |")
    return "\n".join(lines)


# The seed's CUDA-graph table: per kernel set, the variants that run its decode steps eagerly,
# replayed from graphs step by step, and replayed with the host one step behind (pipelined).
GRAPH_WORKLOAD = "decode128_ctx1024"
GRAPH_STEPS = ("eager", "CUDA graphs", "CUDA graphs + pipelined")
GRAPH_TABLE = (("fused", ("tile-eager", "no-pipelining", "default")),
               ("one kernel per op", ("unfused-eager", "no-fused-kernels-no-pipelining", "no-fused-kernels")))


def _order(records: list[dict]) -> tuple[list[str], list[str]]:
    shapes = list(dict.fromkeys(r["shape"] for r in records))
    names = list(dict.fromkeys(r["workload"] for r in records))
    return shapes, sorted(names, key=lambda n: NAMES.index(n) if n in NAMES else len(NAMES))


def tables(records: list[dict]) -> str:
    """The four tables (summary, ablation, CUDA graphs, peers), Markdown, one section per shape."""
    shapes, names = _order(records)
    return "\n\n".join(_shape_tables(s, [r for r in records if r["shape"] == s], names) for s in shapes) + "\n"


def _shape_tables(shape: str, rows: list[dict], names: list[str]) -> str:
    baselines = {(r.get("date"), r["workload"]): r for r in rows if r["variant"] == "default"}
    rows = current(rows)
    index = {(r["variant"], r["peer"], r["workload"]): r for r in rows}
    sizes = {r["workload"]: f"{r['prompt_tokens']}+{r['new_tokens']}" for r in rows}
    variants = [v for v in VARIANTS if any(r["variant"] == v for r in rows)]
    peers = list(dict.fromkeys(r["peer"] for r in rows if r["peer"]))

    def gain(row: dict | None, n: str) -> str:
        """Our default's speed over ``row``'s: the default of the same run, else the current one (marked)."""
        base = baselines.get((row.get("date"), n)) if row else None
        text = _ratio(base or index.get(("default", None, n)), row)
        return text + CROSS_RUN if text and base is None else text

    def note(table: str, line: str = CROSS_RUN_NOTE) -> str:
        return table + "\n\n" + line if CROSS_RUN in table else table

    out = [f"## {shape}\n\nprompt + new tokens: " + ", ".join(f"{n} {sizes[n]}" for n in names if n in sizes)]
    summary = [[v, *(_cell(index.get((v, None, n))) for n in names)] for v in variants if v in ("default", *QUANTIZED)]
    if summary:
        out.append("### Summary (decode: % of the roofline; prefill: TFLOP/s, % of the matmul peak)\n\n"
                   + _table(["variant", *names], summary))
    ablation = [[v, " ".join(VARIANTS[v]) or "configs/default.yaml",
                 *(_cell(index.get((v, None, n)), fraction=False)
                   + ("" if v == "default" else gain(index.get((v, None, n)), n)) for n in names)]
                for v in variants]
    if ablation:
        out.append(note("### Ablation (x: the gain of the feature switched off, default over the variant)\n\n"
                        + _table(["variant", "config", *names], ablation)))
    graph_rows = []
    for kernels, chain in GRAPH_TABLE:
        previous = None
        for step, variant in zip(GRAPH_STEPS, chain):
            row = index.get((variant, None, GRAPH_WORKLOAD))
            if row is not None and row.get("value") is not None:
                text = _ratio(row, previous).strip() if previous else ""
                if text and row.get("date") != previous.get("date"):
                    text += CROSS_RUN
                graph_rows.append([kernels, step, variant, _cell(row), text])
                previous = row
    if graph_rows:
        out.append(note(f"### CUDA graphs ({GRAPH_WORKLOAD}; gain: over the row above)\n\n"
                        + _table(["kernels", "decode steps", "variant", "tok/s", "gain"], graph_rows),
                        f"{CROSS_RUN}: the two rows come from different runs."))
    if peers:
        rows = [[p, *(_cell(index.get((None, p, n)), fraction=False) + gain(index.get((None, p, n)), n)
                      for n in names)] for p in peers]
        out.append(note("### Peers (x: our default's speed over theirs)\n\n" + _table(["peer", *names], rows)))
    return "\n\n".join(out)


def header(records: list[dict]) -> str:
    """Where the figures come from, from the newest record."""
    r = max(records, key=lambda x: x["date"])
    return (f"# tileinfer benchmark: {r['gpu']}\n\ntorch {r['torch']}, triton {r['triton']}, commit {r['commit']}, "
            f"{r['date']}; copy bandwidth {r['copy_bandwidth_tb_s']:.3g} TB/s, BF16 matmul peak "
            f"{r['matmul_peak_tflops']:.3g} TFLOP/s (measured in the same run)\n")


def write(records: list[dict], out: Path, *, chart: bool = True) -> list[Path]:
    """results.json (merged with an existing one), results.md and, with ``chart`` and matplotlib,
    results.png, all of the merged rows."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / "results.json"
    if path.is_file():
        records = merge(json.loads(path.read_text()), records)
    path.write_text(json.dumps(records, indent=1, allow_nan=False) + "\n")
    (out / "results.md").write_text(header(records) + "\n" + tables(records))
    written = [path, out / "results.md"]
    if chart and plot(records, out / "results.png"):
        written.append(out / "results.png")
    return written


def plot(records: list[dict], path: Path) -> bool:
    """Bar chart per shape: decode tok/s per variant/peer and workload, each bar's roofline marked
    with a black tick; prefill ms per variant/peer. False (and a notice) without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("notice: matplotlib is not installed: no results.png (pip install matplotlib)")
        return False
    shapes, names = _order(records)
    decode = [n for n in names if not n.startswith("prefill")]
    fig, axes = plt.subplots(len(shapes), 2, figsize=(16, 4.5 * len(shapes)), squeeze=False)
    for (ax_d, ax_p), shape in zip(axes, shapes):
        rows = [r for r in current(records) if r["shape"] == shape and r["value"] is not None]
        labels = list(dict.fromkeys(r["variant"] or r["peer"] for r in rows))
        width = 0.8 / max(len(decode), 1)
        for j, name in enumerate(decode):
            labelled = False
            for i, label in enumerate(labels):
                r = next((x for x in rows if (x["variant"] or x["peer"]) == label and x["workload"] == name), None)
                if r is None:
                    continue
                x = i + (j - (len(decode) - 1) / 2) * width
                ax_d.bar(x, r["value"], width, color=f"C{j}", label=None if labelled else name)
                labelled = True
                ax_d.hlines(r["roofline_tok_s"], x - width / 2, x + width / 2, colors="black")
        ax_d.set_xticks(range(len(labels)), labels, rotation=45, ha="right")
        ax_d.set_yscale("log")
        ax_d.set_ylabel("decode tok/s (black: roofline)")
        ax_d.set_title(f"{shape}: decode")
        if ax_d.get_legend_handles_labels()[0]:
            ax_d.legend(fontsize="small")
        pre = [(r["variant"] or r["peer"], r["value"]) for r in rows if r["workload"] == "prefill1024"]
        ax_p.bar([p[0] for p in pre], [p[1] for p in pre], color="C7")
        ax_p.tick_params(axis="x", rotation=45)
        for label in ax_p.get_xticklabels():
            label.set_horizontalalignment("right")
        ax_p.set_ylabel("prefill ms")
        ax_p.set_title(f"{shape}: prefill1024")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def check(row: dict) -> None:
    """What the smoke test asserts of a measured row (never a timing)."""
    missing = [k for k in REQUIRED if k not in row]
    assert not missing, f"record lacks {missing}"
    assert row["value"] is not None and math.isfinite(row["value"]) and row["value"] > 0, row
    figure = row["roofline_fraction"] if row["unit"] == "tok/s" else row["tflops"]
    assert figure is not None and math.isfinite(figure) and figure > 0, row
