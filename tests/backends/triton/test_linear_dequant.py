"""The dequantized INT8 prefill path (``options.triton.int8_prefill_dequant``): ``dequantize_int8``
(backends/triton/int8_dequant.py) writes an int8 weight's values into a model-dtype buffer, then
``linear(x, values, scale)`` runs the model-dtype GEMM with the float32 row scales on the accumulator
(``SCALED`` in linear_gemm.py and linear_gemm_persistent.py).

- Same tiles, same bits: with one config on both sides the W8A16 GEMM (int8 tile converted in
  registers) and the dequantized one (the same values, loaded) multiply the same operand values in
  the same order and scale alike, so every epilogue (plain, SwiGLU, residual, float32 logits) gives
  ``torch.equal``, on the tiled and the persistent kernel (pointers, TMA, a split tail).
- Each on its own rule's tiles (the path as the plugin runs it: the model-dtype rule's tiles on the
  values): the same exact products summed in float32 in other chunks of K, scaled by the same float32,
  rounded once: the ``one_rounding`` tolerance against the W8A16 path and the twin (``two_roundings``
  where the twin rounds once more: SwiGLU, residual; kernel_checks.py).
- A scale with a model-dtype weight is the GEMMs' (T > 16): the GEMV refuses it in one line.

Odd shapes (N, K not multiples of any tile), int8 over the whole range, outputs poisoned with NaN.
"""

from __future__ import annotations

import pytest
import torch

from tileinfer.backends.reference.linear import linear as ref_linear
from tileinfer.backends.triton.int8_dequant import dequantize_int8
from tileinfer.backends.triton.linear import GemmConfig, linear, rule_config

from ..kernel_checks import DEVICE, INTERPRETER_DTYPES, MIN_EXACT, QWEN3_LINEARS, assert_close, generator
from .test_linear import ODD, run, weights

T = 40  # two row blocks of 32, the second partial
CONFIGS = {
    "tiled": GemmConfig(32, 64, 32, 2, 4, 2),
    "tiled-swap_ab": GemmConfig(32, 64, 32, 2, 4, 2, swap_ab=True),  # the int8 rule's operand order
    "persistent": GemmConfig(32, 32, 32, 2, 4, 2, persistent=True, programs=3),
    "persistent-tma": GemmConfig(32, 32, 32, 2, 4, 2, persistent=True, tma=True, swap_ab=True),
    "persistent-split": GemmConfig(32, 32, 32, 2, 4, 2, persistent=True, programs=5, split_rows=1, split_k=3),
}


def values(q: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return dequantize_int8(q, dtype, out=torch.full(q.shape, float("nan"), dtype=dtype, device=q.device))


def forms(x: torch.Tensor, n: int, dtype: torch.dtype, key) -> list[dict]:
    """The epilogues as keyword sets: plain, SwiGLU (I = N / 2 starts mid-tile), residual, float32 logits."""
    r = (torch.randn(x.shape[0], n, generator=generator("dequant-r", *key), device=DEVICE) * 4).to(dtype)
    return [dict(), dict(swiglu=True), dict(residual=r), dict(out_dtype=torch.float32)]


@pytest.mark.parametrize("dtype", INTERPRETER_DTYPES, ids=str)
@pytest.mark.parametrize("name", list(CONFIGS))
def test_same_tiles_give_the_w8a16_bits(name, dtype):
    x, q, scale = weights("int8", T, *ODD, dtype, "dequant-same", name)
    w = values(q, dtype)
    cfg = CONFIGS[name]
    for kw in forms(x, ODD[0], dtype, (name, dtype)):
        w8a16 = run(x, q, scale, config=cfg, **kw)
        dequantized = run(x, w, scale, config=cfg, **kw)
        assert not dequantized.isnan().any()
        assert torch.equal(dequantized, w8a16), (kw.keys(), (dequantized.float() - w8a16.float()).abs().max())


@pytest.mark.parametrize("dtype", INTERPRETER_DTYPES, ids=str)
@pytest.mark.parametrize("tokens", [17, 70])
def test_own_rules_against_the_w8a16_path_and_the_twin(tokens, dtype):
    x, q, scale = weights("int8", tokens, *ODD, dtype, "dequant-rule")
    w = values(q, dtype)
    assert rule_config(x, w, scale) == rule_config(x, w)  # the model-dtype rule's tiles
    assert rule_config(x, w, scale) != rule_config(x, q, scale)  # not the int8 rule's (else this test is the above)
    for kw in forms(x, ODD[0], dtype, (tokens, dtype)):
        dequantized = run(x, w, scale, **kw)
        roundings = "two_roundings" if kw.get("swiglu") or "residual" in kw else "one_rounding"
        assert_close(dequantized, run(x, q, scale, **kw), roundings, dtype=dtype)
        assert_close(dequantized, ref_linear(x, q, scale, **kw), roundings, dtype=dtype)


def test_a_scaled_model_dtype_weight_is_the_gemms():
    x, q, scale = weights("int8", 16, *ODD, torch.float16, "dequant-gemv")
    with pytest.raises(AssertionError, match=r"a scale with a torch.float16 weight is for the GEMM \(T > 16\)"):
        linear(x, values(q, torch.float16), scale)
    with pytest.raises(AssertionError, match="a weight with a scale must be int8 or torch.float16"):
        linear(x, values(q, torch.float32), scale)


@pytest.mark.gpu
@pytest.mark.parametrize("tokens", [256, 1024])
@pytest.mark.parametrize("name", ["4B.qkv", "4B.o_proj", "4B.gate_up", "4B.down"])
def test_gpu_qwen3_4b_layers_against_the_w8a16_path(name, tokens):
    """bfloat16 at the Qwen3-4B layer shapes, each path on its own rule's tiles, with the epilogue the
    decoder gives the layer: the same exact products summed in other orders (K up to 9,728), then
    one rounding: the tolerance of one rounding, nearly every element bit-identical; on one config
    (the int8 rule's), bit for bit."""
    x, q, scale = weights("int8", tokens, *QWEN3_LINEARS[name], torch.bfloat16, "gpu-dequant", name)
    w = values(q, torch.bfloat16)
    n = q.shape[0]
    kw = dict(swiglu=True) if name.endswith("gate_up") else dict(
        residual=(torch.randn(tokens, n, generator=generator("gpu-dequant-r", name), device=DEVICE) * 4).to(
            torch.bfloat16)) if name.endswith(("o_proj", "down")) else {}
    w8a16 = run(x, q, scale, **kw)
    dequantized = run(x, w, scale, config=rule_config(x, w, swiglu="swiglu" in kw), **kw)
    assert_close(dequantized, w8a16, "two_roundings" if kw else "one_rounding", min_exact=MIN_EXACT)
    cfg = rule_config(x, q, scale, swiglu="swiglu" in kw)
    assert torch.equal(run(x, w, scale, config=cfg, **kw), run(x, q, scale, config=cfg, **kw))
