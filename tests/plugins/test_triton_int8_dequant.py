"""``options.triton.int8_prefill_dequant``: from the threshold's tokens on, an int8 Triton linear
writes its weight's values into the shared model-dtype scratch and runs the model-dtype GEMM with its
scales; below it nothing changes. A call of the option gives the bits of that chain run by hand
(``dequantize_int8``, then ``linear(x, values, scale)`` on the model-dtype rule's tiles), fused or
per-op, from rows or fragments; a bad threshold is a one-line ConfigError; float32 models, model-dtype weights and ``matmul=torch`` keep
their path, and the scratch is counted by the memory estimates (``workspace_bytes``)."""

from __future__ import annotations

import pytest
import torch

import tileinfer
from conftest import DEVICE
from tileinfer.backends.triton.int8_dequant import dequantize_int8
from tileinfer.backends.triton.linear import linear
from tileinfer.backends.triton.rms_norm import rms_norm
from tileinfer.errors import ConfigError
from tileinfer.interfaces import RMSNorm
from tileinfer.memory import tensor_bytes
from tileinfer.plugins.triton.linear import TritonLinear
from tileinfer.quantize import int8_of

# a 16-bit model (the path's condition); float16 under the interpreter, whose bfloat16 dots are wrong
DTYPE = torch.bfloat16 if DEVICE == "cuda" else torch.float16
MODEL = dict(hidden=64, heads=2, kv_heads=1, head_dim=32, intermediate=96, vocab=96, layers=2, tokenizer=False)
PROMPT = [(7 * i) % 23 + 40 for i in range(20)]  # 20 tokens: one prefill chunk past the threshold of 17


def layer_and_inputs(options: dict, tokens: int, epilogue: str):
    g = torch.Generator(device="cpu").manual_seed(100 + tokens)
    weight = torch.randn(128 if epilogue == "swiglu" else 48, 128, generator=g).to(DEVICE, DTYPE)
    norm = RMSNorm(torch.rand(128, generator=g).add(0.5).to(DEVICE, DTYPE), 1e-6)
    x = torch.randn(tokens, 128, generator=g).to(DEVICE, DTYPE)
    r = torch.randn(tokens, 48, generator=g).to(DEVICE, DTYPE) if epilogue == "none" else None
    layer = TritonLinear(weight, epilogue=epilogue, norm=norm, quantize="int8", options={"pdl": False, **options})
    return layer, weight, norm, x, r


def by_hand(weight, norm, x, r, swiglu: bool) -> torch.Tensor:
    q, scale = int8_of(weight)
    return linear(rms_norm(x, norm.weight, norm.eps), dequantize_int8(q, DTYPE), scale, swiglu=swiglu, residual=r)


@pytest.mark.parametrize("epilogue", ["none", "swiglu"])
def test_from_the_threshold_on_the_call_is_the_dequantized_chain(epilogue):
    for tokens in (17, 40):
        layer, weight, norm, x, r = layer_and_inputs({"int8_prefill_dequant": 17}, tokens, epilogue)
        layer.scratch.buffer.fill_(float("nan"))
        y = layer(x, r)
        assert torch.equal(y, by_hand(weight, norm, x, r, epilogue == "swiglu")) and not y.isnan().any()
        q, _ = int8_of(weight)
        assert torch.equal(layer.scratch.view(*q.shape), q.to(DTYPE))  # the path ran: the values written
        w8a16 = layer_and_inputs({"int8_prefill_dequant": 0}, tokens, epilogue)[0](x, r)
        torch.testing.assert_close(y, w8a16, rtol=2e-2, atol=2e-2)  # the same products, summed in another order


@pytest.mark.parametrize("epilogue", ["none", "swiglu"])
def test_below_the_threshold_nothing_changes(epilogue):
    for tokens in (1, 16, 39):
        layer, _, _, x, r = layer_and_inputs({"int8_prefill_dequant": 40}, tokens, epilogue)
        layer.scratch.buffer.fill_(float("nan"))
        assert torch.equal(layer(x, r), layer_and_inputs({"int8_prefill_dequant": 0}, tokens, epilogue)[0](x, r))
        assert layer.scratch.buffer.isnan().all()  # untouched


@pytest.mark.parametrize("epilogue", ["none", "swiglu"])
def test_per_op_and_fragments_give_the_same_bits(epilogue):
    on = {"int8_prefill_dequant": 17}
    layer, _, _, x, r = layer_and_inputs(on, 30, epilogue)
    fused = layer(x, r)
    for options in ({"fuse_epilogue": False}, {"int8_layout": "fragments"},
                    {"int8_layout": "fragments", "fuse_epilogue": False}):
        assert torch.equal(layer_and_inputs({**on, **options}, 30, epilogue)[0](x, r), fused), options


def test_one_scratch_for_every_layer_sized_for_the_largest():
    on = {"pdl": False, "int8_prefill_dequant": 17}
    small = TritonLinear(torch.randn(48, 64, device=DEVICE, dtype=DTYPE), quantize="int8", options=on)
    big = TritonLinear(torch.randn(96, 128, device=DEVICE, dtype=DTYPE), quantize="int8", options=on)
    head = TritonLinear(torch.randn(200, 64, device=DEVICE, dtype=torch.float16), quantize="int8",
                        out_dtype=torch.float32, options=on)
    assert small.scratch is big.scratch and small.scratch.nbytes == 96 * 128 * DTYPE.itemsize
    assert head.scratch is None and head.dequant_from == 0  # float32 logits of a 16-bit model: the W8A16 GEMM
    plain = TritonLinear(torch.randn(48, 64, device=DEVICE, dtype=DTYPE), options=on)
    assert plain.scratch is None  # a model-dtype weight has nothing to dequantize
    buffer = big.scratch.buffer
    small(torch.randn(20, 64, device=DEVICE, dtype=DTYPE))
    TritonLinear(torch.randn(160, 128, device=DEVICE, dtype=DTYPE), quantize="int8", options=on)
    assert big.scratch.buffer.numel() == 160 * 128 and big.scratch.kept == [buffer]  # used: kept for its graphs
    assert tensor_bytes(big) == tensor_bytes(TritonLinear(torch.randn(96, 128, device=DEVICE, dtype=DTYPE),
                                                          quantize="int8", options={"pdl": False}))  # not a weight


def engine(folder, **triton):
    return tileinfer.Engine.from_config("eager", {"linear": "triton", "attention": "triton", "quantize": "int8",
                                                  "options": {"triton": triton}},
                                        model=str(folder), device=DEVICE, dtype=str(DTYPE).removeprefix("torch."),
                                        kv_page_size=16,
                                        progress=False)


def test_through_the_config_the_greedy_tokens_stay(checkpoint_factory):
    folder = checkpoint_factory(**MODEL)
    expected = engine(folder, int8_prefill_dequant=0).generate(PROMPT, max_new_tokens=3).token_ids
    on = engine(folder, int8_prefill_dequant=17)
    assert on.generate(PROMPT, max_new_tokens=3).token_ids == expected
    assert on.model.layers[0].qkv.scratch.used  # the prompt's chunk took the dequantized path


@pytest.mark.parametrize("value, message", [
    (8, r"int8_prefill_dequant=8: steps of up to 16 tokens take the GEMV; set 0 \(off\) or more than 16"),
    (-1, "int8_prefill_dequant=-1 is not valid: must be >= 0"),
    ("512", "int8_prefill_dequant=512 is not valid: expected an integer"),
])
def test_a_bad_threshold_is_one_line(checkpoint_factory, value, message):
    with pytest.raises(ConfigError, match=message) as error:
        engine(checkpoint_factory(**MODEL), int8_prefill_dequant=value)
    assert "\n" not in str(error.value)


def test_where_it_applies_and_what_it_costs():
    """On by default for int8 weights of a 16-bit model in the Triton GEMM (from 1,024 tokens); a
    float32 model, model-dtype weights, matmul=torch or 0 leave it off. ``workspace_bytes`` is the
    scratch: the largest Linear but the lm_head, in the model dtype (Qwen3-4B: the fused gate_up)."""
    from tileinfer.interfaces import RunSpec
    from tileinfer.options import check_options

    def options(**given):
        return check_options("triton", TritonLinear.declared_options, given)

    weight = torch.randn(96, 128, device=DEVICE, dtype=DTYPE)
    assert TritonLinear(weight, quantize="int8", options={"pdl": False}).dequant_from == 1024
    for dtype, quantize, given in ((torch.float32, "int8", {}), (DTYPE, "none", {}), (DTYPE, "int8", {"matmul": "torch",
                                   "fuse_epilogue": False}), (DTYPE, "int8", {"int8_prefill_dequant": 0})):
        layer = TritonLinear(weight.to(dtype), quantize=quantize, options={"pdl": False, **given})
        assert layer.scratch is None and layer.dequant_from == 0, (dtype, quantize, given)
        run = RunSpec(torch.device(DEVICE), dtype, quantize, options=options(**given))
        assert TritonLinear.workspace_bytes(run, {"qkv": (96, 128), "lm_head": (999, 128)}) == 0
    shapes = {"qkv": (6144, 2560), "o_proj": (2560, 4096), "gate_up": (19456, 2560), "down": (2560, 9728),
              "lm_head": (151936, 2560)}  # Qwen3-4B's: the lm_head, the largest, keeps the W8A16 GEMM
    for dtype in (torch.bfloat16, torch.float16):
        run = RunSpec(torch.device(DEVICE), dtype, "int8", options=options())
        assert TritonLinear.workspace_bytes(run, shapes) == 19456 * 2560 * 2  # 100 MB
