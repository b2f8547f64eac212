"""bench/workloads.py's variants: each variant is the default config with exactly the keys its items set (an
option counts as set only where it differs from the default its implementation declares), and
either resolves here or says, in a ConfigError, which of its keys does not."""

from __future__ import annotations

import dataclasses
import functools

import pytest
from omegaconf import OmegaConf

from bench import workloads as variants
from tileinfer.config import Config, load_config, resolve_config, shipped_config_path
from tileinfer.errors import ConfigError
from tileinfer.hookspecs import KINDS
from tileinfer.registry import build_registry


@functools.cache
def declared_defaults() -> dict:
    """``options.NAME.KEY`` -> the default of every option a registered implementation declares."""
    registry = build_registry()
    return {f"options.{name}.{option.name}": option.default for kind in KINDS for name in registry.names(kind)
            for option in getattr(registry.get(kind, name), "declared_options", ())}


def flat(config: Config) -> dict:
    """KEY -> value, the options as ``options.NAME.KEY`` (declared defaults where not set)."""
    values = dataclasses.asdict(config)
    options = values.pop("options")
    return {**declared_defaults(), **values,
            **{f"options.{n}.{k}": v for n, kv in options.items() for k, v in kv.items()}}


def keys_set(items: list[str]) -> set[str]:
    """The keys a variant's items set: each override's KEY, and every key of each shipped config."""
    sources, overrides = variants.split(items)
    keys = {o.split("=", 1)[0] for o in overrides}
    for source in sources:
        loaded = OmegaConf.to_container(OmegaConf.load(shipped_config_path(source)))
        keys |= {f"options.{n}.{k}" for n, kv in loaded.pop("options", {}).items() for k in kv} | set(loaded)
    return keys


def test_every_item_names_a_shipped_config_or_a_known_key():
    """A misspelt key would make the matrix skip its variant with a reason, not fail: caught here."""
    fields = {f.name for f in dataclasses.fields(Config)}
    for name, items in variants.VARIANTS.items():
        sources, overrides = variants.split(items)
        assert all(shipped_config_path(s).is_file() for s in sources), (name, sources)
        for item in overrides:
            key = item.split("=", 1)[0]
            assert key in fields or key in declared_defaults(), (name, item)
            assert not key.startswith("options.") or key.startswith("options.triton."), (name, item)


def test_the_default_variant_is_the_default_config():
    assert variants.load("default") == load_config()
    assert variants.resolve("default", ["device=cpu"]) == resolve_config(load_config(overrides=["device=cpu"]))


@pytest.mark.parametrize("name", [n for n in variants.VARIANTS if n != "default"])
def test_every_variant_loads_or_says_why(name):
    items = variants.VARIANTS[name]
    keys = keys_set(items)
    sources, _ = variants.split(items)
    default = flat(load_config())
    try:
        loaded = flat(variants.load(name))
    except ConfigError as exc:  # e.g. a shipped config or an option this engine does not have
        assert any(k in str(exc) for k in [*keys, *sources]), f"{name}: {exc}"
        return
    changed = {k for k in default.keys() | loaded.keys() if default.get(k) != loaded.get(k)}
    assert changed == keys, f"{name} sets {sorted(keys)} but changes {sorted(changed)}"
    try:
        variants.resolve(name, ["device=cpu"])
    except ConfigError as exc:  # it cannot run here, or an option does not validate: the message names the key
        assert any(k in str(exc) for k in keys), f"{name}: {exc}"
