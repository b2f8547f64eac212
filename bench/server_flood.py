"""``python -m bench server --flood-mb MB``: while one client sends MB-megabyte bodies to
``tileinfer serve`` in its own process (declared by Content-Length, or chunked), how long other
clients' health checks and greedy completions take and what the server's memory and CPU do
(records of kind ``server_flood``; bench/server.py's module doc)."""

from __future__ import annotations

import os
import select
import socket
import statistics
import subprocess
import sys
import threading
import time

from tileinfer.models import prompts as prompts_mod

from . import records
from .server import free_port

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

