"""The matrix's tables in ``python -m bench report`` (records of kind ``matrix``, bench/matrix.py),
one shape each: the headline against the peers, the summary, the ablation, the CUDA-graph chain and
the peers, each from one commit that has every row the matrix's parts measure."""

from __future__ import annotations

from . import peers as peers_mod
from .matrix import expected
from .workloads import ALL_NAMES, QUANTIZED, VARIANTS

GRAPH_WORKLOAD = "decode128_ctx1024"
GRAPH_STEPS = ("eager", "CUDA graphs", "CUDA graphs + pipelined")
GRAPH_TABLE = (("fused", ("eager", "no-pipelining", "default")),
               ("one kernel per op", ("eager-per-op", "no-fused-kernels-no-pipelining", "no-fused-kernels")))
GAIN_NOTE = "x: over the default measured in the same run; blank where that run measured none."


def name(r: dict) -> str:
    """The record's variant or peer."""
    return r["variant"] or r["peer"]


def run_of(r: dict) -> tuple:
    return r["date"], r.get("part")


def _num(v: float) -> str:
    return f"{v:.0f}" if v >= 100 else f"{v:.1f}" if v >= 10 else f"{v:.2f}" if v >= 0.01 else f"{v:.3g}"


def _cell(r: dict | None, *, fraction: bool = True, note_chars: int = 100) -> str:
    if r is None:
        return ""
    if r["value"] is None:
        return f"– ({(r['note'] or 'not run')[:note_chars]})"
    text = f"{_num(r['value'])} {r['unit']}"
    if fraction and r.get("roofline_fraction") is not None:
        text += f" ({r['roofline_fraction']:.1%})"
    if fraction and r.get("tflops") is not None:
        text += f", {_num(r['tflops'])} TFLOP/s ({r['peak_fraction']:.1%})"
    return text


def _ratio(ours: dict | None, theirs: dict | None) -> str:
    """How many times faster ``ours`` is (ms: theirs / ours; tok/s: ours / theirs), if both are
    measured in the same run; else empty."""
    if not ours or not theirs or ours["value"] is None or theirs["value"] is None or run_of(ours) != run_of(theirs):
        return ""
    r = theirs["value"] / ours["value"] if ours["unit"] == "ms" else ours["value"] / theirs["value"]
    return f" x{r:.2f}"


class Rows:
    """One commit's matrix records of one shape: the newest record of each name and workload, and
    each run's default (what that run's gains divide by)."""

    def __init__(self, records: list[dict]) -> None:
        ordered = sorted(records, key=lambda r: r["date"])
        self.index = {(name(r), r["workload"]): r for r in ordered}
        self.defaults = {(run_of(r), r["workload"]): r for r in ordered if r["variant"] == "default"}
        self.workloads = sorted({r["workload"] for r in records},
                                key=lambda w: ALL_NAMES.index(w) if w in ALL_NAMES else len(ALL_NAMES))
        counts: dict = {}
        for r in records:
            if r["variant"] not in (None, "default"):
                counts[run_of(r)] = counts.get(run_of(r), 0) + 1
        main = max(counts, key=lambda k: (counts[k], k)) if counts else None
        for w in self.workloads:  # the summary's default: the one of the run that measured most variants
            if (main, w) in self.defaults:
                self.index["default", w] = self.defaults[main, w]

    def gain(self, r: dict | None) -> str:
        return _ratio(self.defaults.get((run_of(r), r["workload"])), r) if r else ""

    def sizes(self) -> str:
        sizes = {r["workload"]: f"{r['prompt_tokens']}+{r['new_tokens']}" for r in self.index.values()}
        return "prompt + new tokens: " + ", ".join(f"{w} {sizes[w]}" for w in self.workloads)


def summary_table(records: list[dict]) -> str:
    from .report import markdown

    rows = Rows(records)
    body = [[v, *(_cell(rows.index.get((v, w))) for w in rows.workloads)] for v in ("default", *QUANTIZED)
            if any((v, w) in rows.index for w in rows.workloads)]
    return rows.sizes() + "\n\n" + markdown(["variant", *rows.workloads], body)


def ablation_table(records: list[dict]) -> str:
    from .report import markdown

    rows = Rows(records)
    measured = {name(r) for r in records if r["variant"]}

    def cell(v: str, w: str) -> str:
        r = rows.index.get((v, w))
        return _cell(r, fraction=False) + ("" if v == "default" else rows.gain(r))

    body = [[v, " ".join(VARIANTS[v]) or "configs/default.yaml", *(cell(v, w) for w in rows.workloads)]
            for v in VARIANTS if v in measured]
    return markdown(["variant", "config", *rows.workloads], body) + "\n\n" + GAIN_NOTE


def graphs_table(records: list[dict]) -> str:
    from .report import markdown

    rows, body = Rows(records), []
    for kernels, chain in GRAPH_TABLE:
        previous = None
        for step, variant in zip(GRAPH_STEPS, chain):
            r = rows.index.get((variant, GRAPH_WORKLOAD))
            if r is not None and r["value"] is not None:
                body.append([kernels, step, variant, _cell(r), _ratio(r, previous).strip()])
                previous = r
    return markdown(["kernels", "decode steps", "variant", "tok/s", "gain"], body) + \
        "\n\ngain: over the row above, blank across runs."


def peers_table(records: list[dict]) -> str:
    from .report import markdown

    rows = Rows(records)
    names = [*peers_mod.PEERS, *sorted({r["peer"] for r in records if r["peer"] and r["peer"] not in peers_mod.PEERS})]
    body = []
    for run in sorted({run_of(r) for r in records if r["peer"]}, key=str):
        mine = {(r["peer"], r["workload"]): r for r in records if r["peer"] and run_of(r) == run}
        body.append([f"default ({run[0]})", *(_cell(rows.defaults.get((run, w)), fraction=False)
                                              for w in rows.workloads)])
        body += [[p, *(_cell(mine.get((p, w)), fraction=False, note_chars=200) + rows.gain(mine.get((p, w)))
                       for w in rows.workloads)] for p in names if any(k[0] == p for k in mine)]
    if not body:
        return ""
    absent = [p for p in peers_mod.PEERS if not any(r["peer"] == p for r in records)]
    return (markdown(["peer", *rows.workloads], body) + "\n\n" + GAIN_NOTE
            + (f"\n\nNot measured (no record of this commit): {', '.join(absent)}." if absent else ""))


HEADLINE = ("default", "torch-matmul", "hf-sdpa", "hf-static-compile", "engine-compiled")
HEADLINE_WORKLOADS = ("prefill1024", "decode128_ctx1024")


def headline_table(records: list[dict]) -> str:
    """Our default beside cuBLAS linears and the BF16 peers at a 1,024-token prefill and the decode
    after it, each row's gain over the default of its own run."""
    from .report import markdown

    rows = Rows(records)
    body = [[n, *(_cell(rows.index.get((n, w))) + ("" if n == "default" else rows.gain(rows.index.get((n, w))))
                  for w in HEADLINE_WORKLOADS)]
            for n in HEADLINE if any((n, w) in rows.index for w in HEADLINE_WORKLOADS)]
    return markdown(["", *HEADLINE_WORKLOADS], body) + "\n\n" + GAIN_NOTE


def table(title: str, names: tuple[str, ...], render, workloads: tuple[str, ...] = ALL_NAMES,
          any_peer: bool = False):
    """A report table of the matrix records of one shape whose name is in ``names`` (``any_peer``:
    and every peer, e.g. llama.cpp's), complete when it has every row of ``names`` the parts measure."""
    from .report import Table

    def wanted(n: str, w: str, peer: bool = False) -> bool:
        return (n in names or any_peer and peer) and w in workloads

    def missing(records: list[dict], shape: str) -> list[str]:
        have = {(name(r), r["workload"]) for r in records}
        return [f"{n}/{w}" for n, w in sorted(expected(shape)) if wanted(n, w) and (n, w) not in have]

    return Table("matrix", f"{{group}}: {title}", render, group=lambda r: r["shape"],
                 select=lambda r: wanted(name(r), r["workload"], r["peer"] is not None), missing=missing)


def tables() -> list:
    return [table("headline (x: our default over the row)", HEADLINE, headline_table, HEADLINE_WORKLOADS),
            table("summary (decode: % of the roofline; prefill: TFLOP/s, % of the matmul peak)",
                  ("default", *QUANTIZED), summary_table),
            table("ablation (the gain of the feature switched off: default over the variant)", tuple(VARIANTS),
                  ablation_table),
            table(f"CUDA graphs ({GRAPH_WORKLOAD})", tuple(v for _, chain in GRAPH_TABLE for v in chain),
                  graphs_table, (GRAPH_WORKLOAD,)),
            table("peers (x: our default's speed over theirs)", ("default", *peers_mod.PEERS), peers_table,
                  any_peer=True)]
