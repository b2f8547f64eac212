"""Shared by the checkpoint-error tests: load a folder through the API or the CLI and expect one
CheckpointError line; copy a saved checkpoint and edit its files."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file

import tileinfer
from tileinfer.cli import main
from tileinfer.errors import CheckpointError

def load(folder: Path):
    return tileinfer.Engine.from_config("reference", model=str(folder), device="cpu", dtype="float32",
                                        progress=False)


def cli(folder: Path, capsys, *extra: str) -> str:
    """Run ``tileinfer generate`` on ``folder``; the one stderr line (after checking exit status 1)."""
    capsys.readouterr()
    status = main(["generate", "--model", str(folder), "--prompt-ids", "1,2,3", "--max-new-tokens", "2",
                   "--config", "reference", "device=cpu", "dtype=float32", *extra])
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert status == 1, err
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err
    return lines[0].removeprefix("error: ")


def fails(folder: Path, file: str, *words: str) -> str:
    """Loading ``folder`` raises one CheckpointError line that starts with the path of ``file``
    and contains ``words``; the message."""
    with pytest.raises(CheckpointError) as info:
        load(folder)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"{folder / file}: "), message
    for word in words:
        assert word in message, message
    return message


def copies(tmp_path: Path, checkpoint_factory):
    """``make(**kw)``: a fresh copy of the checkpoint ``checkpoint_factory(**kw)`` under ``tmp_path``."""
    count = iter(range(1000))

    def make(**kw) -> Path:
        target = tmp_path / f"ckpt{next(count)}"
        shutil.copytree(checkpoint_factory(**kw), target)
        return target
    return make


def shard_of(folder: Path, name: str) -> Path:
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        return folder / json.loads(index.read_text())["weight_map"][name]
    return folder / "model.safetensors"


def poke(folder: Path, name: str, value: float, where: int = -1) -> str:
    """Set one element of tensor ``name`` to ``value`` in place; the file's name."""
    file = shard_of(folder, name)
    tensors = load_file(file)
    tensors[name].view(-1)[where] = value
    save_file(tensors, file, metadata={"format": "pt"})
    return file.name
