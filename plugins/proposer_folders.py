"""A model-based proposer (``proposer=draft``, ``proposer=dflash``): the base class of both, with
their two options (``options.<proposer>.model``, the checkpoint folder, by default the shipped
models/<proposer> beside the shipped models/target; ``options.<proposer>.greedy``) and the checks
of the folder; shared by plugins/draft.py and plugins/dflash.py."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, ClassVar

from tileinfer.errors import ConfigError, TileinferError
from tileinfer.interfaces import Proposer, ProposerContext, RunSpec
from tileinfer.options import Option


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


@dataclass(frozen=True)
class ProposerCheckpoint:
    """Where proposer ``proposer`` finds its checkpoint. ``noun`` names the folder, ``holds`` what
    ``options.<proposer>.model`` must hold, ``missing`` the reason given when the shipped one is not
    installed; ``read(folder)`` raises a TileinferError when the folder does not hold such a
    checkpoint."""

    proposer: str
    noun: str
    holds: str
    missing: str
    read: Callable[[Path], object]

    def options(self, *, greedy: str) -> tuple[Option, ...]:
        """The proposer's ``declared_options``: ``model`` (the folder; empty: the shipped one) and
        ``greedy`` (true: argmax drafts; described by ``greedy``)."""
        return (Option("model", str, "", f"{self.noun} folder, {self.holds} (empty: the shipped "
                       f"models/{self.proposer}, when the target is the shipped model)"),
                Option("greedy", bool, True, greedy))

    def folder(self, model: str, config) -> Path:
        """The checkpoint folder: ``model``, or the shipped models/``proposer`` when ``model`` is
        empty and the target (``config.model``) is the shipped model; a one-line ConfigError otherwise."""
        if model:
            folder = Path(model)
            if not folder.is_dir():
                raise ConfigError(f"options.{self.proposer}.model={model}: {self.noun} folder not found")
            return folder
        folder = shipped_sibling(self.proposer)
        if folder is None or not is_shipped_target(config):
            why = "the target is not the shipped model" if folder is not None else self.missing
            raise ConfigError(f"proposer={self.proposer} needs options.{self.proposer}.model=DIR ({self.holds}): {why}")
        return folder

    def problems(self, model: str) -> list[str]:
        """What can be checked without the target: none when ``model`` is empty; else the folder
        exists and ``read(folder)`` raises no TileinferError."""
        if not model:
            return []
        folder = Path(model)
        if not folder.is_dir():
            return [f"options.{self.proposer}.model={model}: {self.noun} folder not found"]
        try:
            self.read(folder)
        except TileinferError as exc:
            return [f"options.{self.proposer}.model={model}: {exc}"]
        return []


class CheckpointProposer(Proposer):
    """A proposer that drafts with a checkpoint of its own, found as ``checkpoint`` says, in
    ``folder`` (its options: ``checkpoint.options``)."""

    checkpoint: ClassVar[ProposerCheckpoint]

    def __init__(self, context: ProposerContext) -> None:
        super().__init__(context)
        self.folder = self.checkpoint.folder(self.options["model"], context.config)

    @classmethod
    def incompatibilities(cls, run: RunSpec) -> list[str]:
        """What can be checked without the target: the folder, when named, holds such a checkpoint."""
        return cls.checkpoint.problems(run.options["model"])


__all__ = ["CheckpointProposer", "ProposerCheckpoint", "is_shipped_target", "shipped_sibling"]
