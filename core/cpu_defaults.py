"""On a CPU, the GPU-only settings default to off.

``cuda_graphs`` and ``pipelined`` are on in default.yaml, for a GPU. On a CPU they have no effect,
and the engine says so in a notice; so that the notice comes only when a user asked for them,
``load_for_device`` merges ``CPU_DEFAULTS`` right above default.yaml when the config's device
resolves to the CPU: a config file, a mapping or ``KEY=VALUE`` that sets them still wins.
"""

from __future__ import annotations

from collections.abc import Sequence

from tileinfer.config import Config, ConfigSource, load_config
from tileinfer.resolution import resolve_device

CPU_DEFAULTS = {"cuda_graphs": False, "pipelined": False}


def load_for_device(sources: Sequence[ConfigSource] = (), overrides: Sequence[str] = ()) -> Config:
    """``load_config(sources, overrides)``, with ``CPU_DEFAULTS`` under ``sources`` when its device
    is (or ``auto`` resolves to) the CPU."""
    config = load_config(sources, overrides)  # checks the kinds of sources and overrides too
    if config.device != "cuda" and resolve_device(config.device).type == "cpu":
        config = load_config([CPU_DEFAULTS, *sources], overrides)
    return config


__all__ = ["CPU_DEFAULTS", "load_for_device"]
