"""The command line's output under misuse: a reader of stdout that goes away ends the command
quietly; notices come after the engine was built (so an error is the first line) and ``--quiet``
silences them; the prompt is checked before any weight loads."""

from __future__ import annotations

import io
import logging
import os
import subprocess
import sys

import pytest

import tileinfer
from cli_checks import assert_one_error, generate_json
from conftest import REFERENCE_CPU as BASE, run_cli as run
from tileinfer.errors import UsageError
from tileinfer.notices import notice


# -- a reader that goes away --------------------------------------------------------------------

def _cli(*argv: str, **kw) -> subprocess.Popen:
    env = {**os.environ, "PYTHONUNBUFFERED": ""}
    return subprocess.Popen([sys.executable, "-m", "tileinfer.cli", *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env, **kw)


@pytest.mark.parametrize("argv", [["config"], ["plugins", "--json"]])
def test_a_closed_pipe_ends_quietly_with_status_141(argv):
    """``config`` prints less than stdout's 8 KiB buffer, so the pipe breaks at main's flush (as for
    plain ``plugins``, about 6 KB); ``plugins --json`` prints about 10 KB at once, so it breaks in the
    command's print."""
    process = _cli(*argv)
    process.stdout.close()  # the reader is gone before the command writes (it is still importing)
    err = process.stderr.read().decode()
    assert process.wait(timeout=120) == 141
    assert err == ""


def test_a_pipe_closed_after_one_line_mid_generation(tiny_checkpoint):
    process = _cli("generate", "--model", str(tiny_checkpoint), "--prompt", "def add(a, b):",
                   "--max-new-tokens", "300", *BASE)
    assert process.stdout.read(1)  # the first text streamed, then the reader goes away as `head -c 1` does
    process.stdout.close()
    err = process.stderr.read().decode()
    assert process.wait(timeout=120) == 141
    assert err == ""  # no error, no traceback, no stats: nothing after the pipe broke


# -- notices: after the engine was built, silenced by --quiet -----------------------------------

def test_notice_logs_a_warning_to_the_tileinfer_logger(caplog):
    with caplog.at_level(logging.WARNING, logger="tileinfer"):
        notice("something had no effect")
    assert [(r.name, r.levelno, r.getMessage()) for r in caplog.records] == [
        ("tileinfer", logging.WARNING, "something had no effect")]


@pytest.fixture
def noticing_engine(monkeypatch):
    """The engine logs a notice while it is built (as it does for settings with no effect here)."""
    original = tileinfer.Engine._build_decoder

    def build_decoder(self):
        notice("a test setting has no effect here")
        return original(self)

    monkeypatch.setattr(tileinfer.Engine, "_build_decoder", build_decoder)
    return monkeypatch


def test_notices_print_after_the_engine_was_built(capsys, tiny_checkpoint, noticing_engine):
    code, out, err = run(capsys, "generate", "--model", str(tiny_checkpoint), "--prompt", "def", "--max-new-tokens",
                         "3", *BASE)
    assert code == 0, err
    lines = err.splitlines()
    assert lines[0] == "notice: a test setting has no effect here" and "3 tokens" in lines[-1]


@pytest.mark.parametrize("before, after", [(["-q"], []), (["--quiet"], []), ([], ["-q"]), ([], ["--quiet"])])
def test_quiet_silences_notices(capsys, tiny_checkpoint, noticing_engine, before, after):
    code, out, err = run(capsys, *before, "generate", *after, "--model", str(tiny_checkpoint), "--prompt", "def",
                         "--max-new-tokens", "3", *BASE)
    assert code == 0, err
    assert err == "" and out  # the text only: no notice, no stats line


def test_an_error_after_a_notice_is_the_only_line(capsys, tiny_checkpoint, monkeypatch):
    def build_decoder(self):
        notice("a test setting has no effect here")
        raise UsageError("the engine cannot be built")

    monkeypatch.setattr(tileinfer.Engine, "_build_decoder", build_decoder)
    code, out, err = run(capsys, "generate", "--model", str(tiny_checkpoint), "--prompt", "def", *BASE)
    assert err == "error: the engine cannot be built\n" and out == "" and code == 2


def test_the_api_gets_notices_through_logging(caplog, tiny_checkpoint, noticing_engine):
    with caplog.at_level(logging.WARNING, logger="tileinfer"):
        tileinfer.Engine.from_config("reference", model=str(tiny_checkpoint), device="cpu", progress=False)
    assert "a test setting has no effect here" in caplog.messages


def test_the_cpu_notice_comes_only_when_the_gpu_settings_were_asked_for(capsys, caplog, tiny_checkpoint):
    argv = ["generate", "--model", str(tiny_checkpoint), "--prompt", "def", "--max-new-tokens", "2", "device=cpu",
            "dtype=float32", "linear=reference", "attention=reference"]
    code, _, err = run(capsys, *argv)
    assert code == 0 and "notice" not in err, err  # the defaults: nothing to say
    code, _, err = run(capsys, *argv, "cuda_graphs=true")
    assert code == 0 and err.startswith("notice: cuda_graphs has no effect on device cpu"), err
    code, _, err = run(capsys, "-q", *argv, "cuda_graphs=true")
    assert code == 0 and err == ""
    keys = dict(model=str(tiny_checkpoint), device="cpu", dtype="float32", linear="reference", attention="reference",
                progress=False)
    with caplog.at_level(logging.WARNING, logger="tileinfer"):
        tileinfer.Engine.from_config(**keys)
        assert not any("no effect on device cpu" in m for m in caplog.messages)
        tileinfer.Engine.from_config(pipelined=True, **keys)
    assert any("pipelined has no effect on device cpu" in m for m in caplog.messages)


@pytest.mark.parametrize("argv", [["generate", "--prompt", "def"], ["config"], ["plugins"], ["chat"]])
def test_standard_output_closed_is_one_error(capsys, monkeypatch, tiny_checkpoint, argv):
    """Python sets sys.stdout to None when the command starts with file descriptor 1 closed (>&-)."""
    monkeypatch.setattr(sys, "stdout", None)
    code, out, err = run(capsys, *argv, "--model", str(tiny_checkpoint), *BASE) if argv[0] != "plugins" \
        else run(capsys, *argv)
    assert_one_error(code, out, err, "standard output is closed", status=1)


# -- the prompt is checked before any weight ----------------------------------------------------

@pytest.fixture
def no_loading(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the engine was built (weights read) before the prompt was checked")

    monkeypatch.setattr(tileinfer.Engine, "__init__", refuse)


@pytest.mark.parametrize("argv, words", [
    (["--prompt", ""], ["the prompt is empty"]),
    (["--prompt-ids", ""], ["the prompt is empty"]),
    (["--prompt-ids", ","], ["the prompt is empty"]),
    (["--prompt", "\udcff"], ["not valid UTF-8"]),  # what Python makes of argv byte 0xff (surrogateescape)
    (["--prompt", "ok \udce9 then"], ["not valid UTF-8"]),
    (["--prompt-ids", "5,320"], ["token id 320", "vocabulary"]),
    (["--prompt-ids", "-1"], ["token id -1"]),
    (["--prompt-ids", str(2**70)], ["vocabulary"]),
    (["--prompt-ids", ",".join(["5"] * 500), "--max-new-tokens", "20"], ["520 positions"]),
    (["--prompt", "hi", "--max-new-tokens", "600"], ["positions", "the model's context"]),
    (["--prompt-ids", "1,2", "--max-new-tokens", "10", "kv_capacity=8"], ["kv_capacity (8)"]),
    (["--prompt-ids", "1,2", "--chat"], ["--chat"]),
])
def test_a_bad_prompt_fails_before_loading(capsys, tiny_checkpoint, no_loading, argv, words):
    code, out, err = run(capsys, "generate", "--model", str(tiny_checkpoint), *BASE, *argv)
    assert_one_error(code, out, err, *words)


def test_standard_input_is_decoded_strictly(capsys, monkeypatch, tiny_checkpoint, no_loading):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"def f():\n\xff\xfe")))
    code, out, err = run(capsys, "generate", "--model", str(tiny_checkpoint), "--prompt", "-", *BASE)
    assert_one_error(code, out, err, "standard input is not valid UTF-8 (byte 0xff at offset 9)")
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"")))
    assert_one_error(*run(capsys, "generate", "--model", str(tiny_checkpoint), "--prompt", "-", *BASE), "empty")


def test_standard_input_gives_the_same_text_as_the_argument(capsys, monkeypatch, tiny_checkpoint):
    prompt = "def add(a, b): # é"
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(prompt.encode())))
    from_stdin = generate_json(capsys, "--model", str(tiny_checkpoint), prompt=("--prompt", "-"))
    assert from_stdin == generate_json(capsys, "--model", str(tiny_checkpoint), prompt=("--prompt", prompt))
