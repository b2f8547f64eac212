"""A checkpoint's sampling defaults: its generation_config.json, read as transformers reads it.

The config keys ``temperature``, ``top_k``, ``top_p``, ``min_p`` and ``repetition_penalty`` are
``null`` in default.yaml: ``resolve_config`` fills each one still null from the model folder's
generation_config.json, else with the value that turns it off. So the precedence, lowest first, is:
the built-in "off" values, generation_config.json, ``--config`` files, the sampling flags and
``KEY=VALUE``, and then a generation's own ``SamplingParams`` (a server request's fields).

As in transformers: ``do_sample`` false or absent is greedy (temperature 0; top-k, top-p and
min-p have no effect and read as off), and the repetition penalty applies either way; with
``do_sample: true`` an absent temperature is 1.0 and an absent ``top_k`` is 50, transformers'
defaults, while a null one is off.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tileinfer.config import check_sampling
from tileinfer.errors import CheckpointError, ConfigError
from tileinfer.model_config import read_json

KEYS = ("temperature", "top_k", "top_p", "min_p", "repetition_penalty")
OFF: dict[str, Any] = {"temperature": 0.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "repetition_penalty": 1.0}
SAMPLED_DEFAULTS: dict[str, Any] = {"temperature": 1.0, "top_k": 50}  # transformers' GenerationConfig


def checkpoint_sampling(folder: Path) -> dict[str, Any]:
    """The five keys as the checkpoint's generation_config.json sets them (as transformers samples
    with it); ``{}`` when the folder has no such file. CheckpointError naming the file and key for a
    value of the wrong type or range."""
    path = folder / "generation_config.json"
    return sampling_of(read_json(path), path) if path.is_file() else {}


def sampling_of(raw: Any, path: Path) -> dict[str, Any]:
    """:func:`checkpoint_sampling` of generation_config.json's value ``raw`` (read from ``path``)."""
    if not isinstance(raw, dict):
        raise CheckpointError(f"{path}: expected a JSON object")
    do_sample = raw.get("do_sample", False)
    if not isinstance(do_sample, bool):
        raise CheckpointError(f"{path}: do_sample must be true or false, got {do_sample!r}")
    values: dict[str, Any] = {}
    for key in KEYS:
        if key != "repetition_penalty" and not do_sample:
            values[key] = OFF[key]  # greedy: transformers ignores them
            continue
        value = raw[key] if key in raw else SAMPLED_DEFAULTS.get(key, OFF[key])
        if value is None:
            value = OFF[key]
        if isinstance(value, int) and not isinstance(value, bool) and isinstance(OFF[key], float):
            value = float(value)
        try:
            check_sampling({key: value})
        except ConfigError as exc:
            raise CheckpointError(f"{path}: {exc}") from None
        values[key] = value
    return values


def fill_sampling(config, checkpoint) -> tuple[dict[str, Any], list[str]]:
    """The values of the keys ``config`` leaves null (``checkpoint.sampling``'s, else off, where
    ``checkpoint`` is a ``tileinfer.checkpoint.Checkpoint``, read only when a key is null), and
    which of them came from generation_config.json."""
    unset = [key for key in KEYS if getattr(config, key) is None]
    if not unset:
        return {}, []
    checkpoint_values = checkpoint.sampling
    filled = {key: checkpoint_values.get(key, OFF[key]) for key in unset}
    return filled, [key for key in unset if key in checkpoint_values]


__all__ = ["KEYS", "OFF", "checkpoint_sampling", "fill_sampling", "sampling_of"]
