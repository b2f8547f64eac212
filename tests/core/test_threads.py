"""Config key ``threads``: torch's CPU threads of a run on a CPU (0: auto, bounded by the CPUs this
process may use and by the machine's load)."""

from __future__ import annotations

import os

import pytest
import torch

import tileinfer
from conftest import REFERENCE_CPU as BASE, run_cli as run
from tileinfer import threads


@pytest.mark.parametrize("allowed,load,expected", [(8, 0.2, 8), (8, 3.4, 5), (8, 9.0, 1), (64, 0.0, 16), (2, 1.6, 1),
                                                   (1, 0.0, 1)])
def test_auto_is_the_allowed_cpus_less_the_busy_ones(monkeypatch, allowed, load, expected):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(allowed)))
    monkeypatch.setattr(os, "getloadavg", lambda: (load, 0.0, 0.0))
    assert threads.cpu_threads(0) == expected
    assert threads.cpu_threads(3) == 3  # a number is taken as it is


@pytest.fixture
def restore_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_the_engine_applies_it_on_a_cpu(tiny_checkpoint, restore_threads, monkeypatch):
    tileinfer.Engine.from_config(model=str(tiny_checkpoint), overrides=[*BASE, "threads=3"], progress=False)
    assert torch.get_num_threads() == 3  # not this machine's 2 cores: the key, not a default
    monkeypatch.setattr(threads, "cpu_threads", lambda setting: 1 if setting == 0 else setting)
    monkeypatch.setattr(tileinfer.engine, "cpu_threads", threads.cpu_threads)
    tileinfer.Engine.from_config(model=str(tiny_checkpoint), overrides=BASE, progress=False)
    assert torch.get_num_threads() == 1


@pytest.mark.parametrize("value", ["-1", "4097", "1.5", "auto"])
def test_a_bad_value_is_a_config_error(capsys, value):
    code, out, err = run(capsys, "config", "device=cpu", f"threads={value}")
    assert code == 2 and err.startswith(f"error: threads={value}")
