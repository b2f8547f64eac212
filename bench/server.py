"""The server's cost per request and per token: time to first token and decode tok/s through
``tileinfer serve`` (real uvicorn on localhost, streamed with server-sent events, read by httpx as a
client reads them) against the same engine called directly (``Engine.stream``: what
``tileinfer generate`` runs), in the same run, on the same prompts.

One engine is built; the app (``tileinfer.server.create_app``) is served by uvicorn in a thread on a
free localhost port. For each prompt and repeat, the direct call and the HTTP request alternate,
both plain greedy (``temperature=0``, no penalty, the model's EOS, ``--new-tokens`` at most), after
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

import json
import os
import select
import socket
import statistics
import subprocess
import sys
import threading
import time

import torch

import tileinfer
from tileinfer.interfaces import SamplingParams
from tileinfer.models import prompts as prompts_mod

from . import records

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
    for chunk in engine.stream(prompt, max_new_tokens=new, sampling=GREEDY):
        if chunk.token_ids:
            arrivals.append((time.perf_counter(), len(chunk.token_ids)))
        text.append(chunk.text or "")
    return timing(start, arrivals), "".join(text)


def served(client, url: str, prompt: str, new: int) -> tuple[dict, str]:
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

    return [Table("server", "the server against the engine called directly, {group}", table,
                  group=lambda r: r["model"]),
            Table("server_flood", "other clients while one sends a large body, {group}", flood_render,
                  group=lambda r: r["model"], missing=lambda rows, _: sorted(set(FLOODS) - {r["flood"] for r in rows}))]


# --flood-mb: other clients while one client sends a large body, against `tileinfer serve` in its own process.
FLOODS = ("none", "content-length", "chunked")  # no flood; the body's size declared; sent chunked without it
FLOOD_TARGET_MS, MEMORY_TARGET_MB = 1000.0, 400.0  # issue 30: within 1 s of normal latency, 400 MB of memory
SETTLE_S = 1.0  # the wait before a phase's first RSS and before its last


def rss_mb(pid: int) -> float:
    """The resident memory of process ``pid`` (VmRSS of /proc/PID/status), in MB (10^6 bytes)."""
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) * 1024 / 1e6


def cpu_s(pid: int) -> float:
    """The CPU time process ``pid`` has used, user and system (/proc/PID/stat), in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        return sum(map(int, f.read().rsplit(")", 1)[1].split()[11:13])) / os.sysconf("SC_CLK_TCK")


def flood_once(port: int, total: int, chunked: bool) -> tuple[str, int]:
    """One POST /v1/completions of a ``total``-byte JSON body on a raw socket, sent as fast as the
    server reads it until all of it is sent or the server answers or closes: (its status, or
    ``reset``/``closed`` when no answer came, and the bytes sent)."""
    framing = "Transfer-Encoding: chunked" if chunked else f"Content-Length: {total}"
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
            f"{framing}\r\n\r\n").encode()
    block, sent = b'{"prompt": "' + b"a" * ((1 << 20) - 12), 0
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
        try:
            sock.sendall(head)
            while sent < total and not select.select([sock], [], [], 0)[0]:  # readable: an answer, or closed
                piece = block[:total - sent]
                sock.sendall(b"%x\r\n%b\r\n" % (len(piece), piece) if chunked else piece)
                sent += len(piece)
            if chunked and sent >= total:
                sock.sendall(b"0\r\n\r\n")
        except OSError:  # the server closed while the body was sent: its answer may still be there to read
            pass
        try:
            answer = sock.recv(64)
        except OSError:
            return "reset", sent
    return (answer.split(b" ")[1].decode() if answer.startswith(b"HTTP/") else "closed"), sent


class Flooder(threading.Thread):
    """Sends ``mb``-megabyte bodies back to back (each on a new connection) until ``stopping`` is
    set; at least one. ``sends``: (status, bytes sent) of each."""

    def __init__(self, port: int, mb: float, chunked: bool) -> None:
        super().__init__(daemon=True)
        self.port, self.total, self.chunked = port, int(mb * 1e6), chunked
        self.sends, self.stopping = [], threading.Event()

    def run(self) -> None:
        while not self.sends or not self.stopping.is_set():
            self.sends.append(flood_once(self.port, self.total, self.chunked))


class Sampler(threading.Thread):
    """The largest RSS of process ``pid`` (``peak``), sampled every 5 ms until ``stopping`` is set."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid, self.peak, self.stopping = pid, rss_mb(pid), threading.Event()

    def run(self) -> None:
        while not self.stopping.wait(0.005):
            self.peak = max(self.peak, rss_mb(self.pid))


def start_server(args, port: int):
    """``tileinfer serve`` (the command line's main, in a new interpreter) on ``port``, once /health answers."""
    import httpx

    command = [sys.executable, "-c", "import sys; from tileinfer.cli import main; sys.exit(main())", "serve",
               "--port", str(port), "-q", *(["--model", args.model] if args.model else []),
               *(a for c in args.config for a in ("--config", c)), f"device={args.device}", *args.override]
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200:
                return proc
        except httpx.TransportError:
            time.sleep(0.1)
    proc.kill()
    raise SystemExit(f"the server did not start (exit status {proc.poll()})")


def flood_phase(url: str, pid: int, flood: str, args, prompts: list[str]) -> dict:
    """While ``flood`` runs (``none``: nothing else), the other clients' latencies (a GET /health, then a
    greedy completion, per request), the server's RSS and CPU time and this process's (the clients')."""
    import httpx

    time.sleep(SETTLE_S)
    before, sampler, cpu, own, start = rss_mb(pid), Sampler(pid), cpu_s(pid), time.process_time(), time.perf_counter()
    flooder = None if flood == "none" else Flooder(int(url.rsplit(":", 1)[1]), args.flood_mb, flood == "chunked")
    sampler.start()
    health, latency, failures = [], [], 0
    with httpx.Client(timeout=600) as client:
        if flooder:
            flooder.start()
            time.sleep(0.2)  # the first body is on its way
        for i in range(args.flood_requests):
            sent = time.perf_counter()
            failures += client.get(f"{url}/health").status_code != 200
            health.append((time.perf_counter() - sent) * 1e3)
            body = {"prompt": prompts[i % len(prompts)], "max_tokens": args.new_tokens, "temperature": 0}
            sent = time.perf_counter()
            failures += client.post(f"{url}/v1/completions", json=body).status_code != 200
            latency.append((time.perf_counter() - sent) * 1e3)
    if flooder:
        flooder.stopping.set()
        flooder.join(120)
    sampler.stopping.set()
    seconds, cpu, own = time.perf_counter() - start, cpu_s(pid) - cpu, time.process_time() - own
    time.sleep(SETTLE_S)
    sends = [x for x, _ in flooder.sends] if flooder else []
    return {"flood": flood, "health_ms": statistics.median(health), "latency_ms": statistics.median(latency),
            "latency_max_ms": max(latency), "latencies_ms": latency, "failures": failures, "sends": len(sends),
            "statuses": {s: sends.count(s) for s in sorted(set(sends))}, "rss_before_mb": before,
            "mb_sent": sum(n for _, n in flooder.sends) / 1e6 if flooder else 0.0, "rss_peak_mb": sampler.peak,
            "rss_after_mb": rss_mb(pid), "seconds": seconds, "server_cpu_s": cpu, "client_cpu_s": own}


def flood_main(args) -> int:
    """--flood-mb: ``flood_run`` against ``tileinfer serve`` in its own process."""
    port = free_port()
    proc = start_server(args, port)
    try:
        return flood_run(f"http://127.0.0.1:{port}", proc.pid, args)
    finally:
        proc.terminate()
        proc.wait(60)


def flood_run(url: str, pid: int, args) -> int:
    """FLOODS in turn against the server at ``url`` (process ``pid``), after a warm-up: a record each; 1: a miss."""
    import httpx

    prompts, load_before = prompts_mod.def_lines(max(args.prompts, 1)), os.getloadavg()[0]
    with httpx.Client(timeout=600) as client:
        model = client.get(f"{url}/v1/models").json()["data"][0]["id"]
        client.post(f"{url}/v1/completions", json={"prompt": prompts[0], "max_tokens": args.new_tokens})
    phases = [flood_phase(url, pid, flood, args, prompts) for flood in FLOODS]
    run = records.Run(args.device, commit=args.commit, path=args.records)
    setting = dict(model=model, flood_mb=args.flood_mb, requests=args.flood_requests, new_tokens=args.new_tokens,
                   cpus=len(os.sched_getaffinity(0)), load_average=[load_before, os.getloadavg()[0]])
    normal, met = phases[0]["latency_ms"], True
    for phase in phases:
        added = phase["latency_ms"] - normal if phase["flood"] != "none" else None
        grown = phase["rss_after_mb"] - phase["rss_before_mb"]
        ok = not phase["failures"] and (added is None or added <= FLOOD_TARGET_MS) and grown <= MEMORY_TARGET_MB
        met &= ok
        run.add("server_flood", **setting, **phase, added_ms=added, rss_grown_mb=grown, met=ok)
        print(f"{phase['flood']:<15} completion {phase['latency_ms']:.1f} ms, /health {phase['health_ms']:.1f} ms, "
              f"answers {phase['statuses']}, RSS MB {phase['rss_before_mb']:.0f}/{phase['rss_peak_mb']:.0f}/"
              f"{phase['rss_after_mb']:.0f}, failures {phase['failures']}")
    print(f"appended {len(run.records)} records to {run.path}")
    return 0 if met else 1


def flood_render(rows: list[dict]) -> str:
    from .report import markdown

    body = []
    for r in sorted(rows, key=lambda r: FLOODS.index(r["flood"])):
        statuses = ", ".join(f"{n} x {s}" for s, n in r["statuses"].items())
        added = "" if r["added_ms"] is None else f"{r['added_ms']:+.1f}"
        body.append([r["flood"], f"{r['sends']} ({statuses})" if r["sends"] else "-",
                     f"{r['mb_sent']:.0f}" if r["sends"] else "-", f"{r['health_ms']:.1f}",
                     f"{r['latency_ms']:.1f} ({r['latency_max_ms']:.1f})", added,
                     f"{r['rss_before_mb']:.0f} / {r['rss_peak_mb']:.0f} / {r['rss_after_mb']:.0f}",
                     f"{r['rss_grown_mb']:+.0f}", f"{r['server_cpu_s'] / r['seconds']:.0%} / "
                     f"{r['client_cpu_s'] / r['seconds']:.0%}", f"{r['failures']}", "yes" if r["met"] else "**no**"])
    first = rows[0]
    return (f"One client sends {first['flood_mb']:g} MB bodies back to back (new connections) while another makes "
            f"{first['requests']} requests, each a GET /health then a greedy completion of up to {first['new_tokens']} "
            f"tokens, to `tileinfer serve` in its own process. RSS and CPU from /proc (CPU: the server's and the "
            f"clients' process's, CPU-seconds per second). Target: completions within {FLOOD_TARGET_MS:g} ms of their "
            f"latency without a flood, RSS back within {MEMORY_TARGET_MB:g} MB, no failure. {first['cpus']} CPUs, "
            f"1-minute load {first['load_average'][0]:.1f} before, {first['load_average'][1]:.1f} after.\n\n"
            + markdown(["flood", "bodies sent (answers)", "MB sent", "/health ms", "completion ms (max)",
                        "added ms", "RSS MB before / peak / after", "RSS grown MB", "CPU server / clients", "failed",
                        "target met"], body))

