"""Weight-only INT8 (W8A16) ``y = rms_norm(x) (q^T) * scale (+ residual)``, with the SwiGLU and
float32-logits epilogues, in one kernel; twin: backends/reference/linear_int8.py.

``q`` int8 ``[N, K]`` (nn.Linear layout), ``scale`` float32 ``[N]`` (one per output row), the
activations in the model dtype. T <= 16 tokens take the GEMV of linear_int8_gemv.py (int8 weight
tiles streamed once for all token rows, converted in registers, float32 accumulation, the scale in
the epilogue), larger T the GEMM of linear_int8_gemm.py; this module checks the arguments and
dispatches, as linear.py does for the model-dtype weights. The fused forms apply the epilogues with
the BF16 kernels' device functions (the same roundings as the per-op chain ``rms_norm``,
``linear_int8``, ``silu_mul``, ``add``).
"""

from __future__ import annotations

import torch

from tileinfer.backends.triton import FLOAT_DTYPES, SMALL_STEP_MAX_TOKENS
from tileinfer.backends.triton.interpreter import DEFAULT_NUM_SMS, interpreted, sms_of
from tileinfer.backends.triton.linear import check_linear_io
from tileinfer.backends.triton.linear_int8_gemm import GEMM_INT8_TILES, Int8GemmConfig, gemm_int8_config, launch_gemm_int8
from tileinfer.backends.triton.linear_int8_gemv import Int8GemvConfig, gemv_int8_config, launch_gemv_int8
from tileinfer.backends.triton.pdl import use_pdl
from tileinfer.backends.triton.rms_norm import rms_norm


def linear_int8(
    x: torch.Tensor,
    q: torch.Tensor,
    scale: torch.Tensor,
    *,
    out_dtype: torch.dtype | None = None,
    swiglu: bool = False,
    norm_weight: torch.Tensor | None = None,
    eps: float = 1e-6,
    residual: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    config: Int8GemvConfig | Int8GemmConfig | None = None,
    pdl: bool = False,
) -> torch.Tensor:
    """``y = round((norm(x) q^T) * scale)`` with float32 accumulation, an optional RMSNorm prologue
    and SwiGLU / residual epilogues.

    - ``x``: ``[T, K]``, float16 / bfloat16 / float32, unit column stride (any row stride).
      ``q``: int8 ``[N, K]`` row-major contiguous, values in [-128, 127]. ``scale``: float32
      ``[N]`` contiguous.
    - ``out_dtype``: ``x.dtype`` (default) or ``torch.float32`` (lm_head logits: the scaled float32
      accumulator is stored directly).
    - ``norm_weight`` ``[K]`` (x's dtype): x is RMS-normalized first (T <= 16: in the GEMV's
      prologue; T > 16: ``rms_norm`` first), as the BF16 ``linear``.
    - ``swiglu=True``: ``q`` and ``scale`` hold the fused ``[gate; up]`` rows (N = 2I); returns
      ``[T, I]`` = ``silu(gate) * up`` of the two halves, each rounded to ``out_dtype`` first.
    - ``residual`` ``[T, N or I]`` (x's dtype): returns ``round(y + residual)`` (``out`` may be
      ``residual``).
    - ``out``: optional preallocated output ``[T, N or I]`` of ``out_dtype``, unit column stride.
      ``config``: override of the rule's tiles (tests, tuning). ``pdl``: programmatic dependent
      launch where supported (same bits).
    """
    assert x.dim() == 2 and q.dim() == 2, f"x must be [T, K] and q [N, K], got {tuple(x.shape)}, {tuple(q.shape)}"
    T, K = x.shape
    n_w = q.shape[0]
    assert q.shape[1] == K, f"x {tuple(x.shape)} and q {tuple(q.shape)} disagree on K"
    assert q.dtype == torch.int8, f"q must be int8, got {q.dtype}"
    assert x.dtype in FLOAT_DTYPES, f"unsupported activation dtype {x.dtype}"
    assert scale.shape == (n_w,) and scale.dtype == torch.float32 and scale.is_contiguous(), (
        f"scale must be ({n_w},) float32 contiguous, got {tuple(scale.shape)} {scale.dtype}")
    assert x.device == q.device == scale.device, f"x on {x.device}, q on {q.device}, scale on {scale.device}"
    assert x.stride(1) == 1 or K == 1, "x must have unit column stride"
    assert q.is_contiguous(), "q must be row-major contiguous [N, K]"
    out, n_out, i_off = check_linear_io(x, n_w, out_dtype, swiglu, norm_weight, residual, out)
    if T == 0 or n_out == 0:
        return out
    assert K > 0, "K must be positive"
    dot_f32 = interpreted(x.device)
    pdl = use_pdl(pdl, x.device)
    if T <= SMALL_STEP_MAX_TOKENS:
        cfg = config or gemv_int8_config(n_w, K, T, sms_of(x.device))
        assert isinstance(cfg, Int8GemvConfig), f"T <= {SMALL_STEP_MAX_TOKENS} takes an Int8GemvConfig"
        launch_gemv_int8(x, q, scale, out, norm_weight, eps, residual, cfg, n_out, i_off, swiglu, dot_f32, pdl)
    else:
        cfg = config or gemm_int8_config(T, n_w, K, sms_of(x.device))
        assert isinstance(cfg, Int8GemmConfig), f"T > {SMALL_STEP_MAX_TOKENS} takes an Int8GemmConfig"
        if norm_weight is not None:
            x = rms_norm(x, norm_weight, eps, pdl=pdl)
        launch_gemm_int8(x, q, scale, out, residual, cfg, n_out, i_off, swiglu, dot_f32)
    return out


def norm_warps_int8(T: int, N: int, K: int, config: Int8GemvConfig | Int8GemmConfig | None = None,
                    sms: int = DEFAULT_NUM_SMS) -> int | None:
    """The ``num_warps`` of the RMSNorm that ``linear_int8(x, q, s, norm_weight=...)`` applies for a
    weight of ``N`` rows: the GEMV's (its prologue reduces with them), or None (T > 16)."""
    if T > SMALL_STEP_MAX_TOKENS:
        return None
    return (config or gemv_int8_config(N, K, T, sms)).num_warps


__all__ = ["GEMM_INT8_TILES", "Int8GemmConfig", "Int8GemvConfig", "gemm_int8_config", "gemv_int8_config",
           "linear_int8", "norm_warps_int8"]
