"""pluggy hook specifications: how a plugin, built in or third-party, adds implementations.

A plugin is a module (or object) with functions marked ``@tileinfer.hookimpl``. Third-party
packages expose theirs through the entry-point group ``tileinfer``::

    [project.entry-points.tileinfer]
    my_kernels = "my_kernels.plugin"
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

import pluggy

PROJECT = "tileinfer"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)

KINDS = ("linear", "attention", "kv_store", "sampler", "proposer", "forward")
RESERVED_NAMES = ("auto", "none")  # config values: choose by device, and (proposer) no speculation


@dataclass(frozen=True)
class Implementation:
    """A named implementation of one interface.

    ``kind`` is one of ``KINDS`` (the config key that selects it); ``factory`` is the class, or a
    ``"module:attr"`` string imported only when the implementation is selected (so that listing
    plugins does not import Triton).

    ``auto`` lists the device types (``"cpu"``, ``"cuda"``) on which the config value ``auto``
    may choose it; among those that can run (no ``incompatibilities``), ``auto`` takes the highest
    ``priority``.
    """

    kind: str
    name: str
    factory: Union[type, str]
    summary: str = ""
    auto: tuple[str, ...] = ()
    priority: int = 0

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown interface kind {self.kind!r}; valid: {', '.join(KINDS)}")
        if not self.name.isidentifier() or self.name in RESERVED_NAMES:
            raise ValueError(f"implementation name {self.name!r} must be an identifier other than "
                             f"{' and '.join(map(repr, RESERVED_NAMES))}")


class HookSpecs:
    @hookspec
    def tileinfer_implementations(self) -> list[Implementation]:
        """Return the implementations this plugin provides (all plugins are called)."""
