"""Plugin ``triton``: Triton kernels for the Linear, Attention and Ops interfaces.

Three levels, each a registered name, so that each row of the seed's ablation is a config:
``triton`` (one kernel per op), ``triton_refattn`` (per-op kernels with the reference attention)
and ``triton_fused`` (SwiGLU in the GEMV/GEMM epilogue, residual add + RMSNorm in one kernel,
q/k norm + RoPE + KV write in two kernels). On a CPU without ``TRITON_INTERPRET=1`` they run
their torch reference twins, with a one-line notice.
"""

from tileinfer import hookimpl
from tileinfer.hookspecs import Implementation


@hookimpl
def tileinfer_implementations() -> list[Implementation]:
    here = "tileinfer.plugins.triton"
    return [
        Implementation("linear", "triton", f"{here}.linear:TritonLinear",
                       "Triton GEMV (<= 16 tokens) / GEMM; SwiGLU as a kernel of its own"),
        Implementation("linear", "triton_fused", f"{here}.linear:TritonFusedLinear",
                       "Triton GEMV / GEMM with SwiGLU in the epilogue"),
        Implementation("attention", "triton_refattn", f"{here}.attention:TritonRefAttention",
                       "Triton q/k norm, RoPE and KV write kernels; reference dense attention"),
        Implementation("attention", "triton", f"{here}.attention:TritonAttention",
                       "Triton per-op input kernels; paged flash attention (prefill; split-KV decode <= 16 tokens)"),
        Implementation("attention", "triton_fused", f"{here}.attention:TritonFusedAttention",
                       "q/k norm + RoPE + KV write in 2 kernels; paged flash attention"),
        Implementation("ops", "triton", f"{here}.ops:TritonOps", "Triton RMSNorm; residual add and RMSNorm as two kernels"),
        Implementation("ops", "triton_fused", f"{here}.ops:TritonFusedOps", "Triton RMSNorm; residual add + RMSNorm fused"),
    ]
