"""Typed options of an implementation: declared once on its class, set under ``options.<name>``.

An implementation declares its options as a tuple of ``Option`` (name, type, default, meaning,
and optionally the valid choices or a minimum); ``tileinfer plugins`` lists them and the config
sets them as ``options.<implementation name>.<option>=VALUE``. ``check_options`` validates the
values a config gives and fills in the defaults, before any weight is loaded.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tileinfer.errors import ConfigError

OPTION_TYPES = (bool, int, float, str)
INT64_MAX = 2**63 - 1
TYPE_NAMES = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}


@dataclass(frozen=True)
class Option:
    """One option: ``type`` is bool, int, float or str; ``choices`` (str options) lists the valid
    values; ``minimum`` (int and float options) is the smallest valid value. Floats are finite and
    ints within int64, always."""

    name: str
    type: type
    default: Any
    help: str
    choices: tuple[str, ...] = ()
    minimum: float | None = None

    def __post_init__(self) -> None:
        if self.type not in OPTION_TYPES:
            raise TypeError(f"option {self.name}: type must be one of bool, int, float, str, not {self.type!r}")
        self.check(self.default, "default")

    def describe(self) -> str:
        """``fuse_epilogue (bool, default true): ...``: one line for listings."""
        valid = f"; one of {', '.join(self.choices)}" if self.choices else ""
        low = f"; >= {self.minimum:g}" if self.minimum is not None else ""
        return f"{self.name} ({self.type.__name__}, default {format_value(self.default)}{valid}{low}): {self.help}"

    def check(self, value: Any, where: str) -> Any:
        """``value`` converted to the option's type (an int where a float is expected), or a
        ConfigError naming ``where``."""
        kind = self.type
        ok = isinstance(value, kind) and not (kind is not bool and isinstance(value, bool))
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value, ok = float(value), True
        if not ok:
            hint = " (values are literal: ${...} interpolation is not supported)" if "${" in str(value) else ""
            raise ConfigError(f"{where}={format_value(value)} is not valid: expected {TYPE_NAMES[kind]}{hint}")
        if kind is float and not math.isfinite(value):
            raise ConfigError(f"{where}={format_value(value)} is not valid: must be a finite number")
        if kind is int and not -INT64_MAX - 1 <= value <= INT64_MAX:
            raise ConfigError(f"{where}={format_value(value)} is not valid: out of the int64 range")
        if self.choices and value not in self.choices:
            raise ConfigError(f"{where}={value} is not valid; choose one of: {', '.join(self.choices)}")
        if self.minimum is not None and not value >= self.minimum:  # also rejects NaN
            raise ConfigError(f"{where}={format_value(value)} is not valid: must be >= {self.minimum:g}")
        return value


def format_value(value: Any) -> str:
    """As a config file writes it: ``true``, ``4``, ``paged``."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def check_options(name: str, declared: Sequence[Option], values: Mapping[str, Any] | None) -> dict[str, Any]:
    """Every declared option of implementation ``name``, from ``values`` where given (validated)
    and from its default otherwise. A key no option declares is a ConfigError listing the valid ones."""
    values = dict(values or {})
    known = {option.name: option for option in declared}
    for key in values:
        if key not in known:
            valid = ", ".join(known) or "(it takes none)"
            raise ConfigError(f"options.{name}.{key} is not an option of {name}; valid: {valid}")
    return {key: option.check(values[key], f"options.{name}.{key}") if key in values else option.default
            for key, option in known.items()}


__all__ = ["Option", "check_options", "format_value"]
