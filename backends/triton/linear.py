"""y = x W^T (+ residual), with the SwiGLU and float32-logits epilogues, in one kernel, for weights
in the model dtype or int8 with one float32 scale per output row (W8A16); twin:
backends/reference/linear.py.

T <= 16 tokens (decode, speculative verify) take the GEMV of linear_gemv.py (+ its split-K reduce
for few-row weights), larger T the GEMM of linear_gemm.py or its persistent form
(linear_gemm_persistent.py); this module checks the arguments and dispatches. Tiles come from the
rule of linear_tiles.py on the weight's shape and format (:func:`rule_config`), not run-time
autotuning, so that the fused and the per-op calls use the same tiles. Every fused form is
bit-identical to the chain of per-op kernels ``linear`` (with the fused call's tiles), ``silu_mul``,
``add``: the epilogues round the accumulator to the output dtype as the plain store would and go
through the per-op kernels' device functions (device_functions.py). On the GPU dot operands stay in
the model dtype (float32 data: ``input_precision="ieee"``); under the interpreter every tile goes to
float32 (it computes bf16 dots and elementwise ops wrongly).
"""

from __future__ import annotations

import dataclasses
import functools

import torch

from tileinfer.backends.triton import FLOAT_DTYPES, SMALL_STEP_MAX_TOKENS
from tileinfer.backends.triton.interpreter import interpreted, sms_of
from tileinfer.backends.triton.linear_gemm import launch_gemm
from tileinfer.backends.triton.linear_gemm_persistent import launch_gemm_persistent, tma_ok
from tileinfer.backends.triton.linear_gemv import launch_gemv
from tileinfer.backends.triton.linear_layout import check_layout
from tileinfer.backends.triton.linear_tiles import GemmConfig, GemvConfig, counters_needed, gemm_config, gemv_config
from tileinfer.backends.triton.pdl import use_pdl

# The interpreter runs a grid's programs one after another, each paying a fixed cost per device
# function call: the GEMV's rows per program there (the GPU rule's 4 to 64 rows would give a test
# model's step hundreds of programs).
INTERPRETER_BLOCK_N = 64


def linear(
    x: torch.Tensor,
    w: torch.Tensor,
    scale: torch.Tensor | None = None,
    *,
    out_dtype: torch.dtype | None = None,
    swiglu: bool = False,
    residual: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    config: GemvConfig | GemmConfig | None = None,
    pdl: bool = False,
    counters: torch.Tensor | None = None,
    int8_layout: str = "rows",
) -> torch.Tensor:
    """``y = x W^T (+ residual)`` with float32 accumulation and SwiGLU / residual epilogues.

    - ``x``: ``[T, K]``, float16 / bfloat16 / float32, unit column stride (any row stride: a row
      slice works). ``w``: ``[N, K]`` row-major contiguous (nn.Linear layout): x's dtype, or int8
      (values in [-128, 127]) with ``scale`` float32 ``[N]`` contiguous, one per output row (W8A16:
      ``W = w * scale[:, None]``, applied to the float32 accumulator). A ``scale`` with ``w`` in x's
      dtype (T > 16, the GEMMs only): the same arithmetic on the model-dtype tiles, for the values of
      an int8 weight written out by int8_dequant.py (``options.triton.int8_prefill_dequant``).
    - ``out_dtype``: ``x.dtype`` (default) or ``torch.float32`` (lm_head logits: the float32
      accumulator is stored directly, never rounded through the model dtype).
    - ``swiglu=False``: returns ``[T, N]``. ``swiglu=True``: ``w`` (and ``scale``) hold the fused
      ``[gate; up]`` rows (N = 2I); returns ``[T, I]`` = ``silu(gate) * up`` of the two halves, each
      rounded to ``out_dtype`` first.
    - ``residual`` ``[T, N or I]`` (x's dtype, unit column stride): returns ``round(y + residual)``
      (``out`` may be ``residual``).
    - Bit for bit the chain ``linear`` (with ``config=rule_config(x, w, scale, swiglu=True)`` for a
      SwiGLU weight), ``silu_mul``, ``add``.
    - Launched with floating-point contraction on (pinned: Triton's default until 3.10; the T = 1
      path's multiply-adds are FMAs, 5-8 % faster on the H200).
    - ``out``: optional preallocated ``[T, N or I]`` output of ``out_dtype`` with unit column
      stride. ``config``: override of the rule's tiles, for tests and tuning (pass the same one to a
      fused and a per-op call to keep them bit-identical).
    - ``pdl``: launch with programmatic dependent launch (Hopper and newer, CUDA only; ignored
      elsewhere): the kernel lets the next one start early, and issues its first weight loads
      before waiting for the kernel before it. Same results bit for bit.
    - ``counters``: int32 zeros on x's device, at least as many as the launch counts on (a GEMV
      with ``fused_reduce``: one per column block, ``counters_needed`` for the rule's; a persistent
      split tail: one per split tile); every launch leaves them at zero, so launches on one stream
      may share them. None: made for the call where needed.
    - ``int8_layout``: the int8 ``w``'s byte order (linear_layout.py): ``rows``, or ``fragments``
      (``pack_fragments`` of the rows: K and the tiles' block_k multiples of 64). The GEMMs give the
      same bits either way; the GEMV sums the same products in another order.
    """
    assert x.dim() == 2 and w.dim() == 2, f"x must be [T, K] and w [N, K], got {tuple(x.shape)}, {tuple(w.shape)}"
    T, K = x.shape
    n_w = w.shape[0]
    assert w.shape[1] == K, f"x {tuple(x.shape)} and w {tuple(w.shape)} disagree on K"
    assert x.dtype in FLOAT_DTYPES, f"unsupported activation dtype {x.dtype}"
    int8 = w.dtype == torch.int8
    if scale is None:
        assert w.dtype == x.dtype, f"x is {x.dtype} but w is {w.dtype} (int8 weights come with their scale)"
    else:
        assert w.dtype in (torch.int8, x.dtype), f"a weight with a scale must be int8 or {x.dtype}, got {w.dtype}"
        assert int8 or T > SMALL_STEP_MAX_TOKENS, (
            f"a scale with a {w.dtype} weight is for the GEMM (T > {SMALL_STEP_MAX_TOKENS}), got T = {T}")
        assert scale.shape == (n_w,) and scale.dtype == torch.float32 and scale.is_contiguous(), (
            f"scale must be ({n_w},) float32 contiguous, got {tuple(scale.shape)} {scale.dtype}")
        assert scale.device == x.device, f"x on {x.device}, scale on {scale.device}"
    assert x.device == w.device, f"x on {x.device}, w on {w.device}"
    assert x.stride(1) == 1 or K == 1, "x must have unit column stride"
    assert w.is_contiguous(), "w must be row-major contiguous [N, K]"
    out, n_out, i_off = _check_outputs(x, n_w, out_dtype, swiglu, residual, out)
    if T == 0 or n_out == 0:
        return out
    assert K > 0, "K must be positive"
    cfg = config or rule_config(x, w, scale, swiglu=swiglu, out_dtype=out.dtype)
    dot_f32 = interpreted(x.device)
    assert not (dot_f32 and int8 and cfg.int8_convert == "permute"), (
        "int8_convert='permute' is inline PTX: it runs on a GPU, not under the interpreter")
    frag = check_layout(int8_layout, int8, K, cfg.block_k)
    if T <= SMALL_STEP_MAX_TOKENS:
        assert isinstance(cfg, GemvConfig), f"T <= {SMALL_STEP_MAX_TOKENS} takes a GemvConfig, got {cfg}"
        launch_gemv(x, w, scale, out, residual, cfg, n_out, i_off, swiglu, dot_f32, use_pdl(pdl, x.device), counters,
                    frag)
    else:
        assert isinstance(cfg, GemmConfig), f"T > {SMALL_STEP_MAX_TOKENS} takes a GemmConfig, got {cfg}"
        if cfg.persistent:
            launch_gemm_persistent(x, w, scale, out, residual, cfg, n_out, i_off, swiglu, dot_f32, counters, frag)
        else:
            launch_gemm(x, w, scale, out, residual, cfg, n_out, i_off, swiglu, dot_f32, frag)
    return out


def rule_config(x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor | None = None, *, swiglu: bool = False,
                out_dtype: torch.dtype | None = None) -> GemvConfig | GemmConfig:
    """The tiles :func:`linear` runs for these arguments without ``config``: ``gemv_config`` for T <=
    16 (at least ``INTERPRETER_BLOCK_N`` rows a program under the interpreter), else ``gemm_config``
    (the persistent TMA kernel's tiles where the device has TMA and the tensors allow descriptors,
    for 16-bit activations: its tiles and stages were measured for bf16, and float32 ones do not
    fit in shared memory; with SwiGLU for int8 weights only, as measured). A per-op chain that must equal a fused
    SwiGLU call passes ``rule_config(x, w, scale, swiglu=True)`` to its plain call."""
    T, K = x.shape
    n_w = w.shape[0]
    int8 = w.dtype == torch.int8  # a scaled weight in x's dtype takes the model-dtype tiles
    if T <= SMALL_STEP_MAX_TOKENS:
        cfg = gemv_config(n_w, K, T, sms_of(x.device), int8=int8)
        if interpreted(x.device):  # its programs run one after another: fewer, wider ones
            cfg = dataclasses.replace(cfg, block_n=max(cfg.block_n, INTERPRETER_BLOCK_N))
        return cfg
    tma = x.element_size() == 2 and tma_supported(x.device) and tma_ok(x, w)
    return gemm_config(T, n_w, K, sms_of(x.device), int8=int8, swiglu=swiglu, tma=tma,
                       out_bytes=(out_dtype or x.dtype).itemsize)


def layer_counters(w: torch.Tensor, scale: torch.Tensor | None = None) -> torch.Tensor | None:
    """The split-K counters that :func:`linear` with the rule's tiles needs for the weight ``w``
    at any T <= 16 (None where it needs none), for the layer that owns the weight to hold and pass."""
    needed = counters_needed(w.shape[0], w.shape[1], sms_of(w.device), int8=w.dtype == torch.int8)
    return torch.zeros(needed, dtype=torch.int32, device=w.device) if needed else None


@functools.lru_cache(maxsize=None)
def _tma_on(device_index: int) -> bool:
    return torch.cuda.get_device_capability(device_index)[0] >= 9


def tma_supported(device: torch.device) -> bool:
    """Whether launches on ``device`` may use TMA descriptors (compiled, on Hopper or newer)."""
    device = torch.device(device)
    if interpreted(device):
        return False
    return _tma_on(device.index if device.index is not None else torch.cuda.current_device())


def _check_outputs(x: torch.Tensor, n_w: int, out_dtype: torch.dtype | None, swiglu: bool,
                   residual: torch.Tensor | None, out: torch.Tensor | None) -> tuple[torch.Tensor, int, int]:
    """The checks of ``out_dtype``, the ``swiglu`` flag on ``n_w`` weight rows, ``residual`` and
    ``out`` (allocated when None) against ``x`` ``[T, K]``. Returns ``(out, n_out, i_off)``: the
    output, its columns (``n_w / 2`` with ``swiglu``) and the first up row of a SwiGLU weight
    (else 0)."""
    T = x.shape[0]
    out_dtype = out_dtype or x.dtype
    assert out_dtype in (x.dtype, torch.float32), f"out_dtype must be {x.dtype} or float32, got {out_dtype}"
    assert isinstance(swiglu, bool), f"swiglu is a flag, got {swiglu!r}"
    assert not swiglu or n_w % 2 == 0, f"swiglu needs an even number of weight rows, got {n_w}"
    n_out = n_w // 2 if swiglu else n_w
    if residual is not None:
        assert residual.shape == (T, n_out) and residual.dtype == out_dtype == x.dtype, (
            f"residual must be [{T}, {n_out}] {x.dtype}, got {tuple(residual.shape)} {residual.dtype}")
        assert residual.stride(1) == 1 or n_out == 1, "residual must have unit column stride"
    if out is None:
        out = torch.empty((T, n_out), dtype=out_dtype, device=x.device)
    assert out.shape == (T, n_out) and out.dtype == out_dtype and out.device == x.device, (
        f"out must be [{T}, {n_out}] {out_dtype} on {x.device}, got {tuple(out.shape)} {out.dtype}")
    assert out.stride(1) == 1 or n_out == 1, "out must have unit column stride"
    return out, n_out, n_out if swiglu else 0


__all__ = ["GemmConfig", "GemvConfig", "gemm_config", "gemv_config", "layer_counters", "linear", "rule_config",
           "tma_supported"]
