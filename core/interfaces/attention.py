"""Attention: from one layer's fused q/k/v projection to its attention output."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from tileinfer.interfaces.kv_store import KVStore
from tileinfer.interfaces.pluggable import Pluggable, RunSpec


@dataclass(frozen=True)
class AttentionSpec:
    """Head layout of a layer (Qwen3: head_dim 64 or 128, grouped-query attention)."""

    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float

    @property
    def qkv_size(self) -> int:
        return (self.num_heads + 2 * self.num_kv_heads) * self.head_dim

    @property
    def scale(self) -> float:
        return self.head_dim**-0.5


@dataclass(frozen=True)
class RopeTable:
    """Rotary embedding tables, ``[max_positions, head_dim // 2]`` float32 each (rotate-half
    convention: channel ``i`` pairs with channel ``i + head_dim // 2``)."""

    cos: torch.Tensor
    sin: torch.Tensor


@dataclass
class Step:
    """One forward pass of the single sequence: ``num_tokens`` new tokens after ``start`` cached
    positions, at positions ``start .. start + num_tokens - 1``.

    Prefill is ``start = 0`` with the whole prompt; decode has one token; a speculative verify step
    has ``k + 1``. ``positions`` is ``[num_tokens]`` int64 on the device.

    ``max_context`` is set on a step captured into a CUDA graph and replayed at other positions:
    then ``start`` is only the capture's, implementations must take the step's positions from the
    ``positions`` tensor on the device (``positions[0]`` is the start) and size their work for up to
    ``max_context`` cached positions.

    ``causal`` (the default): query ``i`` sees the cached positions ``0 .. start + i``. With
    ``causal=False`` every query of the step sees all ``end`` cached positions, the whole step
    included (block-diffusion drafters such as DFlash denoise a block whose tokens see each other
    both ways); the step's keys and values are written as for any step.
    """

    start: int
    num_tokens: int
    positions: torch.Tensor
    max_context: int | None = None
    causal: bool = True

    @classmethod
    def at(cls, start: int, num_tokens: int, device: torch.device, *, causal: bool = True) -> "Step":
        positions = torch.arange(start, start + num_tokens, dtype=torch.int64, device=device)
        return cls(start=start, num_tokens=num_tokens, positions=positions, causal=causal)

    @property
    def end(self) -> int:
        """Cached positions once this step has run."""
        return self.start + self.num_tokens


class Attention(Pluggable, ABC):
    """Self-attention of one layer over the paged KV cache, for steps of any number of tokens.

    Given the fused projection output ``qkv`` (``[T, (H + 2 Hkv) D]`` in the model dtype, q then k
    then v), it applies the per-head q and k RMSNorms, RoPE at the step's positions, writes k and v
    into the KV store, and returns grouped-query attention of the new queries over all ``step.end``
    cached positions (causal unless ``step.causal`` is False): ``[T, H D]`` in the model dtype.

    The attention writes the step's keys and values; the store only holds them. It writes either
    through ``KVStore.write`` (any store: the store converts to its page format) or in place into
    the pages of ``KVStore.layer`` (then it must know the page format: ``supported_storage`` lists
    the formats, ``KVStore.storage``, it reads and writes, and ``LayerKV`` documents each layout).
    ``incompatibilities`` rejects a store whose format is not listed.
    """

    supported_storage: ClassVar[tuple[str, ...]] = ("dtype",)

    def __init__(
        self,
        spec: AttentionSpec,
        *,
        layer: int,
        q_norm_weight: torch.Tensor,
        k_norm_weight: torch.Tensor,
        rope: RopeTable,
        options: Mapping[str, Any] | None = None,
    ) -> None:
        self._take_options(options)
        self.spec = spec
        self.layer = layer
        self.q_norm_weight = q_norm_weight
        self.k_norm_weight = k_norm_weight
        self.rope = rope

    @classmethod
    def incompatibilities(cls, run: RunSpec) -> list[str]:
        if run.kv_storage not in cls.supported_storage:
            return [f"it cannot read KV pages stored as {run.kv_storage} (it reads: {', '.join(cls.supported_storage)})"]
        return []

    @abstractmethod
    def __call__(self, qkv: torch.Tensor, step: Step, kv: KVStore) -> torch.Tensor:
        """``qkv`` ``[T, qkv_size]`` -> ``[T, num_heads * head_dim]``; writes the step into ``kv``."""

    def write_kv(self, qkv: torch.Tensor, step: Step, kv: KVStore) -> None:
        """Only the keys and values of ``qkv`` (k-norm, RoPE at the step's positions) into ``kv``,
        exactly as ``__call__`` writes them, with no attention (a block drafter caches rows that
        never query: DFlash's context). This default calls ``__call__`` and drops its output; an
        implementation skips the queries and the attention."""
        self(qkv, step, kv)
