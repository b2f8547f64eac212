"""Make the shipped models in one command: corpus -> tokenizer -> token streams -> train the target
-> train the draft -> evaluate -> pack, within a deadline.

    python3 -m tileinfer.models.make_all --out "$OUT"      # on the GPU machine (4.5 + 1.5 min, at most 9 min)
    python -m tileinfer.models.make_all --out build/models --quick   # a CPU smoke run of every stage (~1 min)

Everything heavy goes to ``--work`` (default build/models-work); ``--out`` receives at most 8
files of at most 15 MiB, in one folder (what the device tool brings back):

    target.tar.00, target.tar.01   target/ (the Hugging Face folder) + results/ (eval, history, loss plot,
                                   corpus stats, the held-out file names)
    draft.tar.00                   draft/ + results/
    summary.json                   every stage's figures and timings, the evaluation, the samples
    loss_target.png, loss_draft.png
    make_all.log                   the whole output

Unpack in the repository with ``for m in target draft; do cat OUT/$m.tar.* | tar -x -C models; done``
and ``cp OUT/summary.json models/results/``. Each model is packed as soon as it is trained, and
summary.json is rewritten after each stage, so a run cut short still brings back what it made.

The deadline (``--deadline-min``, default 9 min from the start) bounds the whole run: the target's
budget shrinks if the preparation took longer than planned, and the draft gets what is left.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
PART_BYTES = 15 * 1024 * 1024  # < 16 MiB, the largest file the device tool brings back
WEIGHT_LIMIT = 32_000_000  # target + draft safetensors, bytes


class Run:
    def __init__(self, args) -> None:
        self.args = args
        self.start = time.time()
        self.out: Path = args.out
        self.work: Path = args.work
        self.out.mkdir(parents=True, exist_ok=True)
        self.work.mkdir(parents=True, exist_ok=True)
        self.log = (self.out / "make_all.log").open("a", encoding="utf-8")
        self.summary: dict = {"started": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "host": platform.node(),
                              "python": sys.version.split()[0], "args": {k: str(v) for k, v in vars(args).items()},
                              "stages": {}}
        try:
            import torch
            import transformers

            self.summary.update(torch=torch.__version__, transformers=transformers.__version__,
                                gpu=torch.cuda.get_device_name() if torch.cuda.is_available() else None)
        except Exception as exc:  # noqa: BLE001 - informational only
            self.summary["versions_error"] = str(exc)

    def say(self, text: str) -> None:
        line = f"[make_all {self.elapsed() / 60:5.2f} min] {text}"
        print(line, flush=True)
        self.log.write(line + "\n")
        self.log.flush()

    def elapsed(self) -> float:
        return time.time() - self.start

    def left_min(self) -> float:
        return self.args.deadline_min - self.elapsed() / 60

    def save_summary(self) -> None:
        self.summary["elapsed_min"] = round(self.elapsed() / 60, 2)
        (self.out / "summary.json").write_text(json.dumps(self.summary, indent=2, ensure_ascii=False) + "\n")

    def stage(self, name: str, argv: list[str]) -> bool:
        """Run a module of tileinfer.models (``argv``: ``-m NAME ARGS...``) as a subprocess, its output to
        the console and the log."""
        self.say(f"{name}: {' '.join(argv)}")
        t0 = time.time()
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        proc = subprocess.Popen([sys.executable, *argv], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                env=env, cwd=HERE.parent)
        for line in proc.stdout:
            sys.stdout.write(line)
            sys.stdout.flush()
            self.log.write(line)
        proc.wait()
        self.log.flush()
        ok = proc.returncode == 0
        self.summary["stages"][name] = {"ok": ok, "seconds": round(time.time() - t0, 1), "returncode": proc.returncode}
        self.say(f"{name}: {'done' if ok else f'FAILED (exit {proc.returncode})'} in {time.time() - t0:.0f} s")
        self.save_summary()
        return ok


def pack(name: str, members: dict[str, Path], out: Path) -> list[str]:
    """A deterministic tar of ``members`` (archive name -> file), split into parts < 16 MiB."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        dirs = sorted({str(Path(a).parent) for a in members} - {"."})
        for d in dirs:
            info = tarfile.TarInfo(d)
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, 0
            tar.addfile(info)
        for arcname in sorted(members):
            data = members[arcname].read_bytes()
            info = tarfile.TarInfo(arcname)
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            tar.addfile(info, io.BytesIO(data))
    blob = buffer.getvalue()
    for old in out.glob(f"{name}.tar.*"):
        old.unlink()
    parts = []
    for i in range(0, len(blob), PART_BYTES):
        part = out / f"{name}.tar.{i // PART_BYTES:02d}"
        part.write_bytes(blob[i:i + PART_BYTES])
        parts.append(part.name)
    return parts


def model_members(name: str, run_dir: Path, extra: dict[str, Path]) -> dict[str, Path]:
    members = {f"{name}/{p.name}": p for p in sorted((run_dir / "model").iterdir()) if p.is_file()}
    for src, dst in (("eval.json", f"results/{name}_eval.json"), ("history.json", f"results/{name}_history.json"),
                     ("loss.png", f"results/loss_{name}.png")):
        if (run_dir / src).is_file():
            members[dst] = run_dir / src
    members.update(extra)
    return members


def weight_bytes(run_dir: Path) -> int:
    return sum(p.stat().st_size for p in (run_dir / "model").glob("*.safetensors"))


def train_and_pack(run: Run, size: str, minutes: float, common: list[str], extra: dict[str, Path]) -> bool:
    run_dir = run.work / size
    argv = ["-m", "tileinfer.models.train", "--size", size, *common, "--out", str(run_dir),
            "--minutes", f"{minutes:.2f}"]
    if run.args.resume:
        argv.append("--resume")
    if run.args.compile:
        argv.append("--compile")
    if run.args.quick:
        argv += ["--seq-len", "256", "--batch", "8", "--threads", "1", "--eval-sequences", "16", "--reserve-s", "5"]
    ok = run.stage(f"train_{size}", argv)
    if ok:
        run.summary[size] = json.loads((run_dir / "eval.json").read_text())
        run.summary[size]["weight_bytes"] = weight_bytes(run_dir)
        parts = pack(size, model_members(size, run_dir, extra), run.out)
        if (run_dir / "loss.png").is_file():
            shutil.copy2(run_dir / "loss.png", run.out / f"loss_{size}.png")
        run.summary[size]["packed"] = parts
        run.say(f"packed {size}: {', '.join(parts)}")
        run.save_summary()
    return ok


def train_dflash(run: Run, minutes: float, data: Path) -> bool:
    """The optional DFlash stage: a drafter of the target just trained, packed as dflash.tar.00."""
    if minutes < 0.5:
        run.say(f"dflash skipped: {minutes:.2f} min left for it")
        return False
    run_dir = run.work / "dflash"
    argv = ["-m", "tileinfer.models.train_dflash", "--target", str(run.work / "target" / "model"), "--data", str(data),
            "--out", str(run_dir), "--minutes", f"{minutes:.2f}"]
    if run.args.quick:
        argv += ["--seq-len", "128", "--batch", "4", "--anchors", "4", "--threads", "1", "--reserve-s", "5"]
    ok = run.stage("train_dflash", argv)
    if ok:
        run.summary["dflash"] = json.loads((run_dir / "dflash_eval.json").read_text())
        members = {f"dflash/{p.name}": p for p in sorted((run_dir / "dflash").iterdir())}
        members.update({"results/dflash_eval.json": run_dir / "dflash_eval.json",
                        "results/dflash_history.json": run_dir / "dflash_history.json"})
        run.summary["dflash"]["packed"] = pack("dflash", members, run.out)
        run.save_summary()
    return ok


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or "build/models"),
                        help="folder for the packed results (default: $OUT, else build/models)")
    parser.add_argument("--work", type=Path, default=HERE.parent / "build" / "models-work",
                        help="corpus, tokenizer, streams, checkpoints (build/ is git-ignored, and kept between calls "
                        "on a warm device machine: --resume reuses it)")
    parser.add_argument("--deadline-min", type=float, default=9.0, help="the whole run ends within this many minutes")
    parser.add_argument("--target-min", type=float, default=4.5)
    parser.add_argument("--draft-min", type=float, default=1.5)
    parser.add_argument("--dflash-min", type=float, default=0.0, help="also train the DFlash drafter "
                        "(models/train_dflash.py) for this many minutes after the draft; 0: skip (it runs alone too)")
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--tokenizer-sample-mb", type=float, default=48)
    parser.add_argument("--max-train-mb", type=float, default=320)
    parser.add_argument("--resume", action="store_true", help="reuse the corpus, tokenizer and streams in --work, "
                        "and resume training from their checkpoints")
    parser.add_argument("--compile", action="store_true", help="torch.compile the models (untested on the H200)")
    parser.add_argument("--quick", action="store_true", help="CPU smoke run: 300 files, vocab 1,024, short runs")
    args = parser.parse_args(argv)
    args.out, args.work = args.out.resolve(), args.work.resolve()  # the stages run from the repository root
    if args.quick:
        args.vocab, args.tokenizer_sample_mb, args.max_train_mb = 1024, 4, 8
        args.target_min, args.draft_min, args.deadline_min = min(args.target_min, 0.4), min(args.draft_min, 0.3), 3.0

    run = Run(args)
    run.say(f"out {args.out}, work {args.work}, deadline {args.deadline_min} min; {run.summary.get('gpu') or 'no GPU'}")
    corpus, tok, data = args.work / "corpus", args.work / "tokenizer", args.work / "data"
    reuse = args.resume and (data / "meta.json").is_file()
    if not reuse:
        corpus_argv = ["-m", "tileinfer.models.corpus", str(corpus)] + (["--max-files", "300"] if args.quick else [])
        if not (run.stage("corpus", corpus_argv)
                and run.stage("tokenizer", ["-m", "tileinfer.models.tokenizer", str(corpus), str(tok),
                                            "--vocab", str(args.vocab), "--sample-mb", str(args.tokenizer_sample_mb)])
                and run.stage("data", ["-m", "tileinfer.models.data", str(corpus), str(tok), str(data),
                                       "--max-train-mb", str(args.max_train_mb)])):
            run.say("preparation failed; see the log")
            return run.summary
    run.summary["corpus"] = json.loads((corpus / "stats.json").read_text())
    run.summary["data"] = json.loads((data / "meta.json").read_text())
    heldout_names = args.work / "heldout_files.txt"
    heldout_names.write_text("".join(json.loads(line)["name"] + "\n" for line in (corpus / "heldout.jsonl").open()))
    extra = {"results/corpus_stats.json": corpus / "stats.json", "results/data_meta.json": data / "meta.json",
             "results/heldout_files.txt": heldout_names}
    common = ["--data", str(data), "--tokenizer", str(tok)]

    overhead = 0.35 if not args.quick else 0.25  # per training run: start-up, final evaluation, saving (min)
    tail = 0.5  # evaluation and packing at the end (min)
    target_min = min(args.target_min, run.left_min() - args.draft_min - 2 * overhead - tail)
    shortest = 0.1 if args.quick else 0.5  # a budget below this is not worth a run (min)
    target_ok = target_min >= shortest and train_and_pack(run, "target", target_min, common, extra)
    if not target_ok and target_min < shortest:
        run.say(f"target skipped: {target_min:.2f} min left for it")
    draft_min = min(args.draft_min, run.left_min() - overhead - tail)
    draft_ok = draft_min >= shortest / 2 and train_and_pack(run, "draft", draft_min, common, {})
    if not draft_ok and draft_min < shortest / 2:
        run.say(f"draft skipped: {draft_min:.2f} min left for it")
    if target_ok and args.dflash_min > 0:
        train_dflash(run, min(args.dflash_min, run.left_min() - tail), data)
    if target_ok:
        evaluate_argv = ["-m", "tileinfer.models.evaluate", "--target", str(args.work / "target" / "model"),
                         "--out", str(args.work / "evaluate.json")]
        if draft_ok:
            evaluate_argv += ["--draft", str(args.work / "draft" / "model")]
        if args.quick:
            evaluate_argv += ["--max-tokens", "200", "--new-tokens", "16"]
        if run.left_min() > 0.3 and run.stage("evaluate", evaluate_argv):
            run.summary["evaluate"] = json.loads((args.work / "evaluate.json").read_text())
    if target_ok and draft_ok:
        total = run.summary["target"]["weight_bytes"] + run.summary["draft"]["weight_bytes"]
        run.summary["weight_bytes_total"] = total
        run.summary["weight_limit_ok"] = total <= WEIGHT_LIMIT
        run.say(f"weights: {total / 1e6:.1f} MB together (limit {WEIGHT_LIMIT / 1e6:.0f} MB)")
    run.save_summary()
    files = sorted(p.name for p in args.out.iterdir())
    run.say(f"finished in {run.elapsed() / 60:.2f} min; {args.out}: {', '.join(files)}")
    if len(files) > 8:
        run.say(f"WARNING: {len(files)} files in {args.out}; the device tool brings back 8")
    return run.summary


if __name__ == "__main__":
    main()
