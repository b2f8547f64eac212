"""The run config: configs/default.yaml + any number of YAML files + ``KEY=VALUE`` overrides.

The schema is the ``Config`` dataclass (types only: the values live in default.yaml, the one
place defaults are written). ``load_config`` merges the layers and checks the values that need no
registry; ``resolve_config`` then resolves ``auto`` (device, dtype, implementations), validates
every ``options.<name>`` against the options its implementation declares, and asks each chosen
implementation whether it can run (``incompatibilities``). Both raise ConfigError listing the
valid choices or the reasons; the engine and ``tileinfer config`` call the same two functions.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from importlib import resources
from pathlib import Path
from typing import Any, Dict, Iterable, Optional, Union

from omegaconf import MISSING, DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from tileinfer.errors import ConfigError

DEVICES = ("auto", "cpu", "cuda")
DTYPES = ("auto", "bfloat16", "float16", "float32")
QUANTIZE = ("none", "int8")


@dataclass
class Config:
    """Every key a run takes; default.yaml gives their values and says what each means."""

    model: Optional[str] = MISSING
    device: str = MISSING
    dtype: str = MISSING
    quantize: str = MISSING
    linear: str = MISSING
    attention: str = MISSING
    kv_store: str = MISSING
    sampler: str = MISSING
    proposer: str = MISSING
    max_new_tokens: int = MISSING
    temperature: float = MISSING
    top_k: int = MISSING
    top_p: float = MISSING
    min_p: float = MISSING
    seed: int = MISSING
    spec_k: int = MISSING
    kv_page_size: int = MISSING
    cuda_graphs: bool = MISSING
    pipelined: bool = MISSING
    kv_capacity: int = MISSING
    options: Dict[str, Dict[str, Any]] = field(default_factory=dict)


ConfigSource = Union[str, Path, dict, DictConfig]


def default_config_path() -> Path:
    return shipped_config_path("default")


def shipped_config_path(name: str) -> Path:
    return Path(str(resources.files("tileinfer.configs").joinpath(f"{name}.yaml")))


def shipped_configs() -> list[str]:
    """Names of the configs that ship in configs/ (usable as ``--config NAME``)."""
    return sorted(p.stem for p in default_config_path().parent.glob("*.yaml") if p.stem != "default")


def _resolve_source(source: Union[str, Path]) -> Path:
    path = Path(source)
    if not path.exists() and path.suffix == "" and "/" not in str(source) and shipped_config_path(str(source)).is_file():
        return shipped_config_path(str(source))
    return path


def load_config(sources: Iterable[ConfigSource] = (), overrides: Iterable[str] = ()) -> Config:
    """Merge default.yaml, then each source (a YAML path, the name of a shipped config such as
    ``eager``, or a mapping), then ``KEY=VALUE`` strings."""
    merged = OmegaConf.structured(Config)
    layers = [_load_yaml(default_config_path())]
    for source in sources:
        layers.append(_load_yaml(_resolve_source(source)) if isinstance(source, (str, Path)) else OmegaConf.create(source))
    layers.append(_parse_overrides(overrides))
    for layer in layers:
        try:
            merged = OmegaConf.merge(merged, layer)
        except OmegaConfBaseException as exc:
            raise _config_error(exc) from None
    try:
        config = OmegaConf.to_object(merged)
    except OmegaConfBaseException as exc:
        raise _config_error(exc) from None
    _check_values(config)
    return config


def to_yaml(config: Config) -> str:
    return OmegaConf.to_yaml(OmegaConf.structured(config))


def _load_yaml(path: Path) -> DictConfig:
    if not path.is_file():
        raise ConfigError(f"config file not found: {path} (shipped configs: {', '.join(shipped_configs())})")
    try:
        loaded = OmegaConf.load(path)
    except Exception as exc:
        raise ConfigError(f"cannot read config file {path}: {str(exc).splitlines()[0]}") from None
    if not isinstance(loaded, DictConfig):
        raise ConfigError(f"config file {path} must hold a mapping of keys to values")
    return loaded


def _parse_overrides(overrides: Iterable[str]) -> DictConfig:
    overrides = list(overrides)
    for item in overrides:
        if "=" not in item or item.startswith("="):
            raise ConfigError(f"override {item!r} is not KEY=VALUE")
    try:
        return OmegaConf.from_dotlist(overrides)
    except OmegaConfBaseException as exc:
        raise _config_error(exc) from None


def _config_error(exc: OmegaConfBaseException) -> ConfigError:
    key = getattr(exc, "full_key", None) or getattr(exc, "key", None)
    message = str(exc).splitlines()[0]
    valid = ", ".join(f.name for f in fields(Config))
    if "not in struct" in message or "Key '" in message and "not" in message:
        return ConfigError(f"unknown config key {key!r}; valid keys: {valid}")
    return ConfigError(f"config key {key!r}: {message}" if key else f"bad config: {message}")


def _check_values(config: Config) -> None:
    for key, valid in (("device", DEVICES), ("dtype", DTYPES), ("quantize", QUANTIZE)):
        value = getattr(config, key)
        if value not in valid:
            raise ConfigError(f"{key}={value} is not valid; choose one of: {', '.join(valid)}")
    for key in ("max_new_tokens", "spec_k", "kv_page_size", "kv_capacity"):
        if getattr(config, key) < 1:
            raise ConfigError(f"{key} must be >= 1, got {getattr(config, key)}")


def resolve_config(config: Config, registry=None) -> Config:
    """``config`` with ``auto`` resolved (device, dtype, implementation names) and every chosen
    implementation's options filled in with their defaults; a ConfigError when an option is not
    declared or has a bad value, or when a chosen implementation cannot run (its reasons)."""
    from tileinfer.registry import build_registry
    from tileinfer.resolution import resolve

    return resolve(config, registry or build_registry())


def options_of(config: Config, name: str, declared) -> dict[str, Any]:
    """The values of ``options.<name>`` that the implementation declaring ``declared`` takes (the
    namespace ``options.<name>`` is shared by the implementations of that name across interfaces)."""
    keys = {option.name for option in declared}
    return {k: v for k, v in config.options.get(name, {}).items() if k in keys}
