"""Triton kernels, one op per file, each beside its reference twin of the same file name in
tileinfer.backends.reference.

Kernels run on CUDA tensors, or on CPU tensors under ``TRITON_INTERPRET=1`` (interpreter.py; the
tests do this on machines without a GPU; the interpreter computes ``tl.dot`` wrongly on bfloat16,
so interpreter tests use float16 or float32 data). Device functions that more than one kernel file
calls live in device_functions.py; programmatic dependent launch in pdl.py.
"""

import torch

try:
    import triton  # noqa: F401
except ModuleNotFoundError as exc:
    if exc.name != "triton":
        raise
    raise ModuleNotFoundError("No module named 'triton' (CUDA builds of torch bring it; otherwise "
                              "pip install 'tileinfer[triton]')", name="triton") from exc

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
# The largest step (a decode step, or the verification of speculative drafts) that takes the
# small-step kernels: the GEMV of linear.py and the split-KV decode of paged_attention.py. Above it,
# the GEMM and the prefill attention.
SMALL_STEP_MAX_TOKENS = 16
