"""The README's commands work as pasted: every ``tileinfer`` and ``python -m bench`` command line
it shows parses (the cheap ones run), each documented command answers ``--help``, the extras it
installs exist; and the plugin example it points to (docs/plugins.md), laid out as its file labels
say and installed, registers through the entry-point group and is selected by ``sampler=argmin``."""

from __future__ import annotations

import json
import re
import shlex
import sys
import tomllib
from pathlib import Path

import pytest

from tileinfer.cli import main
from tileinfer.cli_args import parse_args

from conftest import run_cli

ROOT = Path(__file__).parents[1]
README = (ROOT / "README.md").read_text()
PLUGINS_DOC = (ROOT / "docs" / "plugins.md").read_text()


def _split(lines: list[str]) -> list[list[str]]:
    return [words for words in (shlex.split(line, comments=True) for line in lines) if words]


def _block_lines(text: str) -> list[list[str]]:
    """Each line of the ``sh`` blocks of ``text`` (continuations joined), split as the shell does."""
    return _split([line for block in re.findall(r"```sh\n(.*?)```", text, flags=re.S)
                   for line in block.replace("\\\n", " ").splitlines()])


def _inline_commands(text: str) -> list[list[str]]:
    """Each inline code span of ``text`` that starts like a command."""
    return _split(re.findall(r"`((?:tileinfer|python -m bench|pip install) [^`]*)`", text))


# Command lines, and all commands: a span of two words (``tileinfer quantize``) names a command.
LINES = _block_lines(README) + [words for words in _inline_commands(README) if len(words) > 2]
COMMANDS = _block_lines(README) + _inline_commands(README)


def test_the_readme_shows_the_commands():
    shown = {tuple(words[:2]) for words in COMMANDS}
    assert {("tileinfer", "generate"), ("tileinfer", "serve"), ("tileinfer", "quantize"), ("python", "-m"),
            ("pip", "install")} <= shown


@pytest.mark.parametrize("words", [w for w in LINES if w[0] == "tileinfer"], ids=shlex.join)
def test_each_tileinfer_command_parses(words, capsys):
    """Parsed as ``main`` parses them (a bad flag exits); ``plugins`` and ``config`` run."""
    args = parse_args(words[1:])
    if args.command in ("plugins", "config"):
        code, out, err = run_cli(capsys, *words[1:])
        assert code == 0 and out, err


@pytest.mark.parametrize("command", sorted({w[1] for w in COMMANDS if w[0] == "tileinfer" and len(w) > 1}))
def test_each_documented_tileinfer_command_has_help(command, capsys):
    with pytest.raises(SystemExit) as exit_:
        main([command, "--help"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: tileinfer {command}")


@pytest.mark.parametrize("words", [w for w in COMMANDS if w[:3] == ["python", "-m", "bench"]], ids=shlex.join)
def test_each_bench_command_answers_help(words, monkeypatch, capsys):
    """From the repository root (``python -m bench`` runs there): the command, or ``--help`` of
    the one it names."""
    from bench.__main__ import main as bench_main

    monkeypatch.chdir(ROOT)
    argv = words[3:] if "--help" in words else [*words[3:], "--help"]
    with pytest.raises(SystemExit) as exit_:
        bench_main(argv)
    assert exit_.value.code == 0
    assert capsys.readouterr().out.startswith("usage: python -m bench")


def test_the_extras_the_readme_installs_exist():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    named = [m for words in COMMANDS if words[:2] == ["pip", "install"] for w in words
             for m in re.findall(r"\[([\w,]+)\]", w)]
    assert named
    for group in named:
        assert set(group.split(",")) <= set(extras), group


# -- the plugin example of docs/plugins.md -------------------------------------------------------------


def _write_plugin_example(project_parent: Path) -> Path:
    """The files of docs/plugins.md's example, each where its first-line label puts it, and the
    empty ``__init__.py`` its text names: the project folder (the one ``pip install`` is given)."""
    labelled = re.findall(r"```(?:python|toml)\n# (\S+)\n(.*?)```", PLUGINS_DOC, flags=re.S)
    assert len(labelled) >= 2
    for label, body in labelled:
        (project_parent / label).parent.mkdir(parents=True, exist_ok=True)
        (project_parent / label).write_text(f"# {label}\n{body}")
    [init] = re.findall(r"`(\S+/__init__\.py)` \(empty\)", PLUGINS_DOC)
    (project_parent / init).parent.mkdir(parents=True, exist_ok=True)
    (project_parent / init).write_text("")
    [project] = {(project_parent / label).parent for label, _ in labelled if label.endswith("pyproject.toml")}
    return project


def _install(project: Path, site: Path) -> str:
    """What ``pip install PROJECT`` puts in ``site`` for a setuptools project with a ``packages``
    list and no package-dir: each package's folder, and a dist-info with the entry points."""
    meta = tomllib.loads((project / "pyproject.toml").read_text())
    name, version = meta["project"]["name"], meta["project"]["version"]
    for package in meta["tool"]["setuptools"]["packages"]:
        source = project / package.replace(".", "/")
        for path in source.glob("*.py"):
            (site / package.replace(".", "/")).mkdir(parents=True, exist_ok=True)
            (site / package.replace(".", "/") / path.name).write_bytes(path.read_bytes())
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    groups = meta["project"]["entry-points"]
    (info / "entry_points.txt").write_text("".join(
        f"[{group}]\n" + "".join(f"{key} = {value}\n" for key, value in points.items()) for group, points in groups.items()))
    return name


def test_the_plugin_example_works_as_pasted(tmp_path, tiny_checkpoint, monkeypatch, capsys):
    project = _write_plugin_example(tmp_path / "pasted")
    site = tmp_path / "site"
    distribution = _install(project, site)
    monkeypatch.syspath_prepend(str(site))
    try:
        code, out, err = run_cli(capsys, "plugins", "--json")
        assert code == 0, err
        rows = {(r["interface"], r["name"]): r for r in json.loads(out)["implementations"]}
        assert ("sampler", "argmin") in rows, json.loads(out)["failures"]
        assert rows[("sampler", "argmin")]["distribution"] == distribution
        base = ["generate", "--model", str(tiny_checkpoint), "--prompt-ids", "4,9,16,25", "--max-new-tokens", "4",
                "--json", "--config", "reference", "device=cpu", "dtype=float32"]
        code, greedy, err = run_cli(capsys, *base)
        assert code == 0, err
        code, argmin, err = run_cli(capsys, *base, "sampler=argmin")
        assert code == 0, err
        assert json.loads(argmin)["token_ids"] != json.loads(greedy)["token_ids"]
        [(setting, message)] = re.findall(r"`(options\.argmin\.rank=-1)` is `(error: [^`]*)`", PLUGINS_DOC)
        code, _, err = run_cli(capsys, "config", "sampler=argmin", setting)
        assert code == 2 and err == message + "\n"
    finally:
        for name in [n for n in sys.modules if n.split(".")[0] in {p.name for p in site.iterdir()}]:
            del sys.modules[name]
