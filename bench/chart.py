"""results.png: one bar chart per shape (matplotlib, an optional dependency: ``pip install
tileinfer[bench]``; without it the chart is skipped with a one-line notice)."""

from __future__ import annotations

from pathlib import Path

from records import name
from workloads import NAMES


def plot(rows: list[dict], path: Path) -> bool:
    """Per shape: decode tok/s per variant/peer and workload (log scale), each bar's roofline
    marked with a black tick; prefill ms per variant/peer. ``rows`` holds one row per
    shape/name/workload. False (and a notice) without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("notice: matplotlib is not installed, so no results.png (pip install 'tileinfer[bench]')")
        return False
    shapes = list(dict.fromkeys(r["shape"] for r in rows))
    decode = [n for n in NAMES if n.startswith("decode") and any(r["workload"] == n for r in rows)]
    fig, axes = plt.subplots(len(shapes), 2, figsize=(16, 4.5 * len(shapes)), squeeze=False)
    for (ax_d, ax_p), shape in zip(axes, shapes):
        mine = [r for r in rows if r["shape"] == shape and r["value"] is not None]
        labels = list(dict.fromkeys(name(r) for r in mine))
        width = 0.8 / max(len(decode), 1)
        for j, workload in enumerate(decode):
            labelled = False
            for i, label in enumerate(labels):
                r = next((x for x in mine if name(x) == label and x["workload"] == workload), None)
                if r is None:
                    continue
                x = i + (j - (len(decode) - 1) / 2) * width
                ax_d.bar(x, r["value"], width, color=f"C{j}", label=None if labelled else workload)
                labelled = True
                ax_d.hlines(r["roofline_tok_s"], x - width / 2, x + width / 2, colors="black")
        ax_d.set_xticks(range(len(labels)), labels, rotation=45, ha="right")
        ax_d.set_yscale("log")
        ax_d.set_ylabel("decode tok/s (black: roofline)")
        ax_d.set_title(f"{shape}: decode")
        if ax_d.get_legend_handles_labels()[0]:
            ax_d.legend(fontsize="small")
        pre = [(name(r), r["value"]) for r in mine if r["workload"] == "prefill1024"]
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
