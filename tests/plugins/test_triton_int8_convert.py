"""``options.triton.int8_convert``: how the Triton linear turns int8 weights into floats. Every way
gives the same values, so the same bits as the rule's (``bits``) through the fused and the per-op
forms; ``permute`` is inline PTX and says why it cannot run off a GPU."""

from __future__ import annotations

import pytest
import torch

import tileinfer
from conftest import DEVICE
from tileinfer.errors import ConfigError
from tileinfer.interfaces import RMSNorm
from tileinfer.plugins.triton.linear import TritonLinear

DTYPE = torch.bfloat16 if DEVICE == "cuda" else torch.float32  # the interpreter's bf16 dots are wrong
CONVERTS = ["cast"] + (["permute"] if DEVICE == "cuda" else [])


def outputs(options: dict, tokens: int, epilogue: str) -> torch.Tensor:
    g = torch.Generator(device="cpu").manual_seed(tokens)
    weight = torch.randn(128 if epilogue == "swiglu" else 48, 64, generator=g).to(DEVICE, DTYPE)
    norm = RMSNorm(torch.rand(64, generator=g).add(0.5).to(DEVICE, DTYPE), 1e-6)
    x = torch.randn(tokens, 64, generator=g).to(DEVICE, DTYPE)
    r = torch.randn(tokens, 48, generator=g).to(DEVICE, DTYPE) if epilogue == "none" else None
    layer = TritonLinear(weight, epilogue=epilogue, norm=norm, quantize="int8", options={"pdl": False, **options})
    return layer(x, r)


@pytest.mark.parametrize("convert", CONVERTS)
@pytest.mark.parametrize("fuse", [True, False])
@pytest.mark.parametrize("tokens", [1, 5, 20])
@pytest.mark.parametrize("epilogue", ["none", "swiglu"])
def test_every_conversion_gives_the_rule_s_bits(convert, fuse, tokens, epilogue):
    plain = outputs({"fuse_epilogue": fuse}, tokens, epilogue)
    assert not plain.isnan().any()
    assert torch.equal(outputs({"fuse_epilogue": fuse, "int8_convert": convert}, tokens, epilogue), plain)


@pytest.mark.skipif(DEVICE == "cuda", reason="the refusal off a GPU")
def test_byte_permutes_say_why_they_cannot_run_here(checkpoint_factory):
    folder = checkpoint_factory(hidden=32, heads=2, kv_heads=1, head_dim=16, intermediate=48, vocab=96, layers=1,
                                tokenizer=False)
    with pytest.raises(ConfigError, match="int8_convert=permute is inline PTX: it needs a CUDA GPU, and device is cpu"):
        tileinfer.Engine.from_config("eager", {"linear": "triton", "quantize": "int8",
                                               "options": {"triton": {"int8_convert": "permute"}}},
                                     model=str(folder), device="cpu", dtype="float32", progress=False)
