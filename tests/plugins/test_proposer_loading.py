"""The draft and DFlash proposers build their models through the public loader (``tileinfer.load_model``,
``tileinfer.open_weights``, ``tileinfer.Implementations``), with the run's implementations, and read each
file of their checkpoint, and of the target's, once; their modules import no engine internals."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import tileinfer
import tileinfer.model_loader
from conftest import REFERENCE_CPU, ROOT
from test_checkpoint_reads import Reads

SHIPPED = tileinfer.shipped_model()
INTERNALS = ("tileinfer.engine", "tileinfer.loading", "tileinfer.memory", "tileinfer.model", "tileinfer.resolution")


@pytest.mark.parametrize("path", ["plugins/draft.py", "plugins/dflash.py"])
def test_the_proposers_import_no_engine_internals(path):
    imported = set()
    for node in ast.walk(ast.parse((ROOT / path).read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module)
        elif isinstance(node, ast.Import):
            imported.update(alias.name for alias in node.names)
    assert not imported & set(INTERNALS), imported & set(INTERNALS)


def _folder(call: tuple) -> Path:
    (source, *_), _ = call
    return Path(getattr(source, "folder", source))


def spy(monkeypatch, name: str) -> list:
    calls, real = [], getattr(tileinfer.model_loader, name)

    def recording(*args, **kwargs):
        calls.append((args, kwargs))
        return real(*args, **kwargs)

    monkeypatch.setattr(tileinfer.model_loader, name, recording)
    return calls


@pytest.mark.parametrize("proposer", ["draft", "dflash"])
def test_a_proposer_loads_through_the_public_loader_reading_each_file_once(monkeypatch, proposer):
    reads = Reads(monkeypatch)
    loads, weights = spy(monkeypatch, "load_model"), spy(monkeypatch, "open_weights")
    engine = tileinfer.Engine.from_config(overrides=[*REFERENCE_CPU, f"proposer={proposer}", "spec_k=3"],
                                          progress=False)
    engine.generate("def f(x):", max_new_tokens=4)
    folder = SHIPPED.parent / proposer
    assert engine.proposer.folder == folder
    # The draft is a Qwen3 model (load_model); DFlash's stack reads its own tensors (open_weights).
    # The engine's own load of the target is recorded too where tileinfer.engine is first imported
    # after the spy is set (this file run alone): only the proposer's folder counts.
    loads, weights = ([c for c in spied if _folder(c) == folder] for spied in (loads, weights))
    calls = loads if proposer == "draft" else weights
    assert len(calls) == 1 and len(loads) + len(weights) == 1
    (_, *rest), keywords = calls[0]
    assert keywords["device"] == engine.device and keywords["dtype"] == engine.dtype
    if proposer == "draft":
        assert rest == [tileinfer.Implementations.of(engine.config, engine.registry)]
    for checked in (SHIPPED, folder):
        files = reads.of(checked)
        assert files and max(files.values()) == 1, (checked, files)
    assert reads.of(folder)["config.json"] == 1 and reads.of(folder)["model.safetensors"] == 1
