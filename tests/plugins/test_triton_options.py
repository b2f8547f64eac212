"""The Triton implementations and their options (``options.triton``): every ablation knob gives the
reference backend's greedy tokens on a tiny model (on the CPU under the Triton interpreter, on the
GPU compiled; float32 on both so that tokens must match), the fused kernels give the bits of the
per-op chains they replace, and a Triton name says why it cannot run where it cannot."""

from __future__ import annotations

import pytest
import torch

import tileinfer
from conftest import DEVICE
from tileinfer.errors import ConfigError
from tileinfer.interfaces import AttentionSpec, KVGeometry, RMSNorm, Step
from tileinfer.model import rope_table
from tileinfer.plugins.paged_kv import PagedKVStore
from tileinfer.plugins.triton.attention import TritonAttention
from tileinfer.plugins.triton.linear import TritonLinear

TRITON = {"linear": "triton", "attention": "triton"}  # named: auto takes the reference on a CPU
# Each ablation knob off (or on) alone, and the per-op rows of the ablation. pdl=false only where PDL
# runs (a GPU): elsewhere every module launches without it either way (the defaults' run,
# test_pdl_is_decided_once_from_the_option_and_the_device).
OPTIONS = {
    "defaults": {},
    "no-fused-linears": {"fuse_epilogue": False},
    "no-fused-attention-inputs": {"fuse_inputs": False},
    "per-op": {"fuse_epilogue": False, "fuse_inputs": False},
    "per-op-dense-attention": {"fuse_epilogue": False, "fuse_inputs": False, "attend": "dense"},
    "torch-matmul": {"fuse_epilogue": False, "matmul": "torch"},
    **({"no-pdl": {"pdl": False}} if DEVICE == "cuda" else {}),
}
# Under the interpreter every launch runs each program in Python, so the cost of a step grows with
# the weight rows (GEMV programs of 4 rows) and of a prefill with its tokens: a small model (GQA 2 / 1
# heads of 16, the smallest head size the paged kernels take), 18 prompt tokens (more than 16: the
# GEMM and prefill-attention paths; across a page) and 4 new tokens (3 decode steps).
MODEL = dict(hidden=32, heads=2, kv_heads=1, head_dim=16, intermediate=48, vocab=96, layers=2, tokenizer=False)
# Repetitive, so that n-gram drafts are proposed and verify steps of several tokens run.
PROMPT = ([(7 * i) % 23 + 40 for i in range(12)] * 2)[:18]
NEW = 4


@pytest.fixture(scope="module")
def folder(checkpoint_factory):
    return checkpoint_factory(**MODEL)


def engine(folder, *sources, **keys) -> tileinfer.Engine:
    return tileinfer.Engine.from_config("eager", *sources, model=str(folder), device=DEVICE, dtype="float32",
                                        kv_page_size=16, progress=False, **keys)


def run(folder, *sources, **keys):
    return engine(folder, *sources, **keys).generate(PROMPT, max_new_tokens=NEW)


@pytest.fixture(scope="module")
def expected(folder):
    tokens = run(folder, "reference").token_ids
    assert len(set(tokens)) >= NEW - 1, f"degenerate reference output {tokens}"
    return tokens


@pytest.mark.parametrize("options", OPTIONS)
def test_each_option_gives_the_reference_greedy_tokens(folder, expected, options):
    assert run(folder, TRITON, {"options": {"triton": OPTIONS[options]}}).token_ids == expected


def test_verify_steps_with_the_defaults(folder, expected):
    result = run(folder, TRITON, proposer="ngram", spec_k=3)
    assert result.token_ids == expected
    assert result.stats.drafted_tokens > 0  # verify steps of several tokens ran


def test_the_triton_attention_reads_int8_pages_as_the_reference_does(folder):
    assert run(folder, TRITON, kv_store="paged_int8").token_ids == run(folder, "reference", kv_store="paged_int8").token_ids


def test_torch_matmul_needs_the_epilogues_unfused(folder):
    with pytest.raises(ConfigError, match="matmul=torch runs the SwiGLU and residual add.*fuse_epilogue=false"):
        run(folder, TRITON, {"options": {"triton": {"matmul": "torch"}}})


def test_on_a_cpu_without_the_interpreter_triton_says_why_and_auto_takes_the_reference(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ConfigError, match="linear=triton cannot run here: the Triton kernels need a CUDA GPU, and "
                                          "device is cpu .*linear=reference"):
        tileinfer.resolve_config(tileinfer.load_config(overrides=["device=cpu", "linear=triton"]))
    resolved = tileinfer.resolve_config(tileinfer.load_config(overrides=["device=cpu"]))
    assert (resolved.linear, resolved.attention) == ("reference", "reference")


@pytest.mark.parametrize("pdl", [True, False])
def test_pdl_is_decided_once_from_the_option_and_the_device(folder, pdl):
    """Every Triton Linear and Attention launches with programmatic dependent launch where the
    option asks for it and the weights' device supports it (an H100/H200, compiled)."""
    from tileinfer.backends.triton.pdl import pdl_supported

    model = engine(folder, TRITON, {"options": {"triton": {"pdl": pdl}}}).model
    expected = pdl and pdl_supported(model.device)
    assert DEVICE == "cuda" or not expected
    modules = [model.lm_head] + [m for layer in model.layers
                                 for m in (layer.qkv, layer.attention, layer.o_proj, layer.gate_up, layer.down)]
    assert [m.pdl for m in modules] == [expected] * len(modules)


# -- the fused kernels against the per-op chains, bit for bit ------------------------------------

DTYPE = torch.bfloat16 if DEVICE == "cuda" else torch.float32  # the interpreter's bf16 dots are wrong


def linear_outputs(options: dict, tokens: int, epilogue: str, residual: bool, quantize: str) -> torch.Tensor:
    g = torch.Generator(device="cpu").manual_seed(tokens * 7 + residual)
    weight = torch.randn(128 if epilogue == "swiglu" else 48, 64, generator=g).to(DEVICE, DTYPE)
    norm = RMSNorm(torch.rand(64, generator=g).add(0.5).to(DEVICE, DTYPE), 1e-6)
    x = torch.randn(tokens, 64, generator=g).to(DEVICE, DTYPE)
    r = torch.randn(tokens, 48, generator=g).to(DEVICE, DTYPE) if residual else None
    layer = TritonLinear(weight, epilogue=epilogue, norm=norm, quantize=quantize, options={"pdl": False, **options})
    return layer(x, r)


@pytest.mark.parametrize("quantize", ["none", "int8"])
@pytest.mark.parametrize("tokens", [1, 5, 20])
@pytest.mark.parametrize("epilogue, residual", [("none", True), ("swiglu", False)])
def test_fused_linear_is_bit_identical_to_the_per_op_chain(tokens, epilogue, residual, quantize):
    """Both weight formats: the fused epilogues give the per-op chain's bits (I = 64, a multiple of
    every BLOCK_N the rule picks here: tests/backends/kernel_checks.py's policy)."""
    per_op = linear_outputs({"fuse_epilogue": False}, tokens, epilogue, residual, quantize)
    assert torch.equal(linear_outputs({}, tokens, epilogue, residual, quantize), per_op)


@pytest.mark.parametrize("tokens", [1, 3, 20])
def test_fused_attention_inputs_are_bit_identical_to_the_per_op_chain(tokens):
    spec = AttentionSpec(num_heads=4, num_kv_heads=2, head_dim=32, rms_norm_eps=1e-6)
    g = torch.Generator(device="cpu").manual_seed(tokens)
    q_w, k_w = (torch.rand(32, generator=g).add(0.5).to(DEVICE, DTYPE) for _ in range(2))
    rope = rope_table(32, 1e6, 64, torch.device(DEVICE))
    qkv = torch.randn(tokens, spec.qkv_size, generator=g).to(DEVICE, DTYPE)
    start = 40 - tokens
    outputs = []
    for fuse in (True, False):
        kv = PagedKVStore(KVGeometry(1, 2, 32, 16, 4, DTYPE), DEVICE)
        kv.k.fill_(float("nan"))
        kv.v.fill_(float("nan"))
        kv.reserve(start + tokens)
        attention = TritonAttention(spec, layer=0, q_norm_weight=q_w, k_norm_weight=k_w, rope=rope,
                                    options={"fuse_inputs": fuse, "pdl": False})
        step = Step.at(start, tokens, torch.device(DEVICE))
        q = attention.inputs(qkv, step, kv)
        outputs.append((q, kv.gather(0, start + tokens)))
    (q_fused, (k_fused, v_fused)), (q_chain, (k_chain, v_chain)) = outputs
    assert torch.equal(q_fused, q_chain)
    new = slice(start, start + tokens)  # the positions this step wrote
    assert torch.equal(k_fused[new], k_chain[new]) and torch.equal(v_fused[new], v_chain[new])
    assert not k_fused[new].isnan().any()


# The prefill attention's tile shapes (prefill_tiles of backends/triton/paged_attention.py): the same
# greedy tokens; an 18-token prompt is one prefill step of 128-row blocks.
PREFILL_SHAPES = ("128x64", "128x128")


@pytest.mark.parametrize("shape", PREFILL_SHAPES)
def test_each_prefill_shape_gives_the_reference_greedy_tokens(folder, shape, monkeypatch):
    from tileinfer.backends.triton.paged_attention import prefill_tiles
    from tileinfer.plugins.triton import attention

    launched = []

    def recorded(*args, tiles=None, **kwargs):
        launched.append(tiles)
        return paged_prefill_attention(*args, tiles=tiles, **kwargs)

    def tokens(*sources):
        return tileinfer.Engine.from_config("eager", *sources, model=str(folder), device=DEVICE, dtype="float32",
                                            progress=False).generate(PROMPT, max_new_tokens=NEW)

    paged_prefill_attention = attention.paged_prefill_attention
    monkeypatch.setattr(attention, "paged_prefill_attention", recorded)
    assert (tokens(TRITON, {"options": {"triton": {"prefill_tiles": shape}}}).token_ids
            == tokens("reference").token_ids)
    expected = prefill_tiles(len(PROMPT) * MODEL["heads"] // MODEL["kv_heads"], MODEL["head_dim"], shape=shape)
    assert launched and all(t == expected for t in launched), (launched, expected)
