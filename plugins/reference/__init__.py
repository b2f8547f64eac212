"""Plugin ``reference``: torch ops for every interface (one broadcast or cuBLAS call per op).

``auto`` chooses its linear and attention where nothing faster can run (on a CPU)."""

from tileinfer import hookimpl
from tileinfer.hookspecs import Implementation


@hookimpl
def tileinfer_implementations() -> list[Implementation]:
    here = "tileinfer.plugins.reference"
    return [
        Implementation("linear", "reference", f"{here}.linear:ReferenceLinear",
                       "torch RMSNorm, matmul (cuBLAS), SwiGLU, residual add; INT8 weights as (x q^T) * scale in float32",
                       auto=("cpu", "cuda")),
        Implementation("attention", "reference", f"{here}.attention:ReferenceAttention",
                       "gathers the pages into dense K, V and materializes the scores", auto=("cpu", "cuda")),
        Implementation("sampler", "reference", f"{here}.sampler:ReferenceSampler",
                       "penalties, no-repeat n-grams, greedy, temperature, top-k, top-p, min-p in torch"),
    ]
