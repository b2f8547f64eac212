"""The server's cost per request and per token: time to first token and decode tok/s through
``tileinfer serve`` (real uvicorn on localhost, streamed with server-sent events, read by httpx as a
client reads them) against the same engine called directly (``Engine.stream``: what
``tileinfer generate`` runs), in the same run, on the same prompts.

One engine is built; the app (``tileinfer.server.create_app``) is served by uvicorn in a thread on a
free localhost port. For each prompt and repeat, the direct call and the HTTP request alternate,
both plain greedy (``temperature=0``, no penalty, the model's EOS, ``--new-tokens`` at most), after
one warm-up of each. Times are taken where a user sees them: from the call (the request sent) to
the first chunk that carries tokens (TTFT) and to the last; decode tok/s is the tokens after the
first over that span. The replies must be the same text on both paths (a mismatch is recorded and
the exit status is 1). The prompts are the ``def`` lines of the held-out files (bench/prompts.py)
and, for a longer prefill, the heads of those files cut at ``--long-tokens`` tokens.

Writes bench/results/<device>/server.json (``cpu``, or the GPU's name) and prints a table.

examples:
  python bench/server.py                                   # the shipped model on the CPU
  python bench/server.py --device cuda --model /path/to/Qwen3-0.6B --new-tokens 256
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import socket
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import httpx  # noqa: E402
import torch  # noqa: E402
import uvicorn  # noqa: E402

from tileinfer.models import prompts as prompts_mod  # noqa: E402
from generation_defaults import heldout_prompts  # noqa: E402
from records import git_commit  # noqa: E402
import tileinfer  # noqa: E402
from tileinfer.interfaces import SamplingParams  # noqa: E402
from tileinfer.server import create_app  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
GREEDY = SamplingParams(temperature=0.0, repetition_penalty=1.0)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Served:
    """``create_app(engine)`` under uvicorn in a thread; ``url`` while inside ``with``."""

    def __init__(self, engine) -> None:
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
    for chunk in engine.stream(prompt, max_new_tokens=new, sampling=GREEDY):
        if chunk.token_ids:
            arrivals.append((time.perf_counter(), len(chunk.token_ids)))
        text.append(chunk.text or "")
    return timing(start, arrivals), "".join(text)


def served(client: httpx.Client, url: str, prompt: str, new: int) -> tuple[dict, str]:
    """A streamed /v1/completions request; tokens counted by the chunks' text and the usage."""
    body = {"prompt": prompt, "max_tokens": new, "temperature": 0, "repetition_penalty": 1.0, "stream": True,
            "stream_options": {"include_usage": True}}
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
    tokens = usage["completion_tokens"]
    # each text chunk is one step's token(s); the held-back bytes of a character arrive with the next
    arrivals = [(t, 1) for t in times[:-1]] + [(times[-1], tokens - len(times) + 1)]
    return timing(start, arrivals), "".join(text)


def median(rows: list[dict], key: str) -> float | None:
    values = [r[key] for r in rows if r[key] is not None]
    return statistics.median(values) if values else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="checkpoint folder (default: the shipped models/target)")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--config", action="append", default=[], help="config file or shipped config name")
    parser.add_argument("--override", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--prompts", type=int, default=8, help="short prompts (default 8)")
    parser.add_argument("--long-tokens", type=int, default=512, help="tokens of the long prompts (0: none)")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    keys = {"model": args.model} if args.model else {}
    engine = tileinfer.Engine.from_config(*args.config, overrides=args.override, device=args.device,
                                          progress=False, **keys)
    prompts = [("short", p) for p in heldout_prompts(args.prompts)]
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
                rows.append({"kind": kind, "prompt": prompt[:60], "direct": d, "server": s})
    summary = {}
    for kind in dict.fromkeys(r["kind"] for r in rows):
        mine = [r for r in rows if r["kind"] == kind]
        out = {path: {"ttft_ms": median([r[path] for r in mine], "ttft_ms"),
                      "decode_tok_s": median([r[path] for r in mine], "decode_tok_s")} for path in ("direct", "server")}
        d, s = out["direct"], out["server"]
        out["ttft_added_ms"] = s["ttft_ms"] - d["ttft_ms"]
        out["per_token_added_ms"] = (1e3 / s["decode_tok_s"] - 1e3 / d["decode_tok_s"]
                                     if s["decode_tok_s"] and d["decode_tok_s"] else None)
        summary[kind] = out
    device = "cpu" if args.device == "cpu" else torch.cuda.get_device_name().replace(" ", "-")
    record = {"script": "bench/server.py", "command": " ".join(["python", "bench/server.py", *(argv or sys.argv[1:])]),
              "model": str(engine.folder.relative_to(ROOT) if engine.folder.is_relative_to(ROOT) else engine.folder),
              "device": device, "threads": torch.get_num_threads() if args.device == "cpu" else None,
              "cpus": len(os.sched_getaffinity(0)), "load_average_1min": [load_before, os.getloadavg()[0]],
              "new_tokens": args.new_tokens, "repeats": args.repeats, "summary": summary, "mismatches": mismatches,
              "rows": rows, "torch": torch.__version__, "machine": platform.machine(), "commit": git_commit(),
              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    out = args.out or ROOT / "bench" / "results" / device / "server.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"{'prompts':<8} {'path':<8} {'TTFT ms':>9} {'decode tok/s':>13}")
    for kind, out_kind in summary.items():
        for path in ("direct", "server"):
            v = out_kind[path]
            print(f"{kind:<8} {path:<8} {v['ttft_ms']:>9.1f} {v['decode_tok_s'] or float('nan'):>13.1f}")
        print(f"{kind:<8} server adds {out_kind['ttft_added_ms']:.1f} ms to the first token, "
              f"{out_kind['per_token_added_ms'] or float('nan'):.2f} ms per token")
    if mismatches:
        print(f"replies differ between the paths for: {mismatches}", file=sys.stderr)
        return 1
    print(f"-> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
