"""What every interface shares: typed options, and the reasons an implementation cannot run."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from tileinfer.options import Option, check_options


@dataclass(frozen=True)
class RunSpec:
    """What an implementation is told, before any weight loads, to say whether it can run: the
    resolved device and model dtype, the weight quantization, the KV store's page format
    (``KVStore.storage``) and page size (``kv_page_size``, positions per page), and its own options
    (validated, defaults filled in)."""

    device: torch.device
    dtype: torch.dtype
    quantize: str = "none"
    kv_storage: str = "dtype"
    kv_page_size: int = 64
    options: Mapping[str, Any] = field(default_factory=dict)


class Pluggable:
    """Base of the six interfaces.

    ``declared_options`` lists the options a user may set under ``options.<name>`` (``tileinfer
    plugins`` shows them); an instance reads their values from ``self.options``.
    ``incompatibilities(run)`` returns why the implementation cannot run as ``run`` describes, one
    reason a line (empty: it can); the engine checks it before reading any weight.
    """

    declared_options: ClassVar[tuple[Option, ...]] = ()

    @classmethod
    def incompatibilities(cls, run: RunSpec) -> list[str]:
        return []

    def _take_options(self, options: Mapping[str, Any] | None) -> None:
        self.options = check_options(type(self).__name__, self.declared_options, options)


__all__ = ["Pluggable", "RunSpec"]
