"""KV store: the paged key/value cache of one sequence, shared by every layer."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from tileinfer.errors import UsageError
from tileinfer.interfaces.pluggable import Pluggable


@dataclass(frozen=True)
class KVGeometry:
    """Shape of the cache: ``num_pages`` pages of ``page_size`` positions per layer."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    page_size: int
    num_pages: int
    dtype: torch.dtype  # the model dtype: what write() takes and gather() returns

    @property
    def capacity(self) -> int:
        """Positions the pool holds."""
        return self.page_size * self.num_pages


@dataclass
class LayerKV:
    """One layer's pages as attention kernels read them, in place, through the block table.

    ``k`` and ``v`` are ``[num_pages, num_kv_heads, page_size, head_dim]`` in the storage dtype
    (the model dtype, or int8). For int8 pages, ``k_scale``/``v_scale`` are
    ``[num_pages, num_kv_heads, page_size]`` float32, one per cached vector: the value is
    ``int8 * scale``. When ``k_smooth`` (``[head_dim]`` float32) is set, the cache holds
    ``k / k_smooth``; attention multiplies the query by ``k_smooth`` so that q.k is unchanged.
    """

    k: torch.Tensor
    v: torch.Tensor
    k_scale: torch.Tensor | None = None
    v_scale: torch.Tensor | None = None
    k_smooth: torch.Tensor | None = None


class KVStore(Pluggable, ABC):
    """A pool of fixed-size pages and the block table of the one sequence being generated.

    The store owns the pages and the block table; the attention writes each step's keys and
    values, through ``write`` or in place through ``layer`` (see ``Attention``), and reads them
    through ``layer`` (in place) or ``gather`` (dense copies).

    The block table (``[num_pages]`` int32 on the device) lists, in order, the pool pages holding
    positions ``[i * page_size, (i + 1) * page_size)``; entries past the reserved pages are
    unspecified. Pages are handed out from a free list, so the table is not the identity and a
    kernel that ignores it reads the wrong page.

    ``key_norm_weights`` (one ``[head_dim]`` tensor per layer, the k RMSNorm weights) are given so
    that a store may smooth keys before quantizing them (see ``LayerKV.k_smooth``).
    ``storage`` names the page format (``"dtype"``: pages in the model dtype; ``"int8"``: int8 with
    scales and key smoothing), which an Attention implementation must list in its
    ``supported_storage`` to be combined with this store.
    """

    storage: ClassVar[str] = "dtype"

    def __init__(
        self,
        geometry: KVGeometry,
        device: torch.device,
        *,
        key_norm_weights: list[torch.Tensor] | None = None,
        options: Mapping[str, Any] | None = None,
    ) -> None:
        self._take_options(options)
        self.geometry = geometry
        self.device = torch.device(device)
        self.block_table = torch.zeros(geometry.num_pages, dtype=torch.int32, device=self.device)
        self._free = list(range(geometry.num_pages))
        self._pages: list[int] = []
        self.length = 0  # positions of the sequence that are (or, during a step, will be) cached
        self.version = 0  # counts reserve and truncate calls: a holder of the cached ids sees any change since
        self._workspace: tuple[torch.Tensor, ...] = ()

    @property
    def page_size(self) -> int:
        return self.geometry.page_size

    @property
    def capacity(self) -> int:
        return self.geometry.capacity

    def reserve(self, length: int) -> None:
        """Grow the sequence to ``length`` positions before a step writes the new ones: pages are
        taken from the free list to cover ``[0, length)``. Every call counts in ``version``."""
        if length > self.capacity:
            raise UsageError(
                f"the sequence needs {length} positions but the KV cache holds {self.capacity} "
                f"(raise kv_capacity)"
            )
        needed = -(-length // self.page_size)
        if needed > len(self._pages):
            new = [self._free.pop() for _ in range(needed - len(self._pages))]
            first = len(self._pages)
            self._pages.extend(new)
            # non_blocking: a plain copy from host memory waits for the device to drain (a sync per
            # new page, which would stall pipelined decoding); CUDA stages the pageable source
            # before the call returns, and the copy is ordered after the steps already enqueued.
            self.block_table[first:needed].copy_(torch.tensor(new, dtype=torch.int32), non_blocking=True)
        self.length = max(self.length, length)
        self.version += 1

    def truncate(self, length: int) -> None:
        """Forget positions ``>= length`` (rejected speculative tokens, or the part of a cached
        sequence a new prompt does not share); frees whole pages. Every call counts in ``version``."""
        if length > self.length:
            raise ValueError(f"cannot truncate to {length}: only {self.length} positions are cached")
        self.length = length
        self.version += 1
        keep = -(-length // self.page_size)
        while len(self._pages) > keep:
            self._free.append(self._pages.pop())

    def reset(self) -> None:
        """Drop the whole sequence (start of a new generation)."""
        self.truncate(0)

    def workspace(self, numel: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """Two flat buffers of at least ``numel`` elements of ``dtype`` on the store's device, for
        an attention's dense copies of one layer's keys and values. Owned by the store and reused
        by every layer and step of its sequence (one step runs at a time): valid until the next call."""
        buffers = self._workspace
        if not buffers or buffers[0].numel() < numel or buffers[0].dtype != dtype:
            buffers = self._workspace = tuple(torch.empty(numel, dtype=dtype, device=self.device) for _ in range(2))
        return buffers

    @abstractmethod
    def write(self, layer: int, positions: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store ``k``, ``v`` (``[T, num_kv_heads, head_dim]``, model dtype, after k-norm and RoPE)
        at ``positions`` (``[T]`` int64, already reserved)."""

    @abstractmethod
    def layer(self, layer: int) -> LayerKV:
        """The layer's pages, scales and smoothing, in the layout ``LayerKV`` documents for this
        store's ``storage``, for kernels that read and write the cache in place."""

    @abstractmethod
    def gather(self, layer: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Dense ``K``, ``V`` of positions ``[0, length)``, ``[length, num_kv_heads, head_dim]`` in
        the model dtype, dequantized; keys stay divided by ``k_smooth`` when the store smooths."""

