"""Rotary position embedding: the RoPE parameters of a config.json, checked, and the cos/sin tables
every attention implementation reads (reference, Triton, the persistent step, the DFlash drafter).

Two RoPE types, as transformers computes them for Qwen3: ``default`` (``theta^(-2i/D)``) and
``yarn`` (YaRN, https://arxiv.org/abs/2309.00071), which Qwen3 documents for contexts past 32k with
``"rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from tileinfer.errors import CheckpointError
from tileinfer.interfaces import RopeTable

SUPPORTED_ROPE_TYPES = ("default", "yarn")
# YaRN's ramp bounds when a config leaves them out or sets 0 (transformers reads them with ``or``).
YARN_DEFAULTS = {"beta_fast": 32.0, "beta_slow": 1.0}


@dataclass(frozen=True)
class YarnScaling:
    """YaRN's parameters, resolved as transformers resolves them (``_compute_yarn_parameters``).

    ``attention_factor``: the multiplier of cos and sin (given, else from ``mscale`` and
    ``mscale_all_dim`` when both are set and non-zero, else ``0.1 ln(factor) + 1``, 1 when
    ``factor <= 1``)."""

    factor: float
    original_max_positions: int
    attention_factor: float
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    truncate: bool = True

    @property
    def context(self) -> int:
        """Positions the scaled RoPE is meant for: ``floor(factor * original_max_positions)``."""
        return int(self.factor * self.original_max_positions)


def _mscale(factor: float, mscale: float = 1.0) -> float:
    """YaRN's Eq. 21: ``0.1 * mscale * ln(factor) + 1``, and 1 for ``factor <= 1``."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def yarn_inverse_frequencies(head_dim: int, theta: float, yarn: YarnScaling) -> torch.Tensor:
    """YaRN's ``[head_dim // 2]`` float32 inverse frequencies, in transformers' operation order.

    With ``p_i = theta^(2i / D)`` (float32, ``i < D/2``), the extrapolated frequency ``1 / p_i`` is
    blended with the interpolated one ``1 / (factor p_i)``::

        inv_freq_i = interp_i * ramp_i + extrap_i * (1 - ramp_i)
        ramp_i     = clamp((i - low) / (high - low), 0, 1)        (high += 0.001 when low == high)
        dim(r)     = D ln(L / (2 pi r)) / (2 ln theta)            (L: original_max_positions)
        low, high  = max(dim(beta_fast), 0), min(dim(beta_slow), D - 1)

    where ``dim(beta_fast)`` is floored and ``dim(beta_slow)`` ceiled when ``truncate``. Channels
    that turn more than ``beta_fast`` times over L keep their frequency; those under ``beta_slow``
    turns are divided by ``factor``."""
    def correction_dim(rotations: float) -> float:
        return head_dim * math.log(yarn.original_max_positions / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = correction_dim(yarn.beta_fast), correction_dim(yarn.beta_slow)
    if yarn.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:
        high += 0.001
    pos_freqs = theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim)
    extrapolation, interpolation = 1.0 / pos_freqs, 1.0 / (yarn.factor * pos_freqs)
    ramp = ((torch.arange(head_dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    keep = 1 - ramp  # the extrapolated share
    return interpolation * (1 - keep) + extrapolation * keep


def rope_table(head_dim: int, theta: float, max_positions: int, device: torch.device,
               yarn: YarnScaling | None = None) -> RopeTable:
    """cos and sin of ``position * inv_freq_i``, ``[max_positions, head_dim // 2]`` float32.

    ``inv_freq_i = theta^(-2i / head_dim)`` (default RoPE), or :func:`yarn_inverse_frequencies`
    with both tables multiplied by ``yarn.attention_factor`` (as transformers multiplies cos and sin)."""
    if yarn is None:
        exponent = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
        inv_freq = 1.0 / (theta**exponent)
    else:
        inv_freq = yarn_inverse_frequencies(head_dim, theta, yarn)
    inv_freq = inv_freq.to(device)
    angles = torch.arange(max_positions, dtype=torch.int64, device=device).float()[:, None] * inv_freq[None, :]
    cos, sin = angles.cos(), angles.sin()
    if yarn is not None and yarn.attention_factor != 1.0:
        cos, sin = cos * yarn.attention_factor, sin * yarn.attention_factor
    return RopeTable(cos, sin)


def read_rope_type(raw: dict, source: str) -> tuple[str, str, dict]:
    """The RoPE type of a config.json, the key of the section holding its parameters and that
    section: ``rope_scaling`` (older transformers; wins when set, as there) or ``rope_parameters``
    (newer), each naming its type under ``rope_type`` or ``type``; both already checked to be JSON
    objects or null. CheckpointError naming the key for a type or a key tileinfer does not run."""
    name, section = "rope_parameters", raw.get("rope_parameters") or {}
    if raw.get("rope_scaling"):
        name, section = "rope_scaling", raw["rope_scaling"]
    for field_ in ("rope_type", "type"):
        value = section.get(field_)
        if value is not None and not isinstance(value, str):
            raise CheckpointError(f"{source}: {name}.{field_} must be a string, got {_show(value)}")
    rope_type = section.get("rope_type") or section.get("type") or "default"
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise CheckpointError(f"{source}: {name}: rope type {rope_type!r} is not supported "
                              f"(supported: {', '.join(SUPPORTED_ROPE_TYPES)})")
    partial = section.get("partial_rotary_factor", raw.get("partial_rotary_factor"))
    if partial not in (None, 1, 1.0) or isinstance(partial, bool):
        raise CheckpointError(f"{source}: partial_rotary_factor {_show(partial)} is not supported (only 1)")
    return rope_type, name, section


def read_yarn(raw: dict, name: str, section: dict, source: str, max_positions: int, theta: float) -> YarnScaling:
    """YaRN's parameters from ``section`` (the config.json key ``name``; :func:`read_rope_type`),
    checked; missing keys take transformers' defaults (``original_max_position_embeddings``: the
    top-level key, else the section's, else ``max_positions``; ``factor``: their ratio when null)."""
    def number(key: str, low: float, default: float | None = None) -> float | None:
        value = section.get(key)
        if value is None:
            return default
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        if not ok or value < low:
            raise CheckpointError(f"{source}: {name}.{key} must be a finite number >= {low:g}, got {_show(value)}")
        return float(value)

    if theta <= 1.0:
        raise CheckpointError(f"{source}: YaRN needs rope_theta > 1, got {theta:g}")
    original = raw.get("original_max_position_embeddings", section.get("original_max_position_embeddings"))
    if original is None:
        original = max_positions
    if not isinstance(original, int) or isinstance(original, bool) or not 0 < original <= 2**31:
        raise CheckpointError(f"{source}: {name}.original_max_position_embeddings must be a positive integer "
                              f"<= 2**31, got {_show(original)}")
    factor = number("factor", 1.0, max_positions / original)
    if factor < 1.0 or factor * original > 2**31:
        raise CheckpointError(f"{source}: {name}.factor {factor:g} must be >= 1 (max_position_embeddings / "
                              "original_max_position_embeddings when null) and factor * original <= 2**31")
    truncate = section.get("truncate", True)
    if not isinstance(truncate, bool):
        raise CheckpointError(f"{source}: {name}.truncate must be true or false, got {_show(truncate)}")
    attention = number("attention_factor", 0.0)
    if attention is None:
        mscale, mscale_all_dim = number("mscale", 0.0), number("mscale_all_dim", 0.0)
        attention = _mscale(factor, mscale) / _mscale(factor, mscale_all_dim) if mscale and mscale_all_dim \
            else _mscale(factor)
    beta_fast = number("beta_fast", 0.0) or YARN_DEFAULTS["beta_fast"]
    beta_slow = number("beta_slow", 0.0) or YARN_DEFAULTS["beta_slow"]
    return YarnScaling(factor=factor, original_max_positions=original, attention_factor=attention,
                       beta_fast=beta_fast, beta_slow=beta_slow, truncate=truncate)


def _show(value) -> str:
    from tileinfer.model_config import _show as show  # model_config imports this module

    return show(value)
