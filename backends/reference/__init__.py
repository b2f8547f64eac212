"""Reference ops in plain torch: one broadcast or cuBLAS call per op, float32 where it matters.

Each function is the twin a faster kernel is checked against, and what the ``reference``
implementations of the plugin ``tileinfer.plugins.reference`` are built from.
"""
