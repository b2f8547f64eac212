"""ReferenceOps: embedding, RMSNorm and residual add + RMSNorm as separate torch ops."""

from __future__ import annotations

from tileinfer.backends.reference import norm
from tileinfer.interfaces import Ops


class ReferenceOps(Ops):
    def embedding(self, token_ids, weight):
        return norm.embedding(token_ids, weight)

    def rms_norm(self, x, weight, eps):
        return norm.rms_norm(x, weight, eps)

    def add_rms_norm(self, x, residual, weight, eps):
        return norm.add_rms_norm(x, residual, weight, eps)
