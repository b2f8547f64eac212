"""``options.triton.int8_layout``: the Triton linear's int8 weights as rows or reordered once at load
into the ``fragments`` layout (backends/triton/linear_layout.py). One copy: the layer keeps the
packed bytes and no rows, and every call reads them (fused, per-op, ``matmul=torch``); the GEMM
gives the rows' bits, the GEMV the same products in another order (its bound:
tests/backends/triton/test_linear_layout.py); a reader of int8 rows (the persistent step) finds
no ``weight`` and runs the per-op step, with the reason; the option refuses weights it cannot order."""

from __future__ import annotations

import logging

import pytest
import torch

import tileinfer
from conftest import DEVICE
from tileinfer.backends.reference.linear import pack_fragments
from tileinfer.errors import ConfigError
from tileinfer.interfaces import RMSNorm, Step
from tileinfer.memory import tensor_bytes
from tileinfer.model import stack_forward
from tileinfer.plugins.triton.linear import TritonLinear
from tileinfer.quantize import int8_of

DTYPE = torch.bfloat16 if DEVICE == "cuda" else torch.float32  # the interpreter's bf16 dots are wrong
CKPT = dict(hidden=64, layers=2, vocab=320, intermediate=128, std=0.2, seed=8, tokenizer=False)


def layer_and_inputs(options: dict, tokens: int, epilogue: str, K: int = 128):
    g = torch.Generator(device="cpu").manual_seed(tokens)
    weight = torch.randn(128 if epilogue == "swiglu" else 48, K, generator=g).to(DEVICE, DTYPE)
    norm = RMSNorm(torch.rand(K, generator=g).add(0.5).to(DEVICE, DTYPE), 1e-6)
    x = torch.randn(tokens, K, generator=g).to(DEVICE, DTYPE)
    r = torch.randn(tokens, 48, generator=g).to(DEVICE, DTYPE) if epilogue == "none" else None
    layer = TritonLinear(weight, epilogue=epilogue, norm=norm, quantize="int8", options={"pdl": False, **options})
    return layer, weight, x, r


def outputs(options: dict, tokens: int, epilogue: str) -> torch.Tensor:
    layer, _, x, r = layer_and_inputs(options, tokens, epilogue)
    return layer(x, r)


@pytest.mark.parametrize("epilogue", ["none", "swiglu"])
def test_one_packed_copy(epilogue):
    rows, weight, _, _ = layer_and_inputs({}, 1, epilogue)
    packed, _, _, _ = layer_and_inputs({"int8_layout": "fragments"}, 1, epilogue)
    assert not hasattr(packed, "weight") and packed.int8_layout == "fragments" and rows.int8_layout == "rows"
    assert torch.equal(packed.packed, pack_fragments(int8_of(weight)[0]))
    assert tensor_bytes(packed) == tensor_bytes(rows)


@pytest.mark.parametrize("tokens", [1, 5, 20])
@pytest.mark.parametrize("epilogue", ["none", "swiglu"])
def test_every_form_reads_the_packed_weight(tokens, epilogue):
    frag = {"int8_layout": "fragments"}
    fused = outputs(frag, tokens, epilogue)
    assert not fused.isnan().any()
    assert torch.equal(outputs({**frag, "fuse_epilogue": False}, tokens, epilogue), fused)
    torch_matmul = outputs({**frag, "fuse_epilogue": False, "matmul": "torch"}, tokens, epilogue)
    rows_torch = outputs({"fuse_epilogue": False, "matmul": "torch"}, tokens, epilogue)
    assert torch.equal(torch_matmul, rows_torch)  # the twin unpacks: the rows' values
    torch.testing.assert_close(fused, rows_torch, rtol=2e-5, atol=2e-5)
    if tokens > 16:
        assert torch.equal(fused, outputs({}, tokens, epilogue))  # the GEMM: the rows' bits


def test_a_layer_whose_columns_do_not_fill_the_groups_is_refused():
    with pytest.raises(ValueError, match="in_features a multiple of 64, and this layer has 96"):
        layer_and_inputs({"int8_layout": "fragments"}, 1, "none", K=96)


def test_an_unquantized_model_is_refused(checkpoint_factory):
    with pytest.raises(ConfigError, match="int8_layout=fragments is a layout of int8 weights, and quantize is none"):
        tileinfer.Engine.from_config("eager", {"linear": "triton", "options": {"triton": {"int8_layout": "fragments"}}},
                                     model=str(checkpoint_factory(**CKPT)), device="cpu", dtype="float32",
                                     progress=False)


@pytest.mark.skipif(DEVICE == "cuda", reason="the interpreter's engine (CPU tensors)")
def test_the_persistent_step_names_why_it_runs_the_per_op_step(checkpoint_factory, caplog):
    from tileinfer.plugins.persistent_forward import PersistentForward

    def engine(**options):
        return tileinfer.Engine.from_config(
            "reference", {"linear": "triton", "quantize": "int8", "options": {"triton": options}},
            model=str(checkpoint_factory(**CKPT)), device="cpu", dtype="float32", kv_page_size=16, kv_capacity=64,
            progress=False)

    e = engine(int8_layout="fragments")
    with caplog.at_level(logging.WARNING, logger="tileinfer"):
        fwd = PersistentForward(e.model, options={"block_n": "64,64,64,64,64", "block_k": 64})
    assert fwd.reason == "options.triton.int8_layout=fragments: the persistent step reads int8 weights in rows"
    assert "those steps run the per-op step" in caplog.text
    prompt = torch.tensor([17, 4, 99, 250, 3])
    rows = engine()
    step = Step.at(0, len(prompt), e.model.device)
    out = {}
    for name, a, forward in (("ours", e, fwd), ("per_op", e, None), ("rows", rows, None)):
        a.kv.reset()
        a.kv.reserve(len(prompt))
        out[name] = (forward(prompt, step, a.kv) if forward else stack_forward(a.model, prompt, step, a.kv))[0]
    assert torch.equal(out["ours"], out["per_op"]) and not out["ours"].isnan().any()
    torch.testing.assert_close(out["ours"], out["rows"], rtol=2e-5, atol=2e-5)
