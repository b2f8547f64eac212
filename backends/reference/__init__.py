"""Reference ops in plain torch: one broadcast or cuBLAS call per op, float32 where it matters.

Each file mirrors the Triton op of the same file name in tileinfer.backends.triton (its twin: the
function a kernel is checked against); ``kv_quant``, ``sampling`` and ``ngram``
have no Triton twin. They are also what the ``reference`` implementations of the plugin
``tileinfer.plugins.reference`` are built from.
"""
