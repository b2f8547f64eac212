"""``tileinfer quantize --out`` is written whole or not at all (core/atomic_folder.py): a run
stopped at any write leaves nothing at --out that loads; --out is checked before any weight is
read; every file gets the mode a new file gets (0666 less the umask)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import safetensors.torch

import tileinfer.atomic_folder
from tileinfer.errors import CheckpointError, ConfigError, UsageError
from tileinfer.loading import CheckpointReader
from tileinfer.quantize import COPIED_FILES, quantize_checkpoint

from conftest import reference_engine, run_cli


class Killed(BaseException):
    """What the test raises where the process would die: not an Exception, like a signal."""


def _die_reading(monkeypatch):
    real = CheckpointReader.tensor
    calls = iter(range(3))

    def tensor(self, name):
        if next(calls, None) is None:
            raise Killed
        return real(self, name)
    monkeypatch.setattr(CheckpointReader, "tensor", tensor)


def _die_in_model_safetensors(monkeypatch):
    def half(tensors, path, metadata=None):
        data = safetensors.torch.save(tensors, metadata=metadata)
        Path(path).write_bytes(data[: len(data) // 2])
        raise Killed
    monkeypatch.setattr(safetensors.torch, "save_file", half)


def _die_copying(monkeypatch):
    def copyfile(src, dst):
        raise Killed
    monkeypatch.setattr(shutil, "copyfile", copyfile)


def _die_in_config_json(monkeypatch):
    real = Path.write_text

    def write_text(self, text, *args, **kwargs):
        if self.name == "config.json":
            real(self, text[: len(text) // 2])
            raise Killed
        return real(self, text, *args, **kwargs)
    monkeypatch.setattr(Path, "write_text", write_text)


def _die_flushing(monkeypatch):
    def fsync(fd):
        raise Killed
    monkeypatch.setattr(os, "fsync", fsync)


def _die_renaming(monkeypatch):
    def rename(src, dst):
        raise Killed
    monkeypatch.setattr(os, "rename", rename)


KILL_POINTS = {"reading": _die_reading, "model.safetensors": _die_in_model_safetensors, "copying": _die_copying,
               "config.json": _die_in_config_json, "fsync": _die_flushing, "rename": _die_renaming}


def _partials(parent: Path, name: str) -> list[Path]:
    return sorted(parent.glob(f".{name}.partial-*"))


@pytest.mark.parametrize("point", list(KILL_POINTS))
def test_killed_at_any_write_leaves_nothing_at_out(tiny_checkpoint, tmp_path, monkeypatch, point):
    """The process dies (no clean-up runs) at each write in turn: --out does not exist, and the
    temporary folder beside it is no checkpoint unless it was complete."""
    out = tmp_path / "int8"
    with monkeypatch.context() as m:
        m.setattr(tileinfer.atomic_folder.shutil, "rmtree", lambda *a, **k: None)  # a dead process cleans nothing
        KILL_POINTS[point](m)
        with pytest.raises(Killed):
            quantize_checkpoint(tiny_checkpoint, out)
    assert not out.exists()
    with pytest.raises(ConfigError, match="model folder not found"):
        reference_engine(out)
    [partial] = _partials(tmp_path, "int8")
    if point not in ("fsync", "rename"):  # config.json, written last, is not (whole) there
        with pytest.raises(CheckpointError, match="config.json"):
            reference_engine(partial)


def test_the_next_run_removes_an_abandoned_partial_folder(tiny_checkpoint, tmp_path, monkeypatch, caplog):
    out = tmp_path / "int8"
    with monkeypatch.context() as m:
        m.setattr(tileinfer.atomic_folder.shutil, "rmtree", lambda *a, **k: None)
        _die_in_model_safetensors(m)
        with pytest.raises(Killed):
            quantize_checkpoint(tiny_checkpoint, out)
    [partial] = _partials(tmp_path, "int8")
    gone = subprocess.Popen(["true"])
    gone.wait()  # a process id that no process has now
    abandoned = partial.with_name(f".int8.partial-{gone.pid}-0000")
    partial.rename(abandoned)
    live = tmp_path / f".int8.partial-{os.getpid()}-1111"  # a run still going on: left alone
    live.mkdir()
    quantize_checkpoint(tiny_checkpoint, out)
    assert _partials(tmp_path, "int8") == [live]
    assert f"removed {abandoned}" in caplog.text
    assert reference_engine(out).generate([1, 2, 3], max_new_tokens=2).token_ids


def test_an_error_while_writing_removes_everything(tiny_checkpoint, tmp_path, monkeypatch, capsys):
    """A failed write (a full disk) is one line; nothing is left: no --out, no temporary folder,
    no parent folder the run made."""
    def full(tensors, path, metadata=None):
        Path(path).write_bytes(b"\0" * 10)
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(safetensors.torch, "save_file", full)
    out = tmp_path / "new" / "deeper" / "int8"
    code, _, err = run_cli(capsys, "-q", "quantize", "--model", str(tiny_checkpoint), "--out", str(out))
    assert code == 1 and err.count("\n") == 1, err
    assert err.startswith(f"error: --out {out}: ") and "No space left on device; nothing was written" in err
    assert list(tmp_path.iterdir()) == []


def _no_weight_read(monkeypatch):
    def tensor(self, name):
        raise AssertionError(f"weight {name} read before --out was checked")
    monkeypatch.setattr(CheckpointReader, "tensor", tensor)


def test_out_is_checked_before_any_weight_is_read(tiny_checkpoint, tmp_path, monkeypatch, capsys):
    _no_weight_read(monkeypatch)
    (tmp_path / "file").write_text("x")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    cases = {tmp_path / "file": "exists and is not an empty folder",
             tmp_path / "full": "exists and is not an empty folder",
             tmp_path / "file" / "int8": f"{tmp_path / 'file'} is not a folder",
             tmp_path / "file" / "a" / "int8": f"{tmp_path / 'file'} is not a folder"}
    for out, words in cases.items():
        before = sorted(tmp_path.rglob("*"))
        code, _, err = run_cli(capsys, "quantize", "--model", str(tiny_checkpoint), "--out", str(out))
        assert code == 2 and err == f"error: --out {out}: {words}\n"
        assert sorted(tmp_path.rglob("*")) == before


def test_an_unwritable_parent_is_found_before_quantizing(tiny_checkpoint, tmp_path, monkeypatch):
    _no_weight_read(monkeypatch)
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    try:
        if os.access(locked, os.W_OK):
            pytest.skip("this user writes in a folder of mode 0555 (root)")
        with pytest.raises(UsageError, match=f"cannot write in {locked}: Permission denied"):
            quantize_checkpoint(tiny_checkpoint, locked / "int8")
        assert list(locked.iterdir()) == []
    finally:
        locked.chmod(0o755)


@pytest.mark.parametrize("umask", [0o022, 0o027])
def test_one_mode_for_every_file_from_the_umask(tiny_checkpoint, tmp_path, umask):
    """model.safetensors (which safetensors writes 0600) gets the mode of the other files: the mode
    ``open()`` gives a new file; the folder the mode ``mkdir`` gives. An empty --out is replaced."""
    out = tmp_path / "int8"
    out.mkdir()
    saved = os.umask(umask)
    try:
        quantize_checkpoint(tiny_checkpoint, out)
    finally:
        os.umask(saved)
    modes = {path.name: path.stat().st_mode & 0o777 for path in out.iterdir()}
    assert modes["model.safetensors"] == 0o666 & ~umask
    assert set(modes.values()) == {0o666 & ~umask}, modes
    assert out.stat().st_mode & 0o777 == 0o777 & ~umask
    copied = {name for name in COPIED_FILES if (tiny_checkpoint / name).is_file()}
    assert {"generation_config.json", "tokenizer.json"} <= copied
    assert set(modes) == copied | {"config.json", "model.safetensors"}
    assert all((out / name).read_bytes() == (tiny_checkpoint / name).read_bytes() for name in copied)
