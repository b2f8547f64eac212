"""TritonOps (add and RMSNorm as two kernels) and TritonFusedOps (residual add + RMSNorm fused).

The kernels are launched with programmatic dependent launch where the tensors' device supports it
(Hopper and newer, compiled; backends/triton/pdl.py). Ops are built without a tensor, so this is
decided per call from the input's device (a cached lookup)."""

from __future__ import annotations

from tileinfer.backends.reference import norm as reference
from tileinfer.backends.triton import norm
from tileinfer.backends.triton.pdl import pdl_supported
from tileinfer.interfaces import Ops
from tileinfer.plugins.triton.device import kernels_run_on, notice_reference_twin


class TritonOps(Ops):
    fused_add = False
    name = "ops=triton"

    def embedding(self, token_ids, weight):
        return reference.embedding(token_ids, weight)  # one gather kernel either way

    def rms_norm(self, x, weight, eps):
        if not kernels_run_on(x.device):
            notice_reference_twin(self.name)
            return reference.rms_norm(x, weight, eps)
        return norm.rms_norm(x, weight, eps, pdl=pdl_supported(x.device))

    def add_rms_norm(self, x, residual, weight, eps):
        if not kernels_run_on(x.device):
            notice_reference_twin(self.name)
            return reference.add_rms_norm(x, residual, weight, eps)
        pdl = pdl_supported(x.device)
        if self.fused_add:
            return norm.add_rms_norm(x, residual, weight, eps, pdl=pdl)
        s = norm.add(x, residual, pdl=pdl)
        return norm.rms_norm(s, weight, eps, pdl=pdl), s


class TritonFusedOps(TritonOps):
    fused_add = True
    name = "ops=triton_fused"
