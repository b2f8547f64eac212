"""``options.triton.stream_k``: a Triton linear asks the GEMM rule for the stream-K form of its tiles
(T > 16) and holds a counter per SM beside its GEMV counters, passed to every launch; fused and
per-op calls run the same tiles, hence the same bits; with ``matmul=torch`` it is refused in one
line. The rule's own choice needs Hopper's TMA (test_linear_gemm_streamk.py): here a stand-in rule
returns a small stream-K tile, so that the interpreter runs the layer's stream-K launches."""

from __future__ import annotations

import pytest
import torch

import tileinfer
from conftest import DEVICE
from tileinfer.backends.triton.add import add
from tileinfer.backends.triton.interpreter import sms_of
from tileinfer.backends.triton.linear import GemmConfig, linear
from tileinfer.errors import ConfigError
from tileinfer.plugins.triton import linear as plugin
from tileinfer.plugins.triton.linear import TritonLinear

DTYPE = torch.bfloat16 if DEVICE == "cuda" else torch.float32  # the interpreter's bf16 dots are wrong
TILE = GemmConfig(32, 32, 32, 2, 4, 2, persistent=True, stream_k=True, programs=7)
MODEL = dict(hidden=64, heads=2, kv_heads=1, head_dim=32, intermediate=96, vocab=96, layers=2, tokenizer=False)


@pytest.fixture
def asked(monkeypatch) -> list[bool]:
    """The rule as the layer reaches it, answering ``TILE`` where asked for stream-K without SwiGLU;
    records each call's ``stream_k``."""
    calls, rule = [], plugin.rule_config

    def rule_config(x, w, scale=None, *, swiglu=False, out_dtype=None, stream_k=False):
        calls.append(stream_k)
        return TILE if stream_k and not swiglu else rule(x, w, scale, swiglu=swiglu, out_dtype=out_dtype)

    monkeypatch.setattr(plugin, "rule_config", rule_config)
    return calls


def inputs(tokens: int, rows: int = 72):
    g = torch.Generator(device="cpu").manual_seed(300 + tokens)
    weight = (torch.randn(rows, 136, generator=g) / 136**0.5).to(DEVICE, DTYPE)
    x = torch.randn(tokens, 136, generator=g).to(DEVICE, DTYPE)
    r = torch.randn(tokens, rows, generator=g).to(DEVICE, DTYPE)
    return weight, x, r


def test_prefill_calls_take_the_stream_k_tiles_on_the_layer_s_counters(asked):
    weight, x, r = inputs(40)
    layer = TritonLinear(weight, options={"pdl": False, "stream_k": True})
    assert layer.counters.numel() == sms_of(weight.device) and not layer.counters.any()
    y = layer(x, r)
    assert asked == [True] and not layer.counters.any()
    assert torch.equal(y, linear(x, weight, residual=r, config=TILE))
    per_op = TritonLinear(weight, options={"pdl": False, "stream_k": True, "fuse_epilogue": False})
    assert torch.equal(per_op(x, r), add(linear(x, weight, config=TILE), r))
    off = TritonLinear(weight, options={"pdl": False})
    assert off.counters is None
    tol = 2e-5 if DTYPE == torch.float32 else 3.2e-2
    torch.testing.assert_close(off(x, r), y, rtol=tol, atol=tol)  # the rule's own tiles: another K grouping


def test_decode_steps_and_the_fused_swiglu_keep_their_tiles(asked):
    weight, x, _ = inputs(8)
    on, off = (TritonLinear(weight, options={"pdl": False, "stream_k": s}) for s in (True, False))
    assert torch.equal(on(x), off(x)) and asked == []  # T <= 16: the GEMV, the rule's own choice
    weight, x, _ = inputs(40, rows=96)
    on, off = (TritonLinear(weight, epilogue="swiglu", options={"pdl": False, "stream_k": s}) for s in (True, False))
    assert torch.equal(on(x), off(x)) and asked == [True]


def test_torch_matmul_refuses_it(checkpoint_factory):
    options = {"stream_k": True, "matmul": "torch", "fuse_epilogue": False}
    with pytest.raises(ConfigError, match="options.triton.stream_k is a schedule of the Triton GEMM, and matmul is "
                                          "torch") as error:
        tileinfer.Engine.from_config("eager", {"linear": "triton", "options": {"triton": options}},
                                     model=str(checkpoint_factory(**MODEL)), device=DEVICE, dtype="float32",
                                     progress=False)
    assert "\n" not in str(error.value)
