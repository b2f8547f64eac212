"""The server's cost per request and per token: time to first token and decode tok/s through
``tileinfer serve`` (real uvicorn on localhost, streamed with server-sent events, read by httpx as a
client reads them) against the same engine called directly (``Engine.stream``: what
``tileinfer generate`` runs), in the same run, on the same prompts.

One engine is built; the app (``tileinfer.server.create_app``) is served by uvicorn in a thread on a
free localhost port. For each prompt and repeat, the direct call and the HTTP request alternate,
both plain greedy (``temperature=0``, no penalty, the model's EOS, ``--new-tokens`` at most) and
cold (each with a new ``cache_salt``: the prefix cache serves neither the other's prompt), after
one warm-up of each. Times are taken where a user sees them: from the call (the request sent) to
the first chunk that carries tokens (TTFT) and to the last; decode tok/s is the tokens after the
first over that span. The replies must be the same text on both paths (a mismatch makes the exit
status 1). The prompts are the ``def`` lines of the held-out files (tileinfer.models.prompts) and,
for a longer prefill, the heads of those files cut at ``--long-tokens`` tokens. Records (kind
``server``): the medians per prompt kind (short, long) and path (direct, server).

With ``--flood-mb MB``, instead: while one client sends MB-megabyte bodies, how long other clients wait and
what the server process's memory does (kind ``server_flood``: ``flood_main``).

examples:
  python -m bench server                                   # the shipped model on the CPU
  python -m bench server --flood-mb 40                     # other clients while one sends 40 MB bodies
  python -m bench server --device cuda --model /path/to/Qwen3-0.6B --new-tokens 256
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import statistics
import sys
import threading
import time

import torch

import tileinfer
from tileinfer.interfaces import SamplingParams
from tileinfer.models import prompts as prompts_mod

from . import records
from .timing import cold_salt

GREEDY = SamplingParams(temperature=0.0, repetition_penalty=1.0)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Served:
    """``create_app(engine)`` under uvicorn in a thread; ``url`` while inside ``with``."""

    def __init__(self, engine) -> None:
        import uvicorn

        from tileinfer.server import create_app

        self.port = free_port()
        self.server = uvicorn.Server(uvicorn.Config(create_app(engine, queue_size=1), host="127.0.0.1",
                                                    port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> str:
        self.thread.start()
        deadline = time.monotonic() + 60
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise SystemExit("the server did not start")
            time.sleep(0.01)
        return f"http://127.0.0.1:{self.port}"

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(30)


def timing(start: float, arrivals: list[tuple[float, int]]) -> dict:
    """TTFT and decode tok/s from (time, tokens) arrivals of one reply."""
    tokens = sum(n for _, n in arrivals)
    first, last = arrivals[0][0], arrivals[-1][0]
    return {"ttft_ms": (first - start) * 1e3, "tokens": tokens,
            "decode_tok_s": (tokens - 1) / (last - first) if tokens > 1 and last > first else None}


def direct(engine, prompt: str, new: int) -> tuple[dict, str]:
    start = time.perf_counter()
    arrivals, text = [], []
    params = dataclasses.replace(GREEDY, max_tokens=new, cache_salt=cold_salt())
    for chunk in engine.stream(prompt, params):
        if chunk.token_ids:
            arrivals.append((time.perf_counter(), len(chunk.token_ids)))
        text.append(chunk.text or "")
    return timing(start, arrivals), "".join(text)


def served(client, url: str, prompt: str, new: int) -> tuple[dict, str]:
    """A streamed /v1/completions request; tokens counted by the chunks' text and the usage."""
    body = {"prompt": prompt, "max_tokens": new, "temperature": 0, "repetition_penalty": 1.0, "stream": True,
            "stream_options": {"include_usage": True}, "cache_salt": cold_salt()}
    start = time.perf_counter()
    times, text, usage = [], [], None
    with client.stream("POST", f"{url}/v1/completions", json=body) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if event.get("usage") and not event["choices"]:
                usage = event["usage"]
            elif event["choices"] and event["choices"][0]["text"]:
                times.append(time.perf_counter())
                text.append(event["choices"][0]["text"])
    if (usage.get("prompt_tokens_details") or {}).get("cached_tokens"):
        raise RuntimeError("a cold request reused cached prompt tokens")
    tokens = usage["completion_tokens"]
    # each text chunk is one step's token(s); the held-back bytes of a character arrive with the next
    arrivals = [(t, 1) for t in times[:-1]] + [(times[-1], tokens - len(times) + 1)]
    return timing(start, arrivals), "".join(text)


def median(rows: list[dict], key: str) -> float | None:
    values = [r[key] for r in rows if r[key] is not None]
    return statistics.median(values) if values else None


def arguments(p) -> None:
    p.description, p.epilog = __doc__.split("\n\n")[0], __doc__.split("\n\n", 1)[1]
    p.add_argument("--model", help="checkpoint folder (default: the shipped models/target)")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--config", action="append", default=[], help="config file or shipped config name")
    p.add_argument("--override", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--prompts", type=int, default=8, help="short prompts (default 8)")
    p.add_argument("--long-tokens", type=int, default=512, help="tokens of the long prompts (0: none)")
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--flood-mb", type=float, default=0, metavar="MB", help="other clients while one sends MB MB bodies")
    p.add_argument("--flood-requests", type=int, default=8, metavar="N", help="with --flood-mb: requests per phase")
    records.arguments(p)


def main(args) -> int:
    import httpx

    if args.flood_mb:
        from .server_flood import flood_main

        return flood_main(args)

    keys = {"model": args.model} if args.model else {}
    engine = tileinfer.Engine.from_config(*args.config, overrides=args.override, device=args.device,
                                          progress=False, **keys)
    prompts = [("short", p) for p in prompts_mod.def_lines(args.prompts)]
    if args.long_tokens:
        for name in sorted({b[0] for b in prompts_mod.BENCHMARK}):
            ids = engine.tokenizer.encode((prompts_mod.HELDOUT_DIR / name).read_text())[:args.long_tokens]
            prompts.append(("long", engine.tokenizer.decode(ids)))
    rows, mismatches = [], []
    load_before = os.getloadavg()[0]
    with Served(engine) as url, httpx.Client(timeout=600) as client:
        direct(engine, prompts[0][1], 8)
        served(client, url, prompts[0][1], 8)
        for kind, prompt in prompts:
            for _ in range(args.repeats):
                d, d_text = direct(engine, prompt, args.new_tokens)
                s, s_text = served(client, url, prompt, args.new_tokens)
                if d_text != s_text:
                    mismatches.append(prompt[:60])
                rows.append({"kind": kind, "direct": d, "server": s})
    run = records.Run(args.device, commit=args.commit, path=args.records)
    setting = dict(model=engine.folder.name, threads=torch.get_num_threads() if args.device == "cpu" else None,
                   cpus=len(os.sched_getaffinity(0)), load_average=[load_before, os.getloadavg()[0]],
                   new_tokens=args.new_tokens, repeats=args.repeats, mismatches=len(mismatches))
    print(f"{'prompts':<8} {'path':<8} {'TTFT ms':>9} {'decode tok/s':>13}")
    for kind in dict.fromkeys(r["kind"] for r in rows):
        mine = [r for r in rows if r["kind"] == kind]
        for path in ("direct", "server"):
            figures = {key: median([r[path] for r in mine], key) for key in ("ttft_ms", "decode_tok_s")}
            run.add("server", **setting, prompts=kind, path=path, replies=len(mine), **figures)
            print(f"{kind:<8} {path:<8} {figures['ttft_ms']:>9.1f} {figures['decode_tok_s'] or float('nan'):>13.1f}")
    print(f"appended {len(run.records)} records to {run.path}")
    if mismatches:
        print(f"replies differ between the paths for: {mismatches}", file=sys.stderr)
        return 1
    return 0


def table(rows: list[dict]) -> str:
    from .report import markdown

    index = {(r["prompts"], r["path"]): r for r in rows}
    body = []
    for kind in dict.fromkeys(r["prompts"] for r in rows):
        d, s = index.get((kind, "direct")), index.get((kind, "server"))
        added = f"{s['ttft_ms'] - d['ttft_ms']:.1f}" if d and s else "-"
        per_token = (f"{1e3 / s['decode_tok_s'] - 1e3 / d['decode_tok_s']:.2f}"
                     if d and s and d["decode_tok_s"] and s["decode_tok_s"] else "-")
        for r in (d, s):
            if r:
                body.append([kind, r["path"], f"{r['ttft_ms']:.1f}", f"{r['decode_tok_s'] or float('nan'):.1f}",
                             added if r is s else "", per_token if r is s else ""])
    first = rows[0]
    return (f"Model {first['model']}, up to {first['new_tokens']} new tokens, medians of {first['repeats']} repeats "
            f"per prompt.\n\n" + markdown(["prompts", "path", "TTFT ms", "decode tok/s", "server adds to TTFT (ms)",
                                             "server adds per token (ms)"], body))


def tables() -> list:
    from .report import Table
    from .server_flood import FLOODS, flood_render

    return [Table("server", "the server against the engine called directly, {group}", table,
                  group=lambda r: r["model"]),
            Table("server_flood", "other clients while one sends a large body, {group}", flood_render,
                  group=lambda r: r["model"], missing=lambda rows, _: sorted(set(FLOODS) - {r["flood"] for r in rows}))]
