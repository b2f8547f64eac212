"""The command line's --version, the sampling flags vLLM and llama.cpp users type (--temperature,
--top-p, --top-k, --min-p, --seed and the penalties), which set the config keys of the same names,
and the stop flags (--stop, --ignore-eos, --min-tokens) of a generation's SamplingParams."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import tileinfer
from tileinfer.cli import _flag_sources, _load
from tileinfer.cli_args import build_parser, parse_args
from conftest import REFERENCE_CPU as BASE, run_cli as run


def test_version(capsys):
    assert run(capsys, "--version") == (0, f"tileinfer {tileinfer.__version__}\n", "")
    done = subprocess.run([sys.executable, "-m", "tileinfer.cli", "--version"], capture_output=True, text=True)
    assert (done.returncode, done.stdout) == (0, f"tileinfer {tileinfer.__version__}\n")


@pytest.mark.parametrize("command", ["generate", "chat", "serve", "config"])
def test_sampling_flags_set_their_config_keys(command):
    args = parse_args([command, "--temperature", "0.7", "--top-p", "0.9", "--top-k", "20", "--seed", "5",
                       "--max-new-tokens", "9", "--min-p", "0.05", "--repetition-penalty", "1.2",
                       "--presence-penalty", "0.5", "--frequency-penalty", "-0.5", "device=cpu"])
    config = _load(args, _flag_sources(args))
    assert (config.temperature, config.top_p, config.top_k, config.seed, config.max_new_tokens) == (0.7, 0.9, 20, 5, 9)
    assert (config.min_p, config.repetition_penalty, config.presence_penalty, config.frequency_penalty) == (
        0.05, 1.2, 0.5, -0.5)
    assert config.device == "cpu"
    aliases = parse_args([command, "--repeat-penalty", "1.1", "--max-tokens", "7"])  # llama.cpp's and vLLM's names
    assert (aliases.repetition_penalty, aliases.max_new_tokens) == (1.1, 7)


def test_the_stop_flags_are_the_generations_params(capsys, tiny_checkpoint):
    engine = tileinfer.Engine.from_config(model=str(tiny_checkpoint), progress=False, overrides=BASE)
    free = engine.generate([5, 6, 7], tileinfer.SamplingParams(max_tokens=12, ignore_eos=True))
    stop = free.text[3:6]
    expected = engine.generate([5, 6, 7], tileinfer.SamplingParams(max_tokens=12, stop=[stop, "never"],
                                                                   ignore_eos=True, min_tokens=2))
    assert expected.stats.finish_reason == "stop"  # so that the flags below change the result
    code, out, err = run(capsys, "generate", "--model", str(tiny_checkpoint), "--prompt-ids", "5,6,7", "--json",
                         "--max-new-tokens", "12", "--stop", stop, "--stop", "never", "--ignore-eos",
                         "--min-tokens", "2", *BASE)
    assert code == 0, err
    result = json.loads(out)
    assert (result["token_ids"], result["text"]) == (expected.token_ids, expected.text)
    assert result["stats"]["finish_reason"] == "stop" and result["stats"]["stop_reason"] == stop


def test_a_flag_wins_over_a_config_file(tmp_path):
    path = tmp_path / "warm.yaml"
    path.write_text("temperature: 0.2\ntop_k: 3\n")
    args = parse_args(["generate", "--config", str(path), "--temperature", "1.1"])
    config = _load(args, _flag_sources(args))
    assert (config.temperature, config.top_k) == (1.1, 3)


def test_generate_samples_with_the_flags(capsys, tiny_checkpoint):
    code, out, err = run(capsys, "generate", "--model", str(tiny_checkpoint), "--prompt-ids", "5,6,7", "--json",
                         "--max-new-tokens", "8", "--temperature", "1.3", "--top-p", "0.9", "--top-k", "50",
                         "--seed", "11", *BASE)
    assert code == 0, err
    engine = tileinfer.Engine.from_config(model=str(tiny_checkpoint), progress=False,
                                          overrides=[*BASE, "temperature=1.3", "top_p=0.9", "top_k=50", "seed=11"])
    assert json.loads(out)["token_ids"] == engine.generate([5, 6, 7], max_new_tokens=8).token_ids


@pytest.mark.parametrize("command", ["generate", "chat", "serve"])
@pytest.mark.parametrize("flag,item", [("--temperature=0.5", "temperature=0.7"), ("--top-p=0.5", "top_p=0.5"),
                                       ("--top-k=4", "top_k=4"), ("--seed=1", "seed=2"),
                                       ("--max-new-tokens=3", "max_new_tokens=4")])
def test_a_flag_and_its_key_together_are_a_one_line_usage_error(capsys, command, flag, item):
    code, out, err = run(capsys, command, flag, item, "--prompt", "x") if command == "generate" \
        else run(capsys, command, flag, item)
    key = item.partition("=")[0]
    assert code == 2 and out == ""
    assert err.startswith(f"error: {key} is given twice: use --{key.replace('_', '-')} VALUE or {key}=VALUE")
    assert err.count("\n") == 1


@pytest.mark.parametrize("argv,words", [(["generate", "--temperature", "warm"], "invalid float value"),
                                        (["generate", "--prompt", "x", "--min-tokens", "-1"], "min_tokens=-1"),
                                        (["generate", "--prompt", "x", "--stop", ""], "stop string must not be empty"),
                                        (["generate", "--top-k", "1.5"], "invalid int value"),
                                        (["generate", "--prompt", "x", "--temperature", "-1"], "temperature=-1.0"),
                                        (["serve", "--port", "70000"], "--port"),
                                        (["serve", "--queue", "-1"], "--queue")])
def test_bad_flag_values_are_one_line_errors(capsys, argv, words):
    code, out, err = run(capsys, *argv)
    assert code == 2 and out == "" and err.startswith("error: ") and err.count("\n") == 1 and words in err, err


def help_of(command: str) -> str:
    return " ".join(build_parser()._subparsers._group_actions[0].choices[command].format_help().split())


def test_help_names_the_flags_and_their_keys():
    for command in ("generate", "chat", "serve", "config"):
        text = help_of(command)
        for flag, key in [("--temperature", "temperature"), ("--top-p", "top_p"), ("--top-k", "top_k"),
                          ("--min-p", "min_p"), ("--repetition-penalty", "repetition_penalty"),
                          ("--presence-penalty", "presence_penalty"), ("--frequency-penalty", "frequency_penalty"),
                          ("--seed", "seed"), ("--max-new-tokens", "max_new_tokens")]:
            assert flag in text and f"config key {key}" in text
    for command in ("generate", "chat"):
        assert all(flag in help_of(command) for flag in ("--stop", "--ignore-eos", "--min-tokens"))
    assert "--stop" not in help_of("serve")  # a request's own field there
    assert "no stats line" in " ".join(build_parser().format_help().split())  # what -q leaves out
    assert "--version" in build_parser().format_help()


def test_help_says_where_the_sampling_defaults_come_from():
    for command in ("generate", "chat", "serve", "config"):
        # temperature, top-p, top-k, min-p, repetition penalty
        assert help_of(command).count("default: the checkpoint's generation_config.json") == 5
    serve = help_of("serve")
    assert "penalties and logprobs per request" in serve


def test_a_flag_wins_over_the_checkpoints_generation_config(tmp_path, tiny_checkpoint):
    import shutil

    folder = tmp_path / "model"
    shutil.copytree(tiny_checkpoint, folder)
    (folder / "generation_config.json").write_text(json.dumps({"do_sample": True, "temperature": 0.6, "top_k": 20}))
    args = parse_args(["generate", "--model", str(folder), "--temperature", "0", *BASE])
    config = tileinfer.resolve_config(_load(args, _flag_sources(args)))
    assert (config.temperature, config.top_k, config.top_p) == (0.0, 20, 1.0)
