"""Plugin ``per_op``: the forward pass as one implementation call per operation.

``forward=per_op`` (the default) runs ``tileinfer.model.stack_forward``: the embedding, then per
decoder layer the fused qkv Linear, the Attention, o_proj, gate_up and down (each Linear with the
norm, epilogue and residual add its implementation fuses), then the lm_head; each call launches
the kernels (or torch ops) of the linear and attention implementations the config names. It is
the reference every other ForwardPass implementation is checked against.
"""

from __future__ import annotations

from collections.abc import Collection

import torch

from tileinfer import hookimpl
from tileinfer.hookspecs import Implementation
from tileinfer.interfaces import ForwardPass, KVStore, Step
from tileinfer.model import stack_forward


class PerOpForward(ForwardPass):
    """``stack_forward`` behind the ForwardPass contract."""

    def __call__(self, token_ids: torch.Tensor, step: Step, kv: KVStore, *, capture: Collection[int] = (),
                 rows: torch.Tensor | None = None, last_only: bool = False,
                 logits: bool = True) -> tuple[torch.Tensor | None, dict[int, torch.Tensor]]:
        return stack_forward(self.model, token_ids, step, kv, capture=capture, rows=rows, last_only=last_only,
                             logits=logits)


@hookimpl
def tileinfer_implementations() -> list[Implementation]:
    return [Implementation("forward", "per_op", PerOpForward,
                           "one kernel (or torch op) per operation, layer by layer (tileinfer.model.stack_forward)")]
