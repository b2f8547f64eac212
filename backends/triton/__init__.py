"""Triton kernels, each beside its reference twin in tileinfer.backends.reference.

Kernels run on CUDA tensors, or on CPU tensors under ``TRITON_INTERPRET=1`` (the tests do this on
machines without a GPU; the interpreter computes ``tl.dot`` wrongly on bfloat16, so interpreter
tests use float16 or float32 data).
"""
