"""The one check of where the kernels run (backends/triton/interpreter.py)."""

from __future__ import annotations

import torch

from tileinfer.backends.triton import interpreter


def test_interpreter_follows_the_environment(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert interpreter.interpreting()
    assert interpreter.kernels_run_on(torch.device("cpu")) and interpreter.kernels_run_on(torch.device("cuda"))
    assert interpreter.interpreted(torch.device("cpu")) and interpreter.interpreted(torch.device("cuda"))
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert not interpreter.interpreting()
    assert not interpreter.kernels_run_on(torch.device("cpu")) and interpreter.kernels_run_on(torch.device("cuda"))
    assert interpreter.interpreted(torch.device("cpu")) and not interpreter.interpreted(torch.device("cuda"))


def test_cpu_tensors_use_the_default_multiprocessor_count():
    assert interpreter.sms_of(torch.device("cpu")) == interpreter.DEFAULT_NUM_SMS
