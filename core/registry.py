"""The registry: every named implementation, from the built-in plugins and the entry-point group.

``build_registry()`` makes a pluggy plugin manager, registers the built-in plugins of
``tileinfer.plugins`` and the third-party ones of the entry-point group ``tileinfer``, and
collects what each one's ``tileinfer_implementations`` hook returns, remembering who provided it.
A third-party plugin that fails to import or to list its implementations is recorded in
``Registry.failures`` (named with its distribution) instead of breaking every command.
"""

from __future__ import annotations

import importlib
import importlib.metadata
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

    @property
    def origin(self) -> str:
        return f"plugin {self.plugin} ({self.distribution})"


class Registry:
    """Named implementations per interface kind; ``get(kind, name)`` returns the class."""

    def __init__(self, entries: list[Registered], failures: list[str] | None = None) -> None:
        self.failures = list(failures or [])
        self._entries: dict[str, dict[str, Registered]] = {kind: {} for kind in KINDS}
        for entry in entries:
            impl = entry.implementation
            taken = self._entries[impl.kind].get(impl.name)
            if taken is not None:
                raise PluginError(f"{impl.kind} implementation {impl.name!r} is registered twice: by "
                                  f"{taken.origin} and by {entry.origin}")
            self._entries[impl.kind][impl.name] = entry

    def names(self, kind: str) -> list[str]:
        return sorted(self._entries[kind])

    def entries(self, kind: str) -> list[Registered]:
        return [self._entries[kind][name] for name in self.names(kind)]

    def entry(self, kind: str, name: str) -> Registered:
        """The registration of ``name``; a ConfigError listing the valid names (and the plugins
        that failed to load) when there is none."""
        if kind not in self._entries:
            raise ConfigError(f"unknown interface {kind!r}; valid: {', '.join(KINDS)}")
        entry = self._entries[kind].get(name)
        if entry is None:
            special = [n for n in ("auto", "none") if n == "none" and kind == "proposer" or n == "auto" and
                       any(e.implementation.auto for e in self.entries(kind))]
            failed = f" (plugins that failed to load: {'; '.join(self.failures)})" if self.failures else ""
            raise ConfigError(f"{kind}={name}: no plugin registered that name; valid: "
                              f"{', '.join(special + self.names(kind))}{failed}")
        return entry

    def get(self, kind: str, name: str) -> type:
        """The class registered as ``name`` for ``kind`` (imported now if registered as a string)."""
        entry = self.entry(kind, name)
        factory = entry.implementation.factory
        if isinstance(factory, str):
            module, _, attr = factory.partition(":")
            try:
                factory = getattr(importlib.import_module(module), attr)
            except (ImportError, AttributeError) as exc:
                raise PluginError(f"{kind}={name} ({entry.origin}): cannot import "
                                  f"{entry.implementation.factory}: {exc}") from exc
        interface = _interface(kind)
        if not (isinstance(factory, type) and issubclass(factory, interface)):
            raise PluginError(f"{kind}={name} ({entry.origin}) is {factory!r}, not a subclass of {interface.__name__}")
        return factory

    def auto_candidates(self, kind: str, device_type: str) -> list[Registered]:
        """The implementations ``auto`` may choose on ``device_type``, highest priority first."""
        found = [e for e in self.entries(kind) if device_type in e.implementation.auto]
        return sorted(found, key=lambda e: -e.implementation.priority)


def _interface(kind: str) -> type:
    from tileinfer import interfaces

    return {
        "linear": interfaces.Linear,
        "attention": interfaces.Attention,
        "kv_store": interfaces.KVStore,
        "sampler": interfaces.Sampler,
        "proposer": interfaces.Proposer,
        "forward": interfaces.ForwardPass,
    }[kind]


BUILTIN_PLUGINS = ("tileinfer.plugins.reference", "tileinfer.plugins.paged_kv", "tileinfer.plugins.ngram",
                   "tileinfer.plugins.triton", "tileinfer.plugins.draft", "tileinfer.plugins.dflash",
                   "tileinfer.plugins.per_op", "tileinfer.plugins.persistent")


def plugin_manager(entry_points: bool = True, failures: list[str] | None = None) -> pluggy.PluginManager:
    """A plugin manager with the hook specifications, the built-in plugins and, unless
    ``entry_points`` is False, every plugin of the entry-point group ``tileinfer``. A third-party
    plugin that cannot be imported or registered is skipped and described in ``failures`` (raised
    as a PluginError when ``failures`` is None)."""
    pm = pluggy.PluginManager(PROJECT)
    pm.add_hookspecs(HookSpecs)
    for module in BUILTIN_PLUGINS:
        pm.register(importlib.import_module(module), name=module)
    if entry_points:
        for ep in importlib.metadata.entry_points(group=PROJECT):
            if pm.get_plugin(ep.name) is not None or pm.is_blocked(ep.name):
                continue
            try:
                pm.register(ep.load(), name=ep.name)
            except Exception as exc:  # noqa: BLE001 - one broken package must not break the others
                first = (str(exc).splitlines() or [""])[0]
                message = f"plugin {ep.name} ({_distribution(ep)}): {type(exc).__name__}: {first}"
                if failures is None:
                    raise PluginError(message) from exc
                failures.append(message)
    pm.check_pending()
    return pm


def _distribution(ep: importlib.metadata.EntryPoint) -> str:
    return ep.dist.metadata["name"] if ep.dist is not None else "unknown distribution"


def _distributions(pm: pluggy.PluginManager) -> dict[int, str]:
    """Distribution name of each registered entry-point plugin, by the plugin object's id."""
    names = {}
    for ep in importlib.metadata.entry_points(group=PROJECT):
        plugin = pm.get_plugin(ep.name)
        if plugin is not None:
            names[id(plugin)] = _distribution(ep)
    return names


def build_registry(pm: pluggy.PluginManager | None = None) -> Registry:
    """Collect every plugin's implementations into a Registry; a plugin whose hook fails or
    returns something other than a list of Implementations is recorded in ``failures``."""
    failures: list[str] = []
    pm = pm or plugin_manager(failures=failures)
    dists = _distributions(pm)
    entries = []
    for hook in pm.hook.tileinfer_implementations.get_hookimpls():
        where = f"plugin {hook.plugin_name} ({dists.get(id(hook.plugin), 'tileinfer (built in)')})"
        try:
            provided = hook.function()
        except Exception as exc:  # noqa: BLE001
            failures.append(f"{where}: tileinfer_implementations() raised {type(exc).__name__}: {exc}")
            continue
        if not isinstance(provided, (list, tuple)):
            failures.append(f"{where}: tileinfer_implementations() returned {type(provided).__name__}, "
                            "not a list of tileinfer.Implementation")
            continue
        bad = [impl for impl in provided if not isinstance(impl, Implementation)]
        if bad:
            failures.append(f"{where}: tileinfer_implementations() returned {bad[0]!r}, not a tileinfer.Implementation")
            continue
        entries.extend(Registered(impl, hook.plugin_name, dists.get(id(hook.plugin), "tileinfer (built in)"))
                       for impl in provided)
    return Registry(entries, failures)


__all__ = ["BUILTIN_PLUGINS", "Registered", "Registry", "build_registry", "plugin_manager"]
