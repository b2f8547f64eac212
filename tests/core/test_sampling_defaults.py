"""Sampling defaults: the checkpoint's generation_config.json (read as transformers reads it), under
config files, under flags and KEY=VALUE, under a generation's own values; shown by ``tileinfer config``."""

from __future__ import annotations

import json
import shutil

import pytest

import tileinfer
from conftest import REFERENCE_CPU as BASE, run_cli as run
from tileinfer.errors import CheckpointError
from tileinfer.interfaces import SamplingParams
from tileinfer.sampling_params import NEUTRAL
from tileinfer.sampling_defaults import checkpoint_sampling

QWEN3 = {"bos_token_id": 151643, "do_sample": True, "eos_token_id": [2, 0], "pad_token_id": 0,
         "temperature": 0.6, "top_k": 20, "top_p": 0.95, "repetition_penalty": 1.05,
         "transformers_version": "4.51.0"}


@pytest.fixture
def folder(tiny_checkpoint, tmp_path):
    copy = tmp_path / "model"
    shutil.copytree(tiny_checkpoint, copy)
    return copy


def with_generation(folder, values: dict):
    (folder / "generation_config.json").write_text(json.dumps(values))
    return folder


def engine(folder, *sources, overrides=()):
    return tileinfer.Engine.from_config(*sources, model=str(folder), overrides=[*BASE, *overrides], progress=False)


def test_the_checkpoints_values_are_the_defaults(folder):
    e = engine(with_generation(folder, QWEN3))
    assert e.default_sampling == SamplingParams(temperature=0.6, top_k=20, top_p=0.95, min_p=0.0,
                                                repetition_penalty=1.05).resolved(NEUTRAL)


@pytest.mark.parametrize("values,expected", [
    ({}, dict(temperature=0.0, top_k=0, top_p=1.0, min_p=0.0, repetition_penalty=1.0)),  # do_sample absent: greedy
    ({"do_sample": False, "temperature": 0.7, "top_k": 5, "repetition_penalty": 1.2},
     dict(temperature=0.0, top_k=0, top_p=1.0, min_p=0.0, repetition_penalty=1.2)),  # the penalty applies anyway
    ({"do_sample": True}, dict(temperature=1.0, top_k=50, top_p=1.0, min_p=0.0, repetition_penalty=1.0)),
    ({"do_sample": True, "top_k": None, "min_p": 0.05, "temperature": 2},
     dict(temperature=2.0, top_k=0, top_p=1.0, min_p=0.05, repetition_penalty=1.0)),
])
def test_read_as_transformers_reads_it(folder, values, expected):
    assert checkpoint_sampling(with_generation(folder, values)) == expected


def test_no_file_is_greedy(folder):
    (folder / "generation_config.json").unlink(missing_ok=True)
    assert checkpoint_sampling(folder) == {}
    assert engine(folder).default_sampling == NEUTRAL


def test_precedence(folder, tmp_path, capsys):
    """generation_config.json < --config file < flag or KEY=VALUE < the generation's own values."""
    with_generation(folder, QWEN3)
    warm = tmp_path / "warm.yaml"
    warm.write_text("temperature: 0.3\ntop_k: 7\n")
    e = engine(folder, str(warm))
    assert (e.default_sampling.temperature, e.default_sampling.top_k, e.default_sampling.top_p) == (0.3, 7, 0.95)
    e = engine(folder, str(warm), overrides=["temperature=0.9"])
    assert (e.default_sampling.temperature, e.default_sampling.top_k) == (0.9, 7)
    code, out, err = run(capsys, "config", f"model={folder}", "--config", str(warm), *BASE, "top_p=0.5")
    assert code == 0, err
    lines = out.splitlines()
    assert {"temperature: 0.3", "top_k: 7", "top_p: 0.5", "min_p: 0.0", "repetition_penalty: 1.05"} <= set(lines)
    assert lines[-1] == (f"# null in the config: min_p, repetition_penalty; from {folder / 'generation_config.json'}: "
                         "min_p, repetition_penalty")
    # a flag over a config file, checked through generate: the same tokens as the explicit engine
    code, out, err = run(capsys, "generate", "--model", str(folder), "--config", str(warm), "--temperature", "0",
                         "--prompt-ids", "5,6,7", "--max-new-tokens", "6", "--json", *BASE)
    assert code == 0, err
    greedy = engine(folder, overrides=["temperature=0"])
    assert greedy.default_sampling.repetition_penalty == 1.05
    assert json.loads(out)["token_ids"] == greedy.generate([5, 6, 7], max_new_tokens=6).token_ids
    # the generation's own values win over everything
    own = SamplingParams(temperature=0.0, repetition_penalty=1.0)
    assert e.generate([5, 6, 7], max_new_tokens=6, sampling=own).token_ids == \
        engine(folder, overrides=["temperature=0", "repetition_penalty=1.0"]).generate([5, 6, 7], max_new_tokens=6).token_ids


def test_explicit_null_takes_the_checkpoints_value(folder):
    e = engine(with_generation(folder, QWEN3), {"temperature": 0.1}, overrides=["temperature=null"])
    assert e.default_sampling.temperature == 0.6


@pytest.mark.parametrize("values,words", [({"do_sample": "yes"}, "do_sample"),
                                          ({"do_sample": True, "temperature": -1}, "temperature=-1"),
                                          ({"do_sample": True, "top_p": 1.5}, "top_p=1.5"),
                                          ({"repetition_penalty": 0}, "repetition_penalty=0"),
                                          ({"do_sample": True, "top_k": 2.5}, "top_k=2.5")])
def test_a_bad_value_is_one_error_naming_the_file_before_loading(folder, capsys, values, words):
    with_generation(folder, values)
    (folder / "model.safetensors").write_bytes(b"not weights")  # never read
    with pytest.raises(CheckpointError, match="generation_config.json: " + words.replace("[", "\\[")):
        engine(folder)
    code, out, err = run(capsys, "config", f"model={folder}", *BASE)
    assert code == 1 and out == "" and err.startswith("error: ") and "generation_config.json" in err


def test_penalties_in_the_config_are_checked(capsys):
    code, out, err = run(capsys, "config", "device=cpu", "repetition_penalty=-1")
    assert code == 2 and "repetition_penalty=-1.0 is not valid" in err
    code, out, err = run(capsys, "config", "device=cpu", "presence_penalty=3")
    assert code == 2 and "presence_penalty=3" in err and "[-2, 2]" in err
