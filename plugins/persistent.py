"""Plugin ``persistent``: steps of 1..16 tokens (decode, speculative verify) as one persistent
Triton kernel (backends/triton/persistent.py); longer steps (prefill) and what the kernel
does not cover run the per-op step, its twin.

The kernel reads the weights the model's Linear and Attention implementations hold (``weight``
and ``scale`` of every Linear: the model dtype, or int8 rows with float32 scales; the attention's
q/k norm weights and RoPE tables) and the KV store's pages (with int8 pages their scales and key
smoothing too) in place: nothing is copied. Its rows
are batch-invariant (a token's row is reduced in the same order whatever the step's token count),
so a verify step's rows equal the decode steps' of the same tokens bit for bit.

Covered: a Qwen3Model and the DFlash drafter's stack (its non-causal block step), KV pages in the
model dtype or int8 (``kv_store=paged_int8``: the step quantizes and reads them as the per-op
kernels do), head_dim a power of two (any number of query heads per kv head), CUDA or the Triton
interpreter. Anything else
runs the per-op step, with a one-line notice naming why (once per reason). The class
(plugins/persistent_forward.py) is imported when a config names it, so that the registry needs no
Triton.
"""

from tileinfer import hookimpl
from tileinfer.hookspecs import Implementation


@hookimpl
def tileinfer_implementations() -> list[Implementation]:
    return [Implementation("forward", "persistent", "tileinfer.plugins.persistent_forward:PersistentForward",
                           "steps of 1..16 tokens as one persistent Triton kernel (per-op above 16 tokens)")]
