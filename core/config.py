"""The run config: configs/default.yaml + any number of YAML files + ``KEY=VALUE`` overrides.

The schema is the ``Config`` dataclass (types only: the values live in default.yaml, the one
place defaults are written). ``load_config`` merges the layers and checks the values that need no
registry; ``ResolvedConfig.of`` (``resolve_config``: its config) then resolves ``auto`` (device,
dtype, implementations), validates every ``options.<name>`` against the options its implementation
declares, and asks each chosen implementation whether it can run (``incompatibilities``). Both
raise ConfigError listing the valid choices or the reasons; ``generate`` and ``tileinfer config``
resolve once, through the same function, so ``tileinfer config`` accepts exactly what
``generate`` accepts (a prompt aside).

Values are taken literally: ``${...}`` is not interpolated anywhere (a folder may be named
``${HOME}``), and the model path is never parsed as YAML: ``model=VALUE`` takes VALUE verbatim
(``model=null`` is a folder named ``null``; only a config file's or a mapping's null means the
shipped model). Every number is checked for its range (finite floats; ints within int64).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from importlib import resources
from os import PathLike, fspath
from pathlib import Path
from typing import Any, Dict, Iterable, Optional, Union

from omegaconf import MISSING, DictConfig, OmegaConf, SCMode
from omegaconf.errors import OmegaConfBaseException

from tileinfer.errors import ConfigError
from tileinfer.options import INT64_MAX, TYPE_NAMES, format_value

DEVICES = ("auto", "cpu", "cuda")
DTYPES = ("auto", "bfloat16", "float16", "float32")
QUANTIZE = ("auto", "none", "int8")


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
    forward: str = MISSING
    max_new_tokens: int = MISSING
    temperature: Optional[float] = MISSING  # null: the checkpoint's generation_config.json (``sampling_defaults``)
    top_k: Optional[int] = MISSING
    top_p: Optional[float] = MISSING
    min_p: Optional[float] = MISSING
    repetition_penalty: Optional[float] = MISSING
    presence_penalty: float = MISSING
    frequency_penalty: float = MISSING
    seed: int = MISSING
    spec_k: int = MISSING
    spec_adaptive: bool = MISSING
    kv_page_size: int = MISSING
    cuda_graphs: bool = MISSING
    pipelined: bool = MISSING
    kv_capacity: Any = MISSING  # an int or "auto"
    memory_fraction: float = MISSING
    prefill_chunk: int = MISSING
    prefix_cache: bool = MISSING
    threads: int = MISSING
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


_UNSET = object()


def load_config(sources: Iterable[ConfigSource] = (), overrides: Iterable[str] = ()) -> Config:
    """Merge default.yaml, then each source (a YAML path, the name of a shipped config such as
    ``eager``, or a mapping of keys to Python values, taken as they are), then ``KEY=VALUE``
    strings (VALUE read as YAML, except ``model=VALUE``: a path, verbatim)."""
    if isinstance(sources, (str, Path, Mapping)):
        raise ConfigError(f"sources is a list of YAML paths, shipped config names or mappings, got one "
                          f"{type(sources).__name__}: wrap it in a list")
    layers = [_split_model(_load_yaml(default_config_path()))]
    for source in sources:
        layers.append(_split_model(_load_yaml(_resolve_source(source))) if isinstance(source, (str, Path))
                      else _mapping(source))
    layers.append(_parse_overrides(overrides))
    model = None
    merged = OmegaConf.structured(Config)
    merged.model = None  # the layers' model values are kept out of the merge
    try:
        for layer, value in layers:
            _check_layer(layer)
            merged = OmegaConf.merge(merged, layer)
            model = model if value is _UNSET else value
        # resolve=False: every value literal, ``${...}`` included (no interpolation).
        values = OmegaConf.to_container(merged, resolve=False, throw_on_missing=True,
                                        structured_config_mode=SCMode.DICT)
    except OmegaConfBaseException as exc:
        raise _config_error(exc) from None
    config = Config(**{**values, "model": model})
    _check_values(config)
    return config


def _split_model(layer: DictConfig) -> tuple[DictConfig, Any]:
    """A layer without its ``model`` key, and the raw value of that key (``_UNSET`` when absent):
    the model path stays out of OmegaConf, which would read ``???`` as a missing value."""
    raw = OmegaConf.to_container(layer, resolve=False)
    if "model" not in raw:
        return layer, _UNSET
    del layer["model"]
    return layer, _model_value(raw["model"])


def _model_value(value: Any) -> Any:
    if isinstance(value, PathLike):
        value = fspath(value)
    if value is not None and not isinstance(value, str):
        raise ConfigError(f"model={format_value(value)} is not valid: expected a folder (a string; quote it in a "
                          "config file)")
    return value


def _mapping(source: object) -> tuple[DictConfig, Any]:
    if isinstance(source, DictConfig):
        source = OmegaConf.to_container(source, resolve=False)
    if not isinstance(source, Mapping):
        raise ConfigError(f"a config source is a YAML path, the name of a shipped config or a mapping, "
                          f"got {type(source).__name__}")
    source = dict(source)
    model = _model_value(source.pop("model")) if "model" in source else _UNSET
    try:
        return OmegaConf.create(source), model
    except OmegaConfBaseException as exc:
        raise _config_error(exc) from None


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


def _parse_overrides(overrides: Iterable[str]) -> tuple[DictConfig, Any]:
    """The ``KEY=VALUE`` strings as one layer: VALUE read as YAML (``3``, ``0.5``, ``false``, a
    string), except ``model``'s, which is a path taken verbatim (a later one wins)."""
    if isinstance(overrides, str):
        raise ConfigError(f"overrides are a list of KEY=VALUE strings, got the str {overrides!r}")
    parsed, model = [], _UNSET
    for item in overrides:
        if not isinstance(item, str):
            raise ConfigError(f"an override is a KEY=VALUE string, got {type(item).__name__} {item!r}")
        if "=" not in item or item.startswith("="):
            raise ConfigError(f"override {item!r} is not KEY=VALUE")
        key, _, value = item.partition("=")
        if key == "model":
            model = value
            continue
        try:
            OmegaConf.from_dotlist([item])
        except OmegaConfBaseException as exc:
            raise _config_error(exc) from None
        except Exception as exc:  # noqa: BLE001 - the YAML reader's own errors, e.g. for ``x={``
            first = (str(exc).splitlines() or [type(exc).__name__])[0]
            raise ConfigError(f"override {item!r}: cannot read the value ({first})") from None
        parsed.append(item)
    try:
        return OmegaConf.from_dotlist(parsed), model
    except OmegaConfBaseException as exc:
        raise _config_error(exc) from None


_KINDS = {"int": int, "float": float, "bool": bool, "str": str, "Optional[str]": str, "Optional[float]": float,
          "Optional[int]": int}  # Config's annotations


def _type_error(key: str, value: Any) -> ConfigError | None:
    """The error for a value of the wrong type for ``key`` (an int is a float too; a bool is
    not a number), or None."""
    if key == "kv_capacity" and value == "auto":
        return None
    kind = int if key == "kv_capacity" else _KINDS[next(str(f.type) for f in fields(Config) if f.name == key)]
    if value is None and str(next(f.type for f in fields(Config) if f.name == key)).startswith("Optional"):
        return None
    ok = isinstance(value, (int, float) if kind is float else kind)
    if not ok or kind is not bool and isinstance(value, bool):
        hint = " (values are literal: ${...} interpolation is not supported)" if "${" in str(value) else ""
        expected = TYPE_NAMES[kind] + (" or auto" if key == "kv_capacity" else "")
        return ConfigError(f"{key}={format_value(value)} is not valid: expected {expected}{hint}")
    return None


def _check_layer(layer: DictConfig) -> None:
    """The raw values of one layer have their key's type: OmegaConf would convert ``2`` to a flag,
    ``3.0`` to an int, ``"0.5"`` to a number, ``12`` to a folder name. A ``${...}`` string is let
    through here (kept literally, it fails ``_check_values`` after the merge, with a hint)."""
    try:
        raw = OmegaConf.to_container(layer, resolve=False)
    except OmegaConfBaseException as exc:
        raise _config_error(exc) from None
    names = {f.name for f in fields(Config)} - {"options"}
    for key, value in raw.items():
        if key in names and not (isinstance(value, str) and "${" in value):
            error = _type_error(key, value)
            if error:
                raise error


def _config_error(exc: OmegaConfBaseException) -> ConfigError:
    key = getattr(exc, "full_key", None) or getattr(exc, "key", None)
    message = str(exc).splitlines()[0]
    valid = ", ".join(f.name for f in fields(Config))
    if "not in struct" in message or "Key '" in message and "not" in message:
        return ConfigError(f"unknown config key {key!r}; valid keys: {valid}")
    return ConfigError(f"config key {key!r}: {message}" if key else f"bad config: {message}")


# Drafts per speculative step: a verify step of spec_k + 1 tokens; beyond a few hundred none is ever accepted,
# and the per-step buffers grow with it.
MAX_SPEC_K = 256
INT_RANGES = {"max_new_tokens": (1, INT64_MAX), "top_k": (0, INT64_MAX), "seed": (0, INT64_MAX),
              "spec_k": (1, MAX_SPEC_K), "kv_page_size": (1, INT64_MAX), "kv_capacity": (1, INT64_MAX),
              "prefill_chunk": (1, INT64_MAX), "threads": (0, 4096)}


def _check_values(config: Config) -> None:
    """Types (a ``${...}`` left in a number or a flag is not one), choices and ranges: what needs no
    registry and no checkpoint."""
    for f in fields(Config):
        error = _type_error(f.name, getattr(config, f.name)) if f.name != "options" else None
        if error:
            raise error
    if not isinstance(config.options, dict):
        raise ConfigError(f"options must be a mapping of implementation names to options, got {config.options!r}")
    if config.model == "":
        raise ConfigError("model= is empty: give a checkpoint folder")
    for key, valid in (("device", DEVICES), ("dtype", DTYPES), ("quantize", QUANTIZE)):
        value = getattr(config, key)
        if value not in valid:
            raise ConfigError(f"{key}={value} is not valid; choose one of: {', '.join(valid)}")
    for key, (low, high) in INT_RANGES.items():
        value = getattr(config, key)
        if key == "kv_capacity" and value == "auto":
            continue
        if value is not None and not low <= value <= high:
            raise ConfigError(f"{key}={value} is not valid: must be an integer in [{low}, {_int_name(high)}]")
    fraction = config.memory_fraction
    if not (math.isfinite(fraction) and 0 < fraction <= 1):
        raise ConfigError(f"memory_fraction={fraction} is not valid: must be a finite number in (0, 1]")
    if config.kv_capacity != "auto" and config.kv_page_size > config.kv_capacity:  # the engine would reject it (a pool of one page at least)
        raise ConfigError(f"kv_page_size ({config.kv_page_size}) is larger than kv_capacity ({config.kv_capacity}): "
                          "lower kv_page_size")
    check_sampling({key: getattr(config, key) for key in SAMPLING_KEYS if getattr(config, key) is not None})


def _int_name(value: int) -> str:
    return "2**63 - 1" if value == INT64_MAX else str(value)


# The config keys that are SamplingParams fields (a generation's own values override them).
SAMPLING_KEYS = ("temperature", "top_k", "top_p", "min_p", "seed", "presence_penalty", "frequency_penalty",
                 "repetition_penalty")
_FLOAT_RULES = {
    "temperature": (lambda v: v >= 0, ">= 0"),
    "top_p": (lambda v: 0 < v <= 1, "in (0, 1]"),
    "min_p": (lambda v: 0 <= v < 1, "in [0, 1)"),
    "presence_penalty": (lambda v: -2 <= v <= 2, "in [-2, 2]"),
    "frequency_penalty": (lambda v: -2 <= v <= 2, "in [-2, 2]"),
    "repetition_penalty": (lambda v: v > 0, "> 0"),
}


def check_sampling(values: Mapping[str, Any]) -> None:
    """The sampling settings' types and ranges (ConfigError naming the first bad one), for the keys
    ``values`` holds: the config and ``SamplingParams`` both check with this. Floats must be finite:
    ``temperature >= 0`` (0: greedy), ``0 < top_p <= 1``, ``0 <= min_p < 1``, presence and frequency
    penalties in ``[-2, 2]``, ``repetition_penalty > 0``; ``top_k >= 0`` and a seed in ``[0, 2**63 - 1]``."""
    for key, value in values.items():
        if key in _FLOAT_RULES:
            in_range, rule = _FLOAT_RULES[key]
            number = isinstance(value, numbers.Real) and not isinstance(value, bool)
            if not (number and math.isfinite(value) and in_range(value)):
                raise ConfigError(f"{key}={value} is not valid: must be a finite number {rule}")
        elif not isinstance(value, numbers.Integral) or isinstance(value, bool) or not 0 <= value <= INT64_MAX:
            raise ConfigError(f"{key}={value} is not valid: must be an integer in [0, 2**63 - 1]")


def resolve_config(config: Config, registry=None) -> Config:
    """``config`` with ``auto`` resolved (device, dtype, implementation names) and every chosen
    implementation's options filled in with their defaults; a ConfigError when an option is not
    declared or has a bad value, or when a chosen implementation cannot run (its reasons). The
    ``config`` of ``ResolvedConfig.of(config, registry)``, which also keeps the checkpoint read
    (an Engine built from that resolves and reads nothing again)."""
    from tileinfer.resolution import ResolvedConfig

    return ResolvedConfig.of(config, registry).config


def options_of(config: Config, name: str, declared) -> dict[str, Any]:
    """The values of ``options.<name>`` that the implementation declaring ``declared`` takes (the
    namespace ``options.<name>`` is shared by the implementations of that name across interfaces)."""
    keys = {option.name for option in declared}
    return {k: v for k, v in config.options.get(name, {}).items() if k in keys}
