"""The checkpoint folder of a model-based proposer (``proposer=draft``, ``proposer=dflash``):
``options.<proposer>.model``, or by default the shipped models/<proposer> beside the shipped
models/target; shared by plugins/draft.py and plugins/dflash.py."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from tileinfer.errors import ConfigError, TileinferError


def shipped_sibling(name: str) -> Path | None:
    """models/``name`` beside the shipped target, if installed (it holds a config.json)."""
    from tileinfer import shipped_model

    target = shipped_model()
    folder = target.parent / name if target is not None else None
    return folder if folder is not None and (folder / "config.json").is_file() else None


def is_shipped_target(config) -> bool:
    """Whether the run's target (``config.model``; None: the default) is the shipped model."""
    from tileinfer import shipped_model

    target = shipped_model()
    if config.model is None:
        return target is not None
    try:
        return target is not None and Path(config.model).resolve() == target.resolve()
    except (OSError, ValueError):
        return False


def proposer_folder(model: str, config, *, proposer: str, noun: str, needs: str, missing: str) -> Path:
    """The proposer's checkpoint folder: ``model``, or the shipped models/``proposer`` when ``model``
    is empty and the target is the shipped model; a one-line ConfigError otherwise. ``noun`` names
    the folder in the not-found error, ``needs`` what ``options.<proposer>.model`` must hold and
    ``missing`` the reason given when the shipped one is not installed."""
    if model:
        folder = Path(model)
        if not folder.is_dir():
            raise ConfigError(f"options.{proposer}.model={model}: {noun} folder not found")
        return folder
    folder = shipped_sibling(proposer)
    if folder is None or not is_shipped_target(config):
        why = "the target is not the shipped model" if folder is not None else missing
        raise ConfigError(f"proposer={proposer} needs options.{proposer}.model=DIR ({needs}): {why}")
    return folder


def folder_problems(model: str, *, proposer: str, noun: str, read: Callable[[Path], object]) -> list[str]:
    """What can be checked without the target (``incompatibilities``): none when ``model`` is empty;
    else the folder exists and ``read(folder)`` raises no TileinferError."""
    if not model:
        return []
    folder = Path(model)
    if not folder.is_dir():
        return [f"options.{proposer}.model={model}: {noun} folder not found"]
    try:
        read(folder)
    except TileinferError as exc:
        return [f"options.{proposer}.model={model}: {exc}"]
    return []


__all__ = ["folder_problems", "is_shipped_target", "proposer_folder", "shipped_sibling"]
