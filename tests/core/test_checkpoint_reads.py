"""A run reads each file of its checkpoint once (core/checkpoint.py): config.json, generation_config.json,
the tokenizer's files and the safetensors, whether built by ``tileinfer generate`` (which resolves the
config and checks the prompt before the engine loads) or by ``Engine.from_config``; ``tileinfer config``
reads the two config files and nothing else. The config is resolved once per command.
"""

from __future__ import annotations

import builtins
import collections
import io
from pathlib import Path

import pytest

import tileinfer
import tileinfer.loading
import tileinfer.resolution
import tileinfer.tokenizer
from conftest import REFERENCE_CPU, run_cli
from tileinfer.errors import UsageError
from tileinfer.registry import build_registry


class Reads:
    """Files opened, by resolved path: through Python's ``open`` (the JSON files, chat_template.jinja),
    the tokenizers library (tokenizer.json) and safetensors (the weights)."""

    def __init__(self, monkeypatch) -> None:
        self.counts: collections.Counter[Path] = collections.Counter()
        real_open, real_tokenizer, real_safe_open = builtins.open, tileinfer.tokenizer.HFTokenizer, \
            tileinfer.loading.safe_open

        def counting_open(file, *args, **kwargs):
            if not isinstance(file, int):
                self.counts[Path(file).resolve()] += 1
            return real_open(file, *args, **kwargs)

        class CountingTokenizer:
            @staticmethod
            def from_file(path):
                self.counts[Path(path).resolve()] += 1
                return real_tokenizer.from_file(path)

        def counting_safe_open(path, *args, **kwargs):
            self.counts[Path(path).resolve()] += 1
            return real_safe_open(path, *args, **kwargs)

        monkeypatch.setattr(builtins, "open", counting_open)
        monkeypatch.setattr(io, "open", counting_open)
        monkeypatch.setattr(tileinfer.tokenizer, "HFTokenizer", CountingTokenizer)
        monkeypatch.setattr(tileinfer.loading, "safe_open", counting_safe_open)

    def of(self, folder: Path) -> dict[str, int]:
        """Reads of each file in ``folder`` that was read at all."""
        folder = folder.resolve()
        return {path.name: n for path, n in self.counts.items() if path.parent == folder}


@pytest.fixture
def reads(monkeypatch) -> Reads:
    return Reads(monkeypatch)


@pytest.fixture
def resolutions(monkeypatch) -> list:
    calls = []
    real = tileinfer.resolution.resolve

    def counting(config, registry):
        calls.append(config)
        return real(config, registry)

    monkeypatch.setattr(tileinfer.resolution, "resolve", counting)
    return calls


SHIPPED = tileinfer.shipped_model()
EVERY_FILE = {"config.json": 1, "generation_config.json": 1, "tokenizer.json": 1, "tokenizer_config.json": 1,
              "model.safetensors": 1}


def test_generate_resolves_once_and_reads_each_file_once(capsys, reads, resolutions):
    code, out, err = run_cli(capsys, "generate", "--prompt", "def f(x):", "--max-new-tokens", "2", *REFERENCE_CPU)
    assert code == 0, err
    assert len(resolutions) == 1
    files = reads.of(SHIPPED)
    assert {name: files.get(name, 0) for name in EVERY_FILE} == EVERY_FILE
    assert max(files.values()) == 1, files  # chat_template.jinja, when read, once too


def test_the_api_reads_each_file_once(reads, resolutions):
    engine = tileinfer.Engine.from_config(overrides=REFERENCE_CPU, progress=False)
    engine.generate("def f(x):", max_new_tokens=2)
    engine.generate("def g(y):", max_new_tokens=2, chat=True)
    assert len(resolutions) == 1
    files = reads.of(SHIPPED)
    assert {name: files.get(name, 0) for name in EVERY_FILE} == EVERY_FILE and max(files.values()) == 1


def test_a_resolved_config_is_built_from_as_it_is(reads, resolutions):
    """An Engine given a ResolvedConfig resolves nothing again, and its tokenizer is the one the
    checkpoint built (the command line checks the prompt with it first)."""
    resolved = tileinfer.ResolvedConfig.of(tileinfer.load_config(overrides=REFERENCE_CPU))
    tokenizer = resolved.checkpoint.tokenizer
    engine = tileinfer.Engine(resolved, progress=False)
    assert engine.tokenizer is tokenizer and engine.checkpoint is resolved.checkpoint
    assert engine.config == resolved.config == tileinfer.resolve_config(tileinfer.load_config(overrides=REFERENCE_CPU))
    assert len(resolutions) == 2  # ResolvedConfig.of, then resolve_config here; none by the engine
    with pytest.raises(UsageError, match="pass no registry"):
        tileinfer.Engine(resolved, build_registry(), progress=False)


def test_config_reads_the_config_files_only(capsys, reads, resolutions):
    code, out, err = run_cli(capsys, "config", *REFERENCE_CPU)
    assert code == 0, err
    assert len(resolutions) == 1
    assert reads.of(SHIPPED) == {"config.json": 1, "generation_config.json": 1}
    assert f"from {SHIPPED / 'generation_config.json'}: temperature" in out
