"""The registry: every named implementation, from the built-in plugins and the entry-point group.

``build_registry()`` makes a pluggy plugin manager, registers the built-in plugins of
``tileinfer.plugins`` and the third-party ones of the entry-point group ``tileinfer``, and
collects what each one's ``tileinfer_implementations`` hook returns, remembering who provided it.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

import pluggy

from tileinfer.errors import ConfigError, PluginError
from tileinfer.hookspecs import KINDS, PROJECT, HookSpecs, Implementation


@dataclass(frozen=True)
class Registered:
    """An implementation and where it came from: the plugin's name and its distribution."""

    implementation: Implementation
    plugin: str
    distribution: str


class Registry:
    """Named implementations per interface kind; ``get(kind, name)`` returns the class."""

    def __init__(self, entries: list[Registered]) -> None:
        self._entries: dict[str, dict[str, Registered]] = {kind: {} for kind in KINDS}
        for entry in entries:
            impl = entry.implementation
            taken = self._entries[impl.kind].get(impl.name)
            if taken is not None:
                raise PluginError(
                    f"{impl.kind} implementation {impl.name!r} is registered twice: by plugin "
                    f"{taken.plugin} ({taken.distribution}) and by plugin {entry.plugin} ({entry.distribution})"
                )
            self._entries[impl.kind][impl.name] = entry

    def names(self, kind: str) -> list[str]:
        return sorted(self._entries[kind])

    def entries(self, kind: str) -> list[Registered]:
        return [self._entries[kind][name] for name in self.names(kind)]

    def get(self, kind: str, name: str) -> type:
        """The class registered as ``name`` for ``kind``; a clear error listing the valid names."""
        if kind not in self._entries:
            raise ConfigError(f"unknown interface {kind!r}; valid: {', '.join(KINDS)}")
        entry = self._entries[kind].get(name)
        if entry is None:
            valid = ", ".join(self.names(kind) + (["none"] if kind == "proposer" else []))
            raise ConfigError(f"{kind}={name}: no plugin registered that name; valid: {valid}")
        factory = entry.implementation.factory
        if isinstance(factory, str):
            module, _, attr = factory.partition(":")
            try:
                factory = getattr(importlib.import_module(module), attr)
            except (ImportError, AttributeError) as exc:
                raise PluginError(
                    f"{kind}={name} (plugin {entry.plugin}): cannot import {entry.implementation.factory}: {exc}"
                ) from exc
        interface = _interface(kind)
        if not (isinstance(factory, type) and issubclass(factory, interface)):
            raise PluginError(
                f"{kind}={name} (plugin {entry.plugin}) is {factory!r}, not a subclass of {interface.__name__}"
            )
        return factory


def _interface(kind: str) -> type:
    from tileinfer import interfaces

    return {
        "linear": interfaces.Linear,
        "attention": interfaces.Attention,
        "kv_store": interfaces.KVStore,
        "sampler": interfaces.Sampler,
        "proposer": interfaces.Proposer,
    }[kind]


BUILTIN_PLUGINS = ("tileinfer.plugins.reference", "tileinfer.plugins.paged_kv", "tileinfer.plugins.ngram",
                   "tileinfer.plugins.triton")


def plugin_manager(entry_points: bool = True) -> pluggy.PluginManager:
    """A plugin manager with the hook specifications, the built-in plugins and, unless
    ``entry_points`` is False, every plugin of the entry-point group ``tileinfer``."""
    pm = pluggy.PluginManager(PROJECT)
    pm.add_hookspecs(HookSpecs)
    for module in BUILTIN_PLUGINS:
        pm.register(importlib.import_module(module), name=module)
    if entry_points:
        try:
            pm.load_setuptools_entrypoints(PROJECT)
        except Exception as exc:  # a broken third-party package must say which one it is
            raise PluginError(f"loading the plugins of entry-point group {PROJECT!r} failed: {exc}") from exc
    pm.check_pending()
    return pm


def build_registry(pm: pluggy.PluginManager | None = None) -> Registry:
    """Collect every plugin's implementations into a Registry."""
    pm = pm or plugin_manager()
    dists = {id(plugin): dist.metadata["name"] for plugin, dist in pm.list_plugin_distinfo()}
    entries = []
    for hook in pm.hook.tileinfer_implementations.get_hookimpls():
        distribution = dists.get(id(hook.plugin), "tileinfer (built in)")
        try:
            provided = hook.function() or []
        except Exception as exc:
            raise PluginError(f"plugin {hook.plugin_name} failed to list its implementations: {exc}") from exc
        for impl in provided:
            if not isinstance(impl, Implementation):
                raise PluginError(f"plugin {hook.plugin_name} returned {impl!r}, not an Implementation")
            entries.append(Registered(impl, hook.plugin_name, distribution))
    return Registry(entries)


__all__ = ["BUILTIN_PLUGINS", "Registered", "Registry", "build_registry", "plugin_manager"]
