"""A folder written whole or not at all, for ``tileinfer quantize --out``: its files go into a
temporary folder beside the destination, ``.NAME.partial-PID-XXXXXXXX``, which is flushed to disk
and renamed to the destination only once every file is in it. A process killed midway leaves the
temporary folder and nothing at the destination; the next call for the same destination removes
the temporary folders whose process is gone."""

from __future__ import annotations

import os
import secrets
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tileinfer.errors import CheckpointError, UsageError
from tileinfer.notices import notice


def check_destination(out: Path) -> None:
    """UsageError unless ``out`` is absent or an empty folder."""
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UsageError(f"--out {out}: exists and is not an empty folder")


@contextmanager
def written_in_place(out: Path) -> Iterator[Path]:
    """An empty temporary folder beside ``out`` for the block to fill; when the block ends without
    an exception, every file in it is given the mode ``open()`` gives a new file (0666 less the
    umask), flushed to disk with the folder, and the folder is renamed to ``out`` (an empty folder
    there is replaced). ``out`` is checked first: a file or a non-empty folder there, or a parent
    that cannot be written, is a UsageError and nothing is written. On an exception the temporary
    folder (and any parent folder this call made) is removed; an OSError is re-raised as one
    CheckpointError line."""
    check_destination(out)
    parent = out.absolute().parent
    made = [p for p in (parent, *parent.parents) if not p.exists()]
    above = parent.parents[len(made) - 1] if made else parent  # the nearest folder that exists
    if not above.is_dir():
        raise UsageError(f"--out {out}: {above} is not a folder")
    partial = parent / f".{out.name}.partial-{os.getpid()}-{secrets.token_hex(4)}"
    try:
        parent.mkdir(parents=True, exist_ok=True)
        _remove_abandoned(parent, out.name)
        partial.mkdir()  # 0777 less the umask, as a folder the user makes
    except OSError as exc:
        _remove_empty(made)
        raise UsageError(f"--out {out}: cannot write in {parent}: {exc.strerror or exc}") from exc
    try:
        yield partial
        file_mode = partial.stat().st_mode & 0o666
        for path in partial.rglob("*"):
            if path.is_file():
                path.chmod(file_mode)
                _fsync(path)
        _fsync(partial)
        os.rename(partial, out)
        _fsync(parent)
    except BaseException as exc:
        shutil.rmtree(partial, ignore_errors=True)
        _remove_empty(made)
        if isinstance(exc, OSError):
            raise CheckpointError(f"--out {out}: {exc}; nothing was written") from exc
        raise


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _remove_empty(folders: list[Path]) -> None:
    """Remove ``folders`` (deepest first) where they are empty."""
    for folder in folders:
        try:
            folder.rmdir()
        except OSError:
            pass


def _remove_abandoned(parent: Path, name: str) -> None:
    """Remove the temporary folders for ``parent / name`` left by processes that are gone."""
    prefix = f".{name}.partial-"
    for path in parent.iterdir():
        pid = path.name.removeprefix(prefix).split("-")[0]
        if path.name.startswith(prefix) and path.is_dir() and pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(path, ignore_errors=True)
            notice(f"removed {path}: the partial copy of an interrupted tileinfer quantize")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


__all__ = ["check_destination", "written_in_place"]
