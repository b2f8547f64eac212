"""ForwardPass: how one forward pass of ``T`` tokens is executed over a model and its KV store."""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Collection, Mapping
from typing import TYPE_CHECKING, Any

import torch

from tileinfer.interfaces.attention import Step
from tileinfer.interfaces.kv_store import KVStore
from tileinfer.interfaces.pluggable import Pluggable

if TYPE_CHECKING:
    from tileinfer.model import Qwen3Model
    from tileinfer.plugins.dflash_model import DFlashDrafter


class ForwardPass(Pluggable):
    """Runs the decoder stack of ``model`` on the tokens of one step: ``model.embed`` ``[V, H]``,
    ``model.layers`` (each with the Linear and Attention implementations ``qkv``, ``attention``,
    ``o_proj``, ``gate_up``, ``down`` of a ``tileinfer.model.Qwen3Layer``), ``model.lm_head`` and
    ``model.device``: a ``tileinfer.model.Qwen3Model`` (the target, a draft model) or the DFlash
    drafter (its block). Config key ``forward``; built once per model when the engine or a
    proposer is built: ``cls(model, options=...)``.

    Every step of every decoding strategy runs through it: the prefill chunks (eager or replayed
    from CUDA graphs), plain decode steps, verify steps, the device-resident speculative loop's
    step, a draft model's steps and the DFlash drafter's block step. The per-op implementation
    (``per_op``) runs ``tileinfer.model.stack_forward``, one kernel per operation: it is the
    reference every other implementation (a persistent kernel, say) is compared with.

    The contract of ``__call__(token_ids, step, kv, *, capture, rows, last_only, logits)``:

    - ``token_ids``: ``[T]`` int64 valid ids on the model's device (callers clamp); ``step``: the
      ``Step`` of those ``T`` tokens (``T == step.num_tokens``). With ``step.max_context`` set the
      call is being captured into a CUDA graph that will be replayed at other positions: take the
      positions from ``step.positions`` on the device, never from ``step.start``.
    - writes the step's keys and values at its positions in ``kv`` (which holds pages for them)
      in every layer, through the layers' Attention implementations.
    - returns ``(logits, hidden)``: float32 logits ``[T, V]``; ``[1, V]`` of the last row with
      ``last_only``; ``[R, V]`` of the rows listed in ``rows`` (``[R]`` int64 on the device, read
      there); None with ``logits=False`` (no lm_head). ``hidden`` maps each decoder layer in
      ``capture`` to its output ``[T, hidden]`` (the residual stream after the layer, before the
      final norm).
    - capturable: no host sync, no host read of a device value, shapes fixed by ``T`` alone; the
      outputs may be buffers a later call overwrites (a caller reads them first).
    """

    def __init__(self, model: Qwen3Model | DFlashDrafter, *, options: Mapping[str, Any] | None = None) -> None:
        self.model = model
        self._take_options(options)

    @property
    def device(self) -> torch.device:
        return self.model.device

    @abstractmethod
    def __call__(self, token_ids: torch.Tensor, step: Step, kv: KVStore, *, capture: Collection[int] = (),
                 rows: torch.Tensor | None = None, last_only: bool = False,
                 logits: bool = True) -> tuple[torch.Tensor | None, dict[int, torch.Tensor]]:
        """One step; see the class."""


__all__ = ["ForwardPass"]
