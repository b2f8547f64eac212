"""bench.shapes.written_once: the random checkpoints that pytest-xdist's workers and the benchmarks
share are written by one process, and no process sees a half-written folder."""

from __future__ import annotations

import multiprocessing
import time
from pathlib import Path

from bench.shapes import write_random_checkpoint, written_once


def slow_write(into: Path) -> None:
    """Writes a weights file, then (a moment later) config.json, and counts itself in a log."""
    with open(into.parent / "writers.log", "a") as log:
        log.write("wrote\n")
    into.mkdir(parents=True, exist_ok=True)
    (into / "model.safetensors").write_bytes(b"w" * 1000)
    time.sleep(0.3)
    (into / "config.json").write_text("{}")


def ask(folder: str, out) -> None:
    done = written_once(Path(folder), slow_write)
    out.put(((done / "model.safetensors").stat().st_size, (done / "config.json").is_file()))


def test_one_process_writes_and_every_one_gets_a_whole_folder(tmp_path):
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    procs = [ctx.Process(target=ask, args=(str(tmp_path / "ckpt"), out)) for _ in range(4)]
    for p in procs:
        p.start()
    seen = [out.get(timeout=30) for _ in procs]
    for p in procs:
        p.join(timeout=30)
        assert p.exitcode == 0
    assert seen == [(1000, True)] * 4
    assert (tmp_path / "writers.log").read_text() == "wrote\n"
    assert sorted(f.name for f in tmp_path.iterdir()) == [".ckpt.lock", "ckpt", "writers.log"]


def test_a_dead_writers_leftovers_are_replaced_and_a_whole_folder_is_kept(tmp_path):
    partial = tmp_path / ".ckpt.partial"
    partial.mkdir()
    (partial / "model.safetensors").write_bytes(b"half")
    written_once(tmp_path / "ckpt", slow_write)
    assert (tmp_path / "ckpt" / "model.safetensors").read_bytes() == b"w" * 1000 and not partial.exists()
    written_once(tmp_path / "ckpt", lambda into: (_ for _ in ()).throw(AssertionError("written twice")))


def test_a_random_checkpoint_is_written_into_an_existing_empty_folder(tmp_path):
    (tmp_path / "tiny").mkdir()
    folder = write_random_checkpoint("tiny", tmp_path / "tiny")
    assert (folder / "config.json").is_file() and any(folder.glob("*.safetensors"))
