"""What an install weighs: a fresh venv with ``pip install .`` (no extras: generate, chat, quantize,
the Python API) against one made as ``make install`` makes it (the editable install with the test
stack, ``'.[test]'``), both with the versions constraints.txt pins, and ``tileinfer generate`` run
in the plain one.

Each venv is made in a new folder under ``--work`` with ``PYTHON -m venv`` and filled by the
Makefile's pip line (``pip install -q -c constraints.txt torch==2.13.0 ...``, run in this
checkout, with pip's configuration as it is on this machine: on a CPU machine the torch wheel pip
finds may be the CPU build). Its size is ``du -sb`` of the venv folder (the editable install's
source tree, this checkout, is not in it). In the plain venv, ``tileinfer generate`` runs the
shipped model (greedy, a few tokens) and the extras' packages must not import. Records (kind
``install``): per venv its pip arguments, bytes, seconds, package count and largest packages; the
plain one also its share of the make-install venv against the target (at most 60 %) and the
generate's exit status and text. The folders are removed afterwards unless ``--keep``.

examples:
  python -m bench install
  python -m bench install --python python3.12 --keep
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from . import records

ROOT = Path(__file__).resolve().parents[1]
PIP = ["install", "-q", "-c", "constraints.txt", "torch==2.13.0"]
VENVS = {"plain": [*PIP, "."], "make-install": [*PIP, "-e", ".[test]"]}
TARGET = 0.60  # the plain venv's largest share of the make-install venv (issue 30)
EXTRAS = ["fastapi", "uvicorn", "pydantic", "prometheus_client", "triton", "pytest", "transformers", "openai", "httpx"]
PROMPT = "def fibonacci(n):"


def size(folder: Path) -> int:
    """``du -sb folder``: the apparent size of its files, in bytes."""
    return int(subprocess.run(["du", "-sb", str(folder)], capture_output=True, text=True, check=True).stdout.split()[0])


def largest(venv: Path, n: int = 6) -> list[list]:
    """The ``n`` largest entries of the venv's site-packages: [name, bytes], largest first."""
    site = next(venv.glob("lib/python*/site-packages"))
    sizes = [[p.name, size(p)] for p in site.iterdir() if not p.name.endswith((".dist-info", ".pth"))]
    return sorted(sizes, key=lambda s: -s[1])[:n]


def build(python: str, venv: Path, pip_args: list[str]) -> dict:
    """A fresh venv at ``venv`` filled by ``pip pip_args``: its size, time and packages."""
    start = time.perf_counter()
    subprocess.run([python, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(venv / "bin" / "pip"), *pip_args], cwd=ROOT, check=True)
    seconds = time.perf_counter() - start
    listed = json.loads(subprocess.run([str(venv / "bin" / "pip"), "list", "--format", "json"], capture_output=True,
                                       text=True, check=True).stdout)
    torch_version = next((p["version"] for p in listed if p["name"] == "torch"), None)
    return {"pip": " ".join(pip_args), "bytes": size(venv), "seconds": seconds, "packages": len(listed),
            "torch": torch_version, "largest": largest(venv)}


def generate(venv: Path, new_tokens: int) -> dict:
    """``tileinfer generate`` of the shipped model in ``venv`` (outside this checkout, so that the
    installed package runs) and which extras' packages import there."""
    done = subprocess.run([str(venv / "bin" / "tileinfer"), "generate", "--prompt", PROMPT, "--max-new-tokens",
                           str(new_tokens), "--temperature", "0"], capture_output=True, text=True, cwd=venv,
                          timeout=600)
    probe = "import importlib.util as u; print(','.join(m for m in %r if u.find_spec(m)))" % (EXTRAS,)
    present = subprocess.run([str(venv / "bin" / "python"), "-c", probe], capture_output=True, text=True,
                             cwd=venv).stdout.strip()
    return {"generate_exit": done.returncode, "generate_text": done.stdout[:200],
            "generate_error": done.stderr.strip().splitlines()[-1:] if done.returncode else [],
            "extras_present": [m for m in present.split(",") if m]}


def arguments(p) -> None:
    p.description, p.epilog = __doc__.split("\n\n")[0], __doc__.split("\n\n", 1)[1]
    p.add_argument("--python", default="python3", help="the interpreter that makes the venvs (default python3)")
    p.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()), help="where the venvs are made")
    p.add_argument("--new-tokens", type=int, default=16, help="tokens the plain venv's generate writes")
    p.add_argument("--keep", action="store_true", help="keep the venvs")
    records.arguments(p)


def main(args) -> int:
    work = Path(tempfile.mkdtemp(prefix="tileinfer-install-", dir=args.work))
    try:
        built = {name: build(args.python, work / name, pip_args) for name, pip_args in VENVS.items()}
        ran = generate(work / "plain", args.new_tokens)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    python = subprocess.run([args.python, "-c", "import sys; print(sys.version.split()[0])"], capture_output=True,
                            text=True).stdout.strip()
    run = records.Run("cpu", commit=args.commit, path=args.records)
    share = built["plain"]["bytes"] / built["make-install"]["bytes"]
    for name, figures in built.items():
        extra = dict(share=share, target=TARGET, **ran) if name == "plain" else {}
        run.add("install", venv=name, python=python, **figures, **extra)
        print(f"{name:<13} {figures['bytes'] / 1e6:>9.1f} MB  {figures['packages']:>3} packages  "
              f"{figures['seconds']:>6.1f} s  pip {figures['pip']}")
    print(f"plain / make-install: {share:.1%} (target at most {TARGET:.0%}); generate exit {ran['generate_exit']}, "
          f"extras importable: {ran['extras_present'] or 'none'}")
    print(f"appended {len(run.records)} records to {run.path}")
    return 0 if ran["generate_exit"] == 0 and share <= TARGET and not ran["extras_present"] else 1


def table(rows: list[dict]) -> str:
    from .report import markdown

    body = []
    for r in rows:
        top = ", ".join(f"{name} {n / 1e6:.0f}" for name, n in r["largest"][:4])
        plain = r["venv"] == "plain"
        body.append([r["venv"], f"`pip {r['pip']}`", f"{r['bytes'] / 1e6:,.0f}", str(r["packages"]), top,
                     f"{r['share']:.1%} (target <= {r['target']:.0%})" if plain else "100 %",
                     (f"exit {r['generate_exit']}" + (f": {r['generate_error'][0]}" if r["generate_error"] else ""))
                     if plain else ""])
    first = rows[0]
    return (f"Python {first['python']}, torch {first['torch']}; size: `du -sb` of the venv. `tileinfer generate`: "
            f"the shipped model in the plain venv.\n\n"
            + markdown(["venv", "pip", "MB", "packages", "largest (MB)", "share of make install",
                        "`tileinfer generate`"], body))


def tables() -> list:
    from .report import Table

    return [Table("install", "the install's size: pip install . against make install", table,
                  missing=lambda rows, group: [v for v in VENVS if v not in {r["venv"] for r in rows}])]
