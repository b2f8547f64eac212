"""Plugin ``triton``: Triton kernels for the Linear and Attention interfaces.

One registered name per interface, ``triton``; ``auto`` chooses it on a CUDA GPU. Its ablation
knobs are options under ``options.triton`` (one namespace for both; ``tileinfer plugins`` lists
them): fused epilogues, the norm in the GEMV prologue, torch matmuls, fused attention inputs, the
paged or dense attention, and programmatic dependent launch. On a CPU it runs only under Triton's
interpreter (``TRITON_INTERPRET=1``, as the tests do); otherwise it says why it cannot run.
"""

from tileinfer import hookimpl
from tileinfer.hookspecs import Implementation


@hookimpl
def tileinfer_implementations() -> list[Implementation]:
    here = "tileinfer.plugins.triton"
    return [
        Implementation("linear", "triton", f"{here}.linear:TritonLinear",
                       "Triton GEMV (<= 16 tokens) / GEMM, BF16 or W8A16 INT8, with the RMSNorm, SwiGLU and "
                       "residual add fused or not",
                       auto=("cuda",), priority=10),
        Implementation("attention", "triton", f"{here}.attention:TritonAttention",
                       "Triton q/k norm + RoPE + KV write, paged flash attention (prefill; split-KV decode), "
                       "BF16 or INT8 pages",
                       auto=("cuda",), priority=10),
    ]
