"""From a loaded config to the implementations a run uses: ``auto`` resolved, options validated,
each chosen implementation asked whether it can run, and the KV capacity in positions (from the
checkpoint's config.json and the free memory, before any weight loads). ``resolve`` does it once
and returns a ``ResolvedConfig``, which keeps the checkpoint it read for the engine to build from;
``config.resolve_config`` returns its config alone.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch

from tileinfer.checkpoint import Checkpoint, model_folder, read_checkpoint
from tileinfer.config import Config, options_of
from tileinfer.errors import ConfigError
from tileinfer.hookspecs import KINDS
from tileinfer.interfaces import RunSpec
from tileinfer.loading import resolve_quantize
from tileinfer.memory import auto_positions
from tileinfer.model_config import ModelConfig
from tileinfer.notices import notice
from tileinfer.options import check_options
from tileinfer.registry import Registry
from tileinfer.sampling_defaults import fill_sampling

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def resolve_device(name: str) -> torch.device:
    """``auto``: the GPU when one is visible, else the CPU."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device=cuda but no CUDA GPU is visible; use device=cpu")
    return torch.device(name)


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """``auto``: bfloat16 on a GPU; float32 on a CPU, where bfloat16 matmuls are emulated and slow."""
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return DTYPES[name]


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


@dataclass(frozen=True)
class ResolvedConfig:
    """A config resolved once, with what resolving it read: what ``Engine`` builds from, and what
    ``tileinfer config`` prints (the same checks, so it accepts exactly what ``generate`` does).

    ``config``: ``auto`` resolved (device, dtype, implementations, ``kv_capacity``), options
    filled in, the sampling keys left null filled; ``registry``: the one it was resolved with;
    ``checkpoint``: the model folder, read once (``checkpoint.read_checkpoint``); ``null_sampling``:
    the sampling keys the config left null (from generation_config.json, else off)."""

    config: Config
    registry: Registry
    checkpoint: Checkpoint
    null_sampling: tuple[str, ...] = ()

    @classmethod
    def of(cls, config: Config, registry: Registry | None = None) -> "ResolvedConfig":
        """``resolve(config, registry)``, with the built-in and installed plugins when no registry is given."""
        from tileinfer.registry import build_registry

        return resolve(config, registry or build_registry())


def resolve(config: Config, registry: Registry) -> ResolvedConfig:
    """See ``config.resolve_config`` (which returns the ``config`` of this)."""
    try:
        folder = model_folder(config)  # the folder exists (or the shipped model is installed), as generate checks it
    except (OSError, ValueError) as exc:  # a name too long, a NUL byte
        raise ConfigError(f"model={config.model!r}: not a folder ({exc})") from None
    device = resolve_device(config.device)
    dtype = resolve_dtype(config.dtype, device)
    _check_option_names(config, registry)
    kv_class = registry.get("kv_store", config.kv_store)
    checkpoint = read_checkpoint(folder)
    config = dataclasses.replace(config, quantize=resolve_quantize(config.quantize, checkpoint.quantization, folder))
    base = RunSpec(device=device, dtype=dtype, quantize=config.quantize, kv_storage=kv_class.storage,
                   kv_page_size=config.kv_page_size)
    chosen: dict[str, str] = {}
    for kind in KINDS:
        name = getattr(config, kind)
        if kind == "proposer" and name == "none":
            chosen[kind] = name
        elif name == "auto":
            chosen[kind] = _choose_auto(kind, config, registry, base)
        else:
            cls = registry.get(kind, name)
            reasons = cls.incompatibilities(_run_for(cls, name, config, base))
            if reasons:
                raise ConfigError(f"{kind}={name} cannot run here: {'; '.join(reasons)}")
            chosen[kind] = name
    _notice_unselected_options(config, chosen, registry)
    options = {name: dict(values) for name, values in config.options.items()}
    for kind, name in chosen.items():
        cls = registry.get(kind, name) if name != "none" else None
        if cls is not None and cls.declared_options:
            options.setdefault(name, {}).update(check_options(name, cls.declared_options,
                                                              options_of(config, name, cls.declared_options)))
    linear_class = registry.get("linear", chosen["linear"])
    workspace = linear_class.workspace_bytes(_run_for(linear_class, chosen["linear"], config, base),
                                             checkpoint.config.linear_shapes())
    capacity = resolve_capacity(config, checkpoint.config, device, dtype, kv_class.storage, workspace)
    sampling, _ = fill_sampling(config, checkpoint)  # the sampling keys left null: generation_config.json's, else off
    resolved = dataclasses.replace(config, device=device.type, dtype=dtype_name(dtype), options=options,
                                   kv_capacity=capacity, **chosen, **sampling)
    return ResolvedConfig(resolved, registry, checkpoint, tuple(sampling))


def resolve_capacity(config: Config, mc: ModelConfig, device: torch.device, dtype: torch.dtype, storage: str,
                     workspace: int = 0) -> int:
    """The positions the KV pool holds: ``kv_capacity`` capped by the model's context, or for
    ``auto`` that context bounded by ``memory_fraction`` of the free memory (``memory.auto_positions``,
    with the linear implementation's ``workspace`` bytes beside the weights; a notice when memory is
    the bound). A ConfigError when a page is larger than that."""
    auto = config.kv_capacity == "auto"
    limit = mc.max_positions if auto else min(config.kv_capacity, mc.max_positions)
    if config.kv_page_size > limit:
        raise ConfigError(f"kv_page_size ({config.kv_page_size}) is larger than the KV capacity ({limit} positions): "
                          "lower kv_page_size")
    if not auto:
        return limit
    capacity = auto_positions(mc, device=device, dtype=dtype, quantize=config.quantize, storage=storage,
                              page_size=config.kv_page_size, chunk=config.prefill_chunk,
                              fraction=config.memory_fraction, workspace=workspace)
    if capacity < mc.max_positions:
        notice(f"kv_capacity=auto: {capacity} positions fit in memory_fraction={config.memory_fraction} of the free "
               f"memory, fewer than the model's context ({mc.max_positions}); prompts and replies are limited to that")
    return capacity


def _run_for(cls: type, name: str, config: Config, base: RunSpec) -> RunSpec:
    options = check_options(name, cls.declared_options, options_of(config, name, cls.declared_options))
    return dataclasses.replace(base, options=options)


def _choose_auto(kind: str, config: Config, registry: Registry, base: RunSpec) -> str:
    """The highest-priority implementation ``auto`` may choose on this device that can run."""
    candidates = registry.auto_candidates(kind, base.device.type)
    why: list[str] = []
    for entry in candidates:
        name = entry.implementation.name
        cls = registry.get(kind, name)
        reasons = cls.incompatibilities(_run_for(cls, name, config, base))
        if not reasons:
            return name
        why.append(f"{name}: {'; '.join(reasons)}")
    if not candidates:
        raise ConfigError(f"{kind}=auto: no implementation is registered for device {base.device.type}; "
                          f"name one of: {', '.join(registry.names(kind))}")
    raise ConfigError(f"{kind}=auto: no implementation can run here ({'; '.join(why)})")


def _check_option_names(config: Config, registry: Registry) -> None:
    """Every ``options.<name>`` names a registered implementation and sets only options that an
    implementation of that name declares, with valid values."""
    every = sorted({n for kind in KINDS for n in registry.names(kind)})
    for name, values in config.options.items():
        classes = [registry.get(kind, name) for kind in KINDS if name in registry.names(kind)]
        if not classes:
            raise ConfigError(f"options.{name}: no implementation has that name; valid: {', '.join(every)}")
        if not isinstance(values, dict):
            raise ConfigError(f"options.{name} must be a mapping of option names to values, got {values!r}")
        declared = {option.name: option for cls in classes for option in cls.declared_options}
        check_options(name, tuple(declared.values()), values)


def _notice_unselected_options(config: Config, chosen: dict[str, str], registry: Registry) -> None:
    """A notice for each non-empty ``options.<name>`` whose implementation no interface selects
    here (``linear=auto`` resolving to ``reference`` on a CPU leaves ``options.triton`` unused)."""
    selected = set(chosen.values())
    for name, values in config.options.items():
        if values and name not in selected:
            where = ", ".join(f"{kind}={chosen[kind]}" for kind in KINDS if name in registry.names(kind))
            notice(f"options.{name} ({', '.join(values)}) has no effect: {name} is not selected here ({where})")


def implementation_options(config: Config, kind: str, registry: Registry) -> dict[str, Any]:
    """The options of the implementation ``config`` (resolved) chose for ``kind``."""
    name = getattr(config, kind)
    cls = registry.get(kind, name)
    return check_options(name, cls.declared_options, options_of(config, name, cls.declared_options))


__all__ = ["ResolvedConfig", "dtype_name", "implementation_options", "resolve", "resolve_capacity", "resolve_device",
           "resolve_dtype"]
