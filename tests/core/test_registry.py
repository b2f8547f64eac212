"""Plugins: built-ins register through the same hook as third-party packages; duplicates and
unknown names are clear errors; an entry-point package adds a Sampler selected by config."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import tileinfer
from tileinfer.errors import ConfigError, PluginError
from tileinfer.interfaces import Sampler, Step
from tileinfer.registry import build_registry, plugin_manager
from conftest import run_cli

DEMO = Path(__file__).parents[1] / "third_party" / "tileinfer_demo_sampler"


def test_builtin_implementations_are_found_by_name():
    registry = build_registry(plugin_manager(entry_points=False))
    from tileinfer.plugins.reference.sampler import ReferenceSampler

    assert registry.get("sampler", "reference") is ReferenceSampler
    assert registry.names("kv_store") == ["paged", "paged_int8"]


def test_unknown_name_lists_the_valid_ones():
    registry = build_registry(plugin_manager(entry_points=False))
    with pytest.raises(ConfigError, match="kv_store=fp8: no plugin registered that name; valid: paged, paged_int8"):
        registry.get("kv_store", "fp8")


class _Plugin:
    """A plugin object whose hook returns ``result``."""

    def __init__(self, result) -> None:
        self.result = result

    @tileinfer.hookimpl
    def tileinfer_implementations(self):
        return self.result


def _manager(**plugins):
    """The built-in plugins and ``plugins``, each registered under its keyword; no entry points."""
    pm = plugin_manager(entry_points=False)
    for name, plugin in plugins.items():
        pm.register(plugin, name=name)
    return pm


def test_two_plugins_registering_one_name_is_an_error_naming_both():
    twin = _Plugin([tileinfer.Implementation("sampler", "reference",  # named like the built-in one
                                             "tileinfer.plugins.reference.sampler:ReferenceSampler")])
    with pytest.raises(PluginError) as err:
        build_registry(_manager(my_twin_plugin=twin))
    message = str(err.value)
    assert "sampler implementation 'reference' is registered twice" in message
    assert "tileinfer.plugins.reference" in message and "my_twin_plugin" in message


class _Raises:
    @tileinfer.hookimpl
    def tileinfer_implementations(self):
        raise RuntimeError("no GPU driver")


def test_a_plugin_whose_hook_fails_is_named_and_the_others_still_load():
    not_a_list = _Plugin(tileinfer.Implementation("sampler", "lonely", "x:Y"))
    registry = build_registry(_manager(not_a_list_plugin=not_a_list, raising_plugin=_Raises()))
    assert registry.names("sampler") == ["reference"] and registry.names("linear") == ["reference", "triton"]
    assert len(registry.failures) == 2
    assert any("plugin not_a_list_plugin" in f and "returned Implementation, not a list" in f for f in registry.failures)
    assert any("plugin raising_plugin" in f and "RuntimeError: no GPU driver" in f for f in registry.failures)
    with pytest.raises(ConfigError, match="sampler=lonely: .*plugins that failed to load: .*not_a_list_plugin"):
        registry.get("sampler", "lonely")


def test_the_forward_pass_is_a_kind_like_the_others(tiny_checkpoint):
    """``forward`` (how a forward pass of T tokens runs) names a registered ForwardPass; per_op and
    persistent are built in, per_op is the default."""
    from tileinfer.config import load_config
    from tileinfer.interfaces import ForwardPass
    from tileinfer.plugins.per_op import PerOpForward

    registry = build_registry(plugin_manager(entry_points=False))
    assert registry.names("forward") == ["per_op", "persistent"]
    assert registry.get("forward", "per_op") is PerOpForward
    assert registry.entry("forward", "per_op").plugin == "tileinfer.plugins.per_op"
    assert issubclass(PerOpForward, ForwardPass) and load_config().forward == "per_op"
    with pytest.raises(ConfigError, match="forward=fused: no plugin registered that name; valid: per_op, persistent$"):
        registry.get("forward", "fused")
    with pytest.raises(ConfigError, match="forward=fused: no plugin registered that name"):
        tileinfer.Engine.from_config("reference", model=str(tiny_checkpoint), device="cpu", forward="fused",
                                     progress=False)
    disguised = _Plugin([tileinfer.Implementation("forward", "sampler_in_disguise",
                                                  "tileinfer.plugins.reference.sampler:ReferenceSampler")])
    with pytest.raises(PluginError, match="forward=sampler_in_disguise .* not a subclass of ForwardPass"):
        build_registry(_manager(not_a_forward_plugin=disguised)).get("forward", "sampler_in_disguise")


def test_auto_and_none_are_not_implementation_names():
    for name in ("auto", "none"):
        with pytest.raises(ValueError, match="other than 'auto' and 'none'"):
            tileinfer.Implementation("linear", name, "x:Y")


def test_an_implementation_that_cannot_be_imported_is_reported_when_selected():
    broken = _Plugin([tileinfer.Implementation("linear", "broken", "no_such_module_anywhere:Linear")])
    registry = build_registry(_manager(broken_plugin=broken))
    assert "broken" in registry.names("linear")  # listing does not import it
    with pytest.raises(PluginError, match="linear=broken \\(plugin broken_plugin \\(tileinfer \\(built in\\)\\)\\): cannot import"):
        registry.get("linear", "broken")


@pytest.fixture(scope="module")
def demo_site(tmp_path_factory):
    """The demo package installed by pip into a folder of its own (not into the test environment)."""
    target = tmp_path_factory.mktemp("site")
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                    "--target", str(target), str(DEMO)], check=True, capture_output=True)
    return target


def _cli(capsys, monkeypatch, site: Path, *argvs: list[str]) -> list[tuple[int, str, str]]:
    """``tileinfer ARGV`` for each of ``argvs`` in this process (exit status, stdout, stderr), with
    ``site`` first on sys.path for these calls only, as PYTHONPATH would put it; the modules imported
    from there are forgotten after."""
    with monkeypatch.context() as m:
        m.syspath_prepend(str(site))
        try:
            return [run_cli(capsys, *argv) for argv in argvs]
        finally:
            for name in [n for n in sys.modules if n.split(".")[0] in {p.stem for p in site.iterdir()}]:
                del sys.modules[name]


def test_third_party_sampler_registers_through_the_entry_point_group(demo_site, tiny_checkpoint, capsys, monkeypatch):
    prompt = [4, 9, 16, 25]
    generate = ["generate", "--model", str(tiny_checkpoint), "--prompt-ids", ",".join(map(str, prompt)), "--json",
                "device=cpu", "dtype=float32", "sampler=argmin"]
    listed, run, ranked, bad = _cli(capsys, monkeypatch, demo_site, ["plugins", "--json"],
                                    [*generate, "--max-new-tokens", "6"],
                                    [*generate, "--max-new-tokens", "1", "options.argmin.rank=1"],
                                    ["config", "sampler=argmin", "options.argmin.rank=-1"])
    assert listed[0] == 0, listed[2]
    rows = {(r["interface"], r["name"]): r for r in json.loads(listed[1])["implementations"]}
    assert rows[("sampler", "argmin")]["distribution"] == "tileinfer-demo-sampler"
    assert rows[("sampler", "argmin")]["plugin"] == "demo_sampler"

    assert run[0] == 0, run[2]
    tokens = json.loads(run[1])["token_ids"]

    # Each token must be the argmin of the target's logits after the tokens before it.
    engine = tileinfer.Engine.from_config("reference", model=str(tiny_checkpoint), device="cpu", dtype="float32", progress=False)
    sequence = prompt + tokens
    engine.kv.reset()
    engine.kv.reserve(len(sequence))
    with torch.inference_mode():
        logits, _ = engine.model.forward(torch.tensor(sequence), Step.at(0, len(sequence), engine.device), engine.kv)
    expected = logits[len(prompt) - 1: -1].argmin(-1).tolist()
    assert tokens == expected
    assert tokens != engine.generate(prompt, max_new_tokens=6).token_ids  # not the greedy result

    assert ranked[0] == 0, ranked[2]
    assert json.loads(ranked[1])["token_ids"] == [int(logits[len(prompt) - 1].argsort()[1])]
    assert bad[0] == 2 and bad[2] == "error: options.argmin.rank=-1 is not valid: must be >= 0\n"


def _readme_block(language: str, first_line: str) -> str:
    text = (Path(__file__).parents[2] / "docs" / "plugins.md").read_text()
    for block in text.split("```" + language + "\n")[1:]:
        block = block.split("```")[0]
        if block.startswith(first_line):
            return block
    raise AssertionError(f"no {language} block starting with {first_line!r} in docs/plugins.md")


def test_the_readme_plugin_example_is_the_tested_package():
    """The plugin example of docs/plugins.md is the demo package these tests install, file for
    file, so it works when pasted."""
    plugin = (DEMO / "tileinfer_demo_sampler" / "plugin.py").read_text()
    assert _readme_block("python", "# my_sampler/my_sampler/plugin.py\n") == "# my_sampler/my_sampler/plugin.py\n" + plugin
    pyproject = (DEMO / "pyproject.toml").read_text()
    expected = pyproject.replace("tileinfer-demo-sampler", "my-sampler").replace("tileinfer_demo_sampler", "my_sampler")
    assert _readme_block("toml", "# my_sampler/pyproject.toml\n") == "# my_sampler/pyproject.toml\n" + expected


class _StubSampler(Sampler):
    def probs(self, logits):
        ...

    def sample(self, logits, *, return_probs=False):
        ...


def test_a_sampler_that_returns_no_sample_is_named_in_the_error(tiny_checkpoint):
    stub = _Plugin([tileinfer.Implementation("sampler", "stub", _StubSampler)])
    registry = build_registry(_manager(stub_plugin=stub))
    engine = tileinfer.Engine.from_config("reference", model=str(tiny_checkpoint), device="cpu", sampler="stub",
                                          registry=registry, progress=False)
    with pytest.raises(PluginError, match="sampler=stub \\(plugin stub_plugin .*\\): sample\\(\\) returned None"):
        engine.generate([1, 2, 3], max_new_tokens=2)


def test_without_the_package_the_name_is_unknown(tiny_checkpoint):
    with pytest.raises(ConfigError, match="sampler=argmin"):
        tileinfer.Engine.from_config("reference", model=str(tiny_checkpoint), device="cpu", sampler="argmin", progress=False)



def test_a_package_that_fails_to_import_is_named_and_every_command_still_works(tmp_path, tiny_checkpoint, capsys,
                                                                               monkeypatch):
    """An installed entry point whose module raises on import: ``tileinfer plugins`` lists the rest
    and shows the failure with the plugin and its distribution; generate still runs."""
    site = tmp_path / "site"
    dist = site / "broken_tileinfer_plugin-1.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-tileinfer-plugin\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[tileinfer]\nbroken = broken_tileinfer_plugin\n")
    (site / "broken_tileinfer_plugin.py").write_text("raise ImportError('needs libfoo.so')\n")
    listed, run = _cli(capsys, monkeypatch, site, ["plugins"],
                       ["generate", "--model", str(tiny_checkpoint), "--prompt-ids", "1,2,3", "--max-new-tokens", "2",
                        "--json", "device=cpu", "dtype=float32"])
    assert listed[0] == 0, listed[2]
    assert "reference" in listed[1]
    assert ("failed to load: plugin broken (broken-tileinfer-plugin): ImportError: needs libfoo.so"
            in listed[1])
    assert run[0] == 0, run[2]
    assert len(json.loads(run[1])["token_ids"]) == 2
