"""bench/gpu.py without a GPU: every step of every check is a command line its command accepts (a
renamed option would otherwise surface only on the GPU), the steps share the call's time, and the
table of ``compare``."""

from __future__ import annotations

import argparse
import importlib
import subprocess
import sys
import time

import pytest

from bench import gpu
from bench.__main__ import COMMANDS


def parses(argv: list[str]) -> argparse.Namespace:
    module, prefix, _ = COMMANDS[argv[0]]
    p = argparse.ArgumentParser(exit_on_error=False)
    getattr(importlib.import_module(f"bench.{module}"), f"{prefix}arguments")(p)
    return p.parse_args(argv[1:])


@pytest.mark.parametrize("check", gpu.CHECKS)
def test_every_step_of_a_check_is_a_command_line_its_command_accepts(check):
    for seconds, argv in gpu.CHECKS[check]:
        assert 0 < seconds <= 560, (check, argv)
        parses(gpu.step_argv(argv, ["--commit", "abc1234", "--records", "/tmp/r.jsonl"]))


def test_the_tests_a_check_names_exist():
    """A ``gpu-tests`` step's ``FILE::TEST`` names a test function of that file (a renamed test
    would otherwise be found missing only on the GPU)."""
    named = [a for steps in gpu.CHECKS.values() for _, argv in steps if argv[0] == "gpu-tests" for a in argv
             if "::" in a]
    assert named
    for node in named:
        path, test = node.split("::")
        assert f"def {test}(" in (gpu.ROOT / path).read_text(), node


def test_a_bad_check_is_a_usage_error(capsys):
    from bench.__main__ import main

    with pytest.raises(SystemExit):
        main(["check", "everything"])
    assert "invalid choice: 'everything'" in capsys.readouterr().err


def test_steps_are_stopped_at_their_seconds_and_the_calls_time(monkeypatch, capsys):
    calls = []

    def run(argv, cwd, env, timeout):
        assert argv[:3] == [sys.executable, "-m", "bench"]
        calls.append((argv[3:], timeout))
        if argv[3] == "slow":
            raise subprocess.TimeoutExpired(argv, timeout)
        return subprocess.CompletedProcess(argv, 0)

    monkeypatch.setattr(gpu.subprocess, "run", run)
    statuses = gpu.run_steps([(100, ["slow"]), (50, ["quick"]), (5, ["gpu-tests", "t.py"]), (10, ["late"])], 140,
                             ["--commit", "c"])
    assert statuses == [124, 0, 0, 0]
    assert [a for a, _ in calls] == [["slow", "--commit", "c"], ["quick", "--commit", "c"], ["gpu-tests", "t.py"],
                                     ["late", "--commit", "c"]]  # the tests take no --commit
    assert [t for _, t in calls] == [100, 50, 5, 10]
    assert gpu.run_steps([(100, ["x"])], 20, []) == [124]  # under 30 s left: not started
    assert "out of time before: x" in capsys.readouterr().out


def test_the_compare_table_gives_each_round_the_medians_and_the_speed_ratio():
    rows = []
    for r, (before, after) in enumerate([(380.0, 390.0), (384.0, 386.0), (370.0, 392.0)], 1):
        for side, decode, prefill, commit in (("before", before, 20.0, "aaa1111"), ("after", after, 16.0, "bbb2222")):
            for workload, value, unit in (("decode128_ctx1024", decode, "tok/s"), ("prefill1024", prefill, "ms")):
                rows.append({"shape": "Qwen3-4B", "workload": workload, "value": value, "unit": unit, "side": side,
                             "round": r, "commit": commit})
    table = gpu.compare_table(rows)
    decode = next(line for line in table.splitlines() if "decode128_ctx1024" in line)
    assert "| 380, 384, 370 | 390, 386, 392 | 380 tok/s | 390 tok/s |" in decode
    assert decode.endswith(f"| x{390 / 380:.3f} |")
    prefill = next(line for line in table.splitlines() if "prefill1024" in line)
    assert prefill.endswith("| x1.250 |")  # 20 ms -> 16 ms is 1.25x the speed
    assert table.endswith("before: aaa1111; after: bbb2222")


def test_compare_refuses_a_folder_without_a_tree(tmp_path, capsys):
    from bench.__main__ import main

    assert main(["compare", "--before", str(tmp_path), "--before-commit", "aaa1111"]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_each_side_is_a_package_folder_as_pyproject_maps_it(tmp_path):
    tree = tmp_path / "tree"
    for sub in ("core", "backends", "plugins", "configs", "models"):
        (tree / sub).mkdir(parents=True)
        (tree / sub / "x.py").write_text(sub)
    folder = gpu.package(tree, tmp_path / "pkg")
    assert (folder / "tileinfer" / "x.py").read_text() == "core"
    assert all((folder / "tileinfer" / sub / "x.py").read_text() == sub
               for sub in ("backends", "plugins", "configs", "models"))


def test_gpu_tests_interrupts_pytest_at_its_seconds_and_still_names_the_failures(tmp_path, capfd):
    """``bench gpu-tests`` stops a run that outlasts --seconds with an interrupt, not a kill, so that
    pytest's summary names the tests that failed before it (a killed run names none)."""
    from argparse import Namespace

    (tmp_path / "test_slow.py").write_text(
        "import time\nimport pytest\n\n\n@pytest.mark.gpu\ndef test_fails():\n    assert 1 == 2\n\n\n"
        "@pytest.mark.gpu\ndef test_sleeps():\n    time.sleep(60)\n")
    began = time.monotonic()
    assert gpu.tests_main(Namespace(paths=[str(tmp_path / "test_slow.py")], workers=1, seconds=8, keyword=None)) == 124
    assert time.monotonic() - began < 45
    out = capfd.readouterr().out
    assert "stopped after 8 s" in out and "test_fails" in out and "FAILED" in out


def test_gpu_tests_runs_only_the_tests_that_k_selects(tmp_path, capfd):
    from argparse import Namespace

    (tmp_path / "test_pick.py").write_text(
        "import pytest\n\n\n@pytest.mark.gpu\ndef test_fails():\n    assert 1 == 2\n\n\n"
        "@pytest.mark.gpu\ndef test_passes():\n    pass\n")
    args = Namespace(paths=[str(tmp_path / "test_pick.py")], workers=1, seconds=60)
    assert gpu.tests_main(Namespace(**vars(args), keyword="passes")) == 0
    out = capfd.readouterr().out
    assert "test_passes" in out and "1 passed" in out and "test_fails" not in out
    assert gpu.tests_main(Namespace(**vars(args), keyword=None)) == 1
