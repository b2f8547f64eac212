"""Plugin ``triton``: Triton kernels for the Linear and Attention interfaces.

Three levels, each a registered name, so that each row of the seed's ablation is a config:
``triton`` (one kernel per op), ``triton_refattn`` (per-op kernels with the reference attention)
and ``triton_fused`` (SwiGLU and the residual add in the GEMV/GEMM epilogue,
q/k norm + RoPE + KV write in one kernel). On a CPU without ``TRITON_INTERPRET=1`` they run
their torch reference twins, with a one-line notice. ``linear=cublas`` puts torch's matmul between
the per-op Triton kernels.
"""

from tileinfer import hookimpl
from tileinfer.hookspecs import Implementation


@hookimpl
def tileinfer_implementations() -> list[Implementation]:
    here = "tileinfer.plugins.triton"
    return [
        Implementation("linear", "triton", f"{here}.linear:TritonLinear",
                       "Triton GEMV (<= 16 tokens) / GEMM; RMSNorm, SwiGLU, residual add as kernels of their own"),
        Implementation("linear", "triton_fused", f"{here}.linear:TritonFusedLinear",
                       "Triton RMSNorm kernel, then GEMV / GEMM with SwiGLU / residual-add epilogues"),
        Implementation("linear", "triton_fused_prologue", f"{here}.linear:TritonPrologueLinear",
                       "triton_fused with the RMSNorm in the GEMV's prologue too (one kernel; slower on the H200)"),
        Implementation("linear", "cublas", f"{here}.linear:CublasLinear",
                       "torch matmul (cuBLAS) between Triton RMSNorm, SwiGLU and residual-add kernels"),
        Implementation("attention", "triton_refattn", f"{here}.attention:TritonRefAttention",
                       "Triton q/k norm, RoPE and KV write kernels; reference dense attention"),
        Implementation("attention", "triton", f"{here}.attention:TritonAttention",
                       "Triton per-op input kernels; paged flash attention (prefill; split-KV decode <= 16 tokens)"),
        Implementation("attention", "triton_fused", f"{here}.attention:TritonFusedAttention",
                       "q/k norm + RoPE + KV write in one kernel; paged flash attention"),
    ]
