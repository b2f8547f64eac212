"""y = rms_norm(x) W^T (+ residual), with the SwiGLU and float32-logits epilogues, in one kernel;
twin: backends/reference/linear.py (+ rms_norm.py, silu_mul.py, add.py for the fused parts).

T <= 16 tokens (decode, speculative verify) take the GEMV of linear_gemv.py (+ its split-K reduce
for few-row weights), larger T the GEMM of linear_gemm.py; this module checks the arguments and
dispatches. Tiles come from rules on the weight's shape (``gemv_config(N, K, T)``, ``gemm_config(T,
N, K)``), not run-time autotuning, so that the fused and the per-op calls use the same tiles. Every
fused form is bit-identical to the chain of per-op kernels ``rms_norm`` (with :func:`norm_warps`),
``linear``, ``silu_mul``, ``add``: the epilogues round the accumulator to the output dtype as the
plain store would and go through the per-op kernels' device functions (device_functions.py). On
the GPU dot operands stay in the model dtype (float32 data: ``input_precision="ieee"``); under the
interpreter every tile goes to float32 (it computes bf16 dots and elementwise ops wrongly).
"""

from __future__ import annotations

import torch

from tileinfer.backends.triton import FLOAT_DTYPES, SMALL_STEP_MAX_TOKENS
from tileinfer.backends.triton.interpreter import DEFAULT_NUM_SMS, interpreted, num_sms, sms_of
from tileinfer.backends.triton.linear_gemm import GEMM_TILES, GemmConfig, gemm_config, launch_gemm
from tileinfer.backends.triton.linear_gemv import GemvConfig, gemv_config, launch_gemv
from tileinfer.backends.triton.pdl import use_pdl
from tileinfer.backends.triton.rms_norm import rms_norm


def linear(
    x: torch.Tensor,
    w: torch.Tensor,
    *,
    out_dtype: torch.dtype | None = None,
    swiglu: bool = False,
    norm_weight: torch.Tensor | None = None,
    eps: float = 1e-6,
    residual: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    config: GemvConfig | GemmConfig | None = None,
    pdl: bool = False,
) -> torch.Tensor:
    """``y = norm(x) W^T (+ residual)`` with float32 accumulation, an optional RMSNorm prologue and
    SwiGLU / residual epilogues.

    - ``x``: ``[T, K]``, float16 / bfloat16 / float32, unit column stride (any row stride: a row
      slice works). ``w``: ``[N, K]`` row-major contiguous (nn.Linear layout), same dtype as ``x``.
    - ``out_dtype``: ``x.dtype`` (default) or ``torch.float32`` (lm_head logits: the float32
      accumulator is stored directly, never rounded through the model dtype).
    - ``norm_weight`` ``[K]`` (x's dtype): x is RMS-normalized first, ``eps`` inside the root, as
      ``rms_norm`` rounds it. T <= 16: in the GEMV's prologue (each program reduces the whole row
      from L2, then normalizes each chunk as it loads it); T > 16: ``rms_norm`` first.
    - ``swiglu=False``: returns ``[T, N]``. ``swiglu=True``: ``w`` is the fused ``[gate; up]``
      weight (N = 2I rows); returns ``[T, I]`` = ``silu(gate) * up`` of the two halves, each
      rounded to ``out_dtype`` first.
    - ``residual`` ``[T, N or I]`` (x's dtype, unit column stride): returns ``round(y + residual)``
      (``out`` may be ``residual``).
    - Bit for bit the chain ``rms_norm`` (with :func:`norm_warps`), ``linear``, ``silu_mul``,
      ``add``.
    - Launched with floating-point contraction on (pinned: Triton's default until 3.10; the T = 1
      path's multiply-adds are FMAs, 5-8 % faster on the H200), as rms_norm.py's row kernel is, so
      that the prologue's sum of squares contracts alike.
    - ``out``: optional preallocated ``[T, N or I]`` output of ``out_dtype`` with unit column
      stride. ``config``: override of the rule's tiles, for tests and tuning only (pass the same one
      to a fused and a per-op call to keep them bit-identical).
    - ``pdl``: launch with programmatic dependent launch (Hopper and newer, CUDA only; ignored
      elsewhere): the kernel lets the next one start early, and issues its first weight loads
      before waiting for the kernel before it. Same results bit for bit.
    """
    assert x.dim() == 2 and w.dim() == 2, f"x must be [T, K] and w [N, K], got {tuple(x.shape)}, {tuple(w.shape)}"
    T, K = x.shape
    n_w = w.shape[0]
    assert w.shape[1] == K, f"x {tuple(x.shape)} and w {tuple(w.shape)} disagree on K"
    assert x.dtype == w.dtype, f"x is {x.dtype} but w is {w.dtype}"
    assert x.dtype in FLOAT_DTYPES, f"unsupported dtype {x.dtype}"
    assert x.device == w.device, f"x on {x.device}, w on {w.device}"
    assert x.stride(1) == 1 or K == 1, "x must have unit column stride"
    assert w.is_contiguous(), "w must be row-major contiguous [N, K]"
    out, n_out, i_off = check_linear_io(x, n_w, out_dtype, swiglu, norm_weight, residual, out)
    if T == 0 or n_out == 0:
        return out
    assert K > 0, "K must be positive"
    dot_f32 = interpreted(x.device)
    pdl = use_pdl(pdl, x.device)
    if T <= SMALL_STEP_MAX_TOKENS:
        cfg = config or gemv_config(n_w, K, T, sms_of(x.device))
        assert isinstance(cfg, GemvConfig), f"T <= {SMALL_STEP_MAX_TOKENS} takes a GemvConfig"
        launch_gemv(x, w, out, norm_weight, eps, residual, cfg, n_out, i_off, swiglu, dot_f32, pdl)
    else:
        cfg = config or gemm_config(T, n_w, K, sms_of(x.device))
        assert isinstance(cfg, GemmConfig), f"T > {SMALL_STEP_MAX_TOKENS} takes a GemmConfig"
        if norm_weight is not None:
            x = rms_norm(x, norm_weight, eps, pdl=pdl)
        launch_gemm(x, w, out, residual, cfg, n_out, i_off, swiglu, dot_f32)
    return out


def check_linear_io(x: torch.Tensor, n_w: int, out_dtype: torch.dtype | None, swiglu: bool,
                    norm_weight: torch.Tensor | None, residual: torch.Tensor | None,
                    out: torch.Tensor | None) -> tuple[torch.Tensor, int, int]:
    """The checks of ``linear`` and ``linear_int8`` past the weight's own: ``out_dtype``, the
    ``swiglu`` flag on ``n_w`` weight rows, ``norm_weight``, ``residual`` and ``out`` (allocated
    when None) against ``x`` ``[T, K]``. Returns ``(out, n_out, i_off)``: the output, its columns
    (``n_w / 2`` with ``swiglu``) and the first up row of a SwiGLU weight (else 0)."""
    T, K = x.shape
    out_dtype = out_dtype or x.dtype
    assert out_dtype in (x.dtype, torch.float32), f"out_dtype must be {x.dtype} or float32, got {out_dtype}"
    assert isinstance(swiglu, bool), f"swiglu is a flag, got {swiglu!r}"
    assert not swiglu or n_w % 2 == 0, f"swiglu needs an even number of weight rows, got {n_w}"
    n_out = n_w // 2 if swiglu else n_w
    i_off = n_out if swiglu else 0
    if norm_weight is not None:
        assert norm_weight.shape == (K,) and norm_weight.dtype == x.dtype and norm_weight.is_contiguous(), (
            f"norm_weight must be ({K},) {x.dtype} contiguous, got {tuple(norm_weight.shape)} {norm_weight.dtype}")
        assert K % 2 == 0, f"the RMSNorm prologue needs an even K, got {K}"
    if residual is not None:
        assert residual.shape == (T, n_out) and residual.dtype == out_dtype == x.dtype, (
            f"residual must be [{T}, {n_out}] {x.dtype}, got {tuple(residual.shape)} {residual.dtype}")
        assert residual.stride(1) == 1 or n_out == 1, "residual must have unit column stride"
    if out is None:
        out = torch.empty((T, n_out), dtype=out_dtype, device=x.device)
    assert out.shape == (T, n_out) and out.dtype == out_dtype and out.device == x.device, (
        f"out must be [{T}, {n_out}] {out_dtype} on {x.device}, got {tuple(out.shape)} {out.dtype}")
    assert out.stride(1) == 1 or n_out == 1, "out must have unit column stride"
    return out, n_out, i_off


def norm_warps(T: int, N: int, K: int, config: GemvConfig | GemmConfig | None = None,
               sms: int = DEFAULT_NUM_SMS) -> int | None:
    """The ``num_warps`` of the RMSNorm that ``linear(x, w, norm_weight=...)`` applies to ``x`` ``[T,
    K]`` for a weight of ``N`` rows: the GEMV's (its prologue reduces with them), or None (T > 16:
    ``rms_norm``'s own). ``rms_norm(x, ..., num_warps=norm_warps(...))`` then rounds like the
    prologue."""
    if T > SMALL_STEP_MAX_TOKENS:
        return None
    return (config or gemv_config(N, K, T, sms)).num_warps


__all__ = ["GEMM_TILES", "GemmConfig", "GemvConfig", "check_linear_io", "gemm_config", "gemv_config", "linear",
           "norm_warps", "num_sms"]
